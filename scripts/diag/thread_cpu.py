#!/usr/bin/env python3
"""Which threads of a process are busy while a command runs: each thread's share of one core.

    scripts/diag/thread_cpu.py [--name smddp-daemon] [--interval 0.5] -- COMMAND [ARGS...]

Runs COMMAND and samples /proc/PID/task/TID/stat of every process named NAME (exact name, as
pgrep -x) every INTERVAL seconds. At the end it prints, per process, each thread that used any
CPU: user and system seconds and its busy share of one core over the time it was seen. The
thread whose id is the process id is the main thread (the daemon's progress loop). A thread near
100% is what binds the run.
"""
import argparse
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def pids_named(name):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % d) as f:
                if f.read().strip() == name:
                    out.append(int(d))
        except OSError:
            pass
    return out


def thread_times(pid):
    """{tid: (comm, user ticks, system ticks)} of the process, {} once it is gone."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for t in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        out[int(t)] = (comm, int(fields[11]), int(fields[12]))  # utime, stime: fields 14 and 15
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="smddp-daemon")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("command", nargs=argparse.REMAINDER)
    o = p.parse_args()
    cmd = o.command[1:] if o.command[:1] == ["--"] else o.command
    if not cmd:
        p.error("no command")
    first, last = {}, {}  # (pid, tid) -> (time, comm, utime, stime)
    proc = subprocess.Popen(cmd)
    while proc.poll() is None:
        now = time.monotonic()
        for pid in pids_named(o.name):
            for tid, (comm, u, s) in thread_times(pid).items():
                first.setdefault((pid, tid), (now, comm, u, s))
                last[(pid, tid)] = (now, comm, u, s)
        time.sleep(o.interval)
    rc = proc.wait()
    print("threads of %s (share of one core while seen; main thread: tid = pid)" % o.name)
    for pid in sorted({k[0] for k in last}):
        rows = []
        for (p_, tid), (t1, comm, u1, s1) in last.items():
            if p_ != pid:
                continue
            t0, _, u0, s0 = first[(pid, tid)]
            du, ds = (u1 - u0) / TICK, (s1 - s0) / TICK
            if du + ds <= 0:
                continue
            span = max(t1 - t0, o.interval)
            rows.append((tid, comm, du, ds, (du + ds) / span, span))
        print("pid %d:" % pid)
        for tid, comm, du, ds, share, span in sorted(rows, key=lambda r: -r[4]):
            print("  tid %-8d %-16s%s user %7.2f s  sys %7.2f s  busy %5.1f%% of %.1f s" % (
                tid, comm, " main" if tid == pid else "     ", du, ds, 100 * share, span))
    return rc


if __name__ == "__main__":
    sys.exit(main())
