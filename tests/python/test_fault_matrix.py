"""The fault matrix: each fault injected at a random moment of the soak workload (workers/soak_worker.py
in fault mode, 2 simulated nodes x 2 ranks): kill -9 of a rank, of a rank on the other node, of a
daemon, of the other node's daemon, SIGSTOP of a rank (a stall), a collective mismatch, a descriptor
the daemon must refuse (pushed by a rank into its own request ring), and node 1's
fabric falling silent (fabric.fault=silence: nothing leaves or arrives, its process lives on). Every
surviving rank must fail with an error that names what happened, within 5 s of the fault or of its
next call into smddp if it was busy with its own work then (the stall: within 5 s of the configured
timeout, after a stall warning naming the stopped rank, the first error saying it is stopped), no
result may be wrong,
the launcher must exit non-zero, and nothing of the job may be left running or in /dev/shm or the
socket folder. A killed daemon's ranks are survivors too: they must name their dead daemon, and the
other node's ranks must name it as well, although mpirun tells every daemon to stop as soon as one
died. Each fault once here, 20 times with SMDDP_LONG_TESTS=1 (scripts/test.sh --long).
With SMDDP_FAULT_MATRIX_JSON=FILE the figures (time to error, leftovers) are written to FILE."""
import collections
import glob
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid

import pytest

from conftest import WORKERS, _worker_cmd, base_env, build_dir, daemon_path, pid_alive

LONG = os.environ.get("SMDDP_LONG_TESTS") == "1"
FABRIC = os.environ.get("SMDDP_HAVE_FABRIC", "ON").upper() not in ("OFF", "0", "FALSE")
REPS = int(os.environ.get("SMDDP_FAULT_REPS", 20 if LONG else 1))
TIMEOUT_S = 8  # the process groups' timeout (and the daemons'), for the stall
FAULTS = ["kill_rank", "kill_rank_other_node", "kill_daemon", "kill_daemon_other_node", "stall", "mismatch",
          "malformed", "fabric_silence"]
FIGURES = {}
# A rank's first error: when it came, when the rank last called into smddp before it, ERROR or WRONG, the text.
Result = collections.namedtuple("Result", "at started kind msg")

pytestmark = pytest.mark.skipif(not FABRIC, reason="needs the fabric transport (simulated nodes)")


def wait_files(paths, timeout, proc):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(os.path.exists(p) for p in paths):
            return
        if proc.poll() is not None:
            raise AssertionError("the job ended before its ranks were ready:\n" + proc.communicate()[0][-4000:])
        time.sleep(0.05)
    raise AssertionError("ranks not ready after %d s" % timeout)


def read_int(path):
    with open(path) as f:
        return int(f.read())


