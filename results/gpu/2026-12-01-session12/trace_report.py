"""Summarizes the staging trace: per phase (op, size, cuda), median and p90 of each step's
interval over the ops, per rank process."""
import collections
import glob
import os
import statistics
import sys

d = sys.argv[1]
for pf in sorted(glob.glob(os.path.join(d, "phases.*.txt"))):
    pid = pf.rsplit(".", 2)[1]
    tf = os.path.join(d, "trace.%s.txt" % pid)
    if not os.path.exists(tf):
        print("no trace for", pid)
        continue
    evs = []
    for line in open(tf):
        ns, what, key = line.split()
        evs.append((int(ns), what, key))
    evs.sort()
    print("== pid", pid)
    for line in open(pf):
        op, size, dev, t0, t1 = line.split()
        if dev != "cuda":
            continue
        t0, t1 = int(t0), int(t1)
        ph = [e for e in evs if t0 <= e[0] <= t1]
        # Per op: starts at P_issue; steps in order of first appearance.
        opsl = []
        cur = None
        for e in ph:
            if e[1] == "P_issue":
                cur = [e]
                opsl.append(cur)
            elif cur is not None:
                cur.append(e)
        iv = collections.defaultdict(list)
        for o in opsl:
            first = {}
            for ns, what, key in o:
                first.setdefault(what, ns)
            base = first["P_issue"]
            for w, ns in first.items():
                iv[w].append((ns - base) / 1e3)
        total = (t1 - t0) / max(1, len(opsl)) / 1e3
        steps = sorted(iv.items(), key=lambda kv: statistics.median(kv[1]))
        ends = iv.get("P_wait_out", [0])
        print("%s %s: %d ops, %.1f us/op, per op median %.1f p10 %.1f; us after P_issue (median/p90):" % (
            op, size, len(opsl), total, statistics.median(ends), sorted(ends)[len(ends) // 10]))
        print("   " + "  ".join("%s %.1f/%.1f" % (w, statistics.median(v), sorted(v)[int(len(v) * 0.9)]) for w, v in steps))
