"""Old build against new from a log of scripts/diag/staged_latency.py runs, rounds alternating
(each run's output under a "== old round N" / "== new round N" line, or "round N" then "== old"):
per size and tensor device, the median and mean us per op of each build over the rounds, the
rounds where new was faster, and the mean of the paired differences.

    python3 scripts/diag/ab_report.py ROUNDS.log [more logs]

Example input and output: results/2026-12-01-gpu-staging-signal-streams/.
"""
import re,sys,statistics as st
def parse(path):
    d={}; cur=None; rnd=None
    for l in open(path):
        m=re.match(r'round (\d+)',l)
        if m: rnd=int(m[1]); continue
        m=re.match(r'== (\w+)(?: round (\d+))?',l)
        if m:
            cur=m[1]
            if m[2]: rnd=int(m[2])
            continue
        m=re.match(r'sync\s+(\d+) (\w+)\s+([\d.]+) us/op\s+cpu\s+([\d.]+)',l)
        if m: d.setdefault((int(m[1]),m[2]),{}).setdefault(cur,{})[rnd]=float(m[3])
    return d
for path in sys.argv[1:]:
    print(path)
    for (size,dev),v in sorted(parse(path).items()):
        rs=sorted(v['old'])
        o=[v['old'][r] for r in rs]; n=[v['new'][r] for r in rs]
        diffs=[n[i]-o[i] for i in range(len(rs))]
        print('%9d %4s old med %7.1f mean %7.1f | new med %7.1f mean %7.1f | new<old %d/%d, mean diff %+.1f (%+.0f%%)'%(size,dev,st.median(o),st.mean(o),st.median(n),st.mean(n),sum(x<0 for x in diffs),len(rs),st.mean(diffs),100*st.mean(diffs)/st.mean(o)))