def run_once(fault, rng):
    build = build_dir()
    tmp = tempfile.mkdtemp(prefix="smddp-fault-")
    sockets = os.path.join(tmp, "sockets")
    os.mkdir(sockets, 0o700)
    env = base_env(build)
    env["SMDDP_SOCKET_DIR"] = sockets
    job = "fm-" + uuid.uuid4().hex[:10]
    args = ["--ops", "600", "--seed", str(rng.randrange(1 << 30)), "--fault-dir", tmp, "--pg-timeout", str(TIMEOUT_S)]
    if fault in ("mismatch", "malformed"):
        args += ["--%s-rank" % fault, str(rng.randrange(4)), "--%s-at" % fault, str(50 + rng.randrange(200))]
    cmd = [os.path.join(build, "bin", "smddprun"), "--daemon", daemon_path(build), "--job-id", job,
           "--nproc-per-node", "2", "--simulate-nodes", "2", "--set", "daemon.stall_warning_s=2",
           "--set", "daemon.collective_timeout_s=%d" % TIMEOUT_S, "--set", "daemon.exit_grace_s=20"]
    if fault == "fabric_silence":  # node 1's transport goes silent once the file appears
        cmd += ["--set", "fabric.fault=silence", "--set", "fabric.fault_trigger=" + os.path.join(tmp, "silence-{node}")]
    cmd += ["--", *_worker_cmd("soak_worker.py", args)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=WORKERS, start_new_session=True)
    stopped = None
    try:
        wait_files([os.path.join(tmp, "%s.%d" % (w, r)) for w in ("pid", "daemon", "ready") for r in range(4)], 180,
                   proc)
        pids = [read_int(os.path.join(tmp, "pid.%d" % r)) for r in range(4)]
        daemons = [read_int(os.path.join(tmp, "daemon.%d" % r)) for r in range(4)]
        time.sleep(rng.uniform(0.05, 1.5))  # a random moment of the workload
        fault_at = time.time()
        if fault == "kill_rank":
            victim, needle = 1, "rank 1 (pid %d)" % pids[1]
            os.kill(pids[1], signal.SIGKILL)
        elif fault == "kill_rank_other_node":
            victim, needle = 3, "rank 3 (pid %d)" % pids[3]
            os.kill(pids[3], signal.SIGKILL)
        elif fault == "kill_daemon":
            victim, needle = None, "smddp daemon (pid %d) on node 0" % daemons[0]
            os.kill(daemons[0], signal.SIGKILL)
        elif fault == "kill_daemon_other_node":
            victim, needle = None, "smddp daemon (pid %d) on node 1" % daemons[2]
            os.kill(daemons[2], signal.SIGKILL)
        elif fault == "stall":
            victim, needle = 1, None  # "rank(s) 1 never posted it", "rank(s) 0 1 on other node(s) ..."
            os.kill(pids[1], signal.SIGSTOP)
            stopped = pids[1]
        elif fault == "fabric_silence":
            # Each side hears nothing from the other: node 0's ranks name node 1's daemon, node 1's node 0's.
            victim, needle = None, "stopped answering: no heartbeat"
            open(os.path.join(tmp, "silence-1"), "w").close()
        elif fault == "malformed":
            victim, needle = None, "was refused"
        else:
            victim, needle = None, "collective mismatch"
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if stopped and pid_alive(stopped):
            os.kill(stopped, signal.SIGKILL)
    with open(os.path.join(tmp, "output.log"), "w") as f:  # kept with the run's files when it fails
        f.write(out)
    # A killed daemon's ranks are not mpirun's: they may still be reporting when it returns, and a
    # rank busy in its own work reaches its next call within the orphan watch's grace (60 s).
    deadline = time.time() + 40
    while time.time() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    out_note = "(the whole output: %s/output.log)\n" % tmp
    assert proc.returncode != 0, "the launcher exited 0 after %s:\n%s" % (fault, out[-4000:])
    results = {}
    for r in range(4):
        path = os.path.join(tmp, "result.%d" % r)
        if os.path.exists(path):
            with open(path) as f:
                at, started, kind, msg = f.read().split(" ", 3)
            results[r] = Result(float(at), float(started), kind, msg)
    survivors = [r for r in range(4) if r != victim]
    assert sorted(results) == survivors, "%s: results from ranks %s, expected %s\n%s%s" % (
        fault, sorted(results), survivors, out_note, out[-4000:])
    wrong = {r: v for r, v in results.items() if v.kind == "WRONG"}
    assert not wrong, "%s: wrong results %s" % (fault, wrong)
    if fault in ("mismatch", "malformed"):  # no moment to measure from: the spread of the ranks' errors
        fault_at = min(v.at for v in results.values())
    limit = TIMEOUT_S + 5.0 if fault == "stall" else 5.0
    # From the fault, or from when the rank next called into smddp if it was busy with its own work.
    delays = {r: v.at - max(fault_at, v.started) for r, v in results.items()}
    late = {r: d for r, d in delays.items() if d > limit}
    assert not late, "%s: ranks that learned of it after %.0f s: %s\n%s\n%s" % (fault, limit, late, results,
                                                                             out[-4000:])
    first = min(results, key=lambda r: results[r].at) if results else None
    if fault == "stall":
        # The earliest error names the stopped rank as stopped, however many ranks and groups it
        # held up on the way (the survivors that fail later may name the first one that left), after
        # a stall warning that names it.
        assert "rank 1 (pid %d) is stopped" % pids[1] in results[first].msg, \
            "stall: the first error does not say rank 1 is stopped: %s" % results[first].msg
        assert re.search(r"stall: .*for rank\(s\) [\d, ]*\b1\b", out), "no stall warning naming rank 1\n" + out[-4000:]
    elif fault in ("mismatch", "malformed"):
        assert needle in results[first].msg, "%s: the first error is not %r: %s" % (fault, needle, results[first].msg)
    else:
        named = [r for r, v in results.items() if needle in v.msg]
        assert sorted(named) == sorted(results), "%s: errors that do not name %r: %s" % (
            fault, needle, {r: v.msg for r, v in results.items() if r not in named})
    # Nothing left: the job's processes, its segments, libfabric's regions, its sockets.
    deadline = time.time() + 15
    alive = lambda: [p for p in pids + daemons if pid_alive(p)]  # noqa: E731
    while time.time() < deadline and (alive() or glob.glob("/dev/shm/smddp.%s.*" % job)):
        time.sleep(0.1)
    left = ["pid %d alive" % p for p in alive()] + glob.glob("/dev/shm/smddp.%s.*" % job)
    left += [f for d in set(daemons) for f in glob.glob("/dev/shm/%d:*" % d)] + os.listdir(sockets)
    assert not left, "%s left %s" % (fault, left)
    os.rmdir(sockets)
    shutil.rmtree(tmp)
    return (max(delays.values()) if delays else None), len(results), len(survivors)


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_matrix(fault):
    seed = int(os.environ.get("SMDDP_FAULT_SEED", time.time_ns() % (1 << 30)))
    print("fault %s: seed %d (SMDDP_FAULT_SEED repeats the run)" % (fault, seed))
    rng = random.Random(seed)
    runs = [run_once(fault, rng) for _ in range(REPS)]
    delays = [d for d, _, _ in runs if d is not None]
    told, survivors = sum(n for _, n, _ in runs), sum(m for _, _, m in runs)
    FIGURES[fault] = {"repetitions": len(runs), "median_s": statistics.median(delays) if delays else None,
                      "max_s": max(delays) if delays else None, "named_errors": told, "survivors": survivors,
                      "leftovers": 0}
    print("fault %s: %d repetitions, named errors on %d of %d surviving ranks, time to error median %s s, max %s s, "
          "nothing left" % (fault, len(runs), told, survivors, "%.2f" % statistics.median(delays) if delays else "-",
                            "%.2f" % max(delays) if delays else "-"))
    path = os.environ.get("SMDDP_FAULT_MATRIX_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(FIGURES, f, indent=1)
