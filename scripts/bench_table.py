#!/usr/bin/env python3
"""Markdown tables from the text output of scripts/bench_torch.py (its log), for docs/performance.md.

    scripts/bench_table.py LOG [LOG...]

Every "# <op> (...)" section of a log becomes one table: size, both columns' latency, busbw,
and the ratios, as bench_torch.py printed them (smddp vs nccl, or cuda vs host with
--simulate-nodes).
"""

import re
import sys

ROW = re.compile(r"^\s+(\d+[KMG]?B)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
SECTION = re.compile(r"^# (\w+) \((\w+), (\d+) ranks\)")


def tables(lines):
    head = ("smddp", "nccl")
    op = None
    rows = []
    for line in lines:
        if "Columns: smddp with CUDA tensors" in line:
            head = ("cuda", "host")
        m = SECTION.match(line)
        if m:
            if op and rows:
                yield op, head, rows
            op, rows = "%s (%s, %s ranks)" % (m.group(1), m.group(2), m.group(3)), []
            continue
        m = ROW.match(line)
        if m and op:
            rows.append(m.groups())
        elif line.startswith("#") and op and rows:
            yield op, head, rows
            op, rows = None, []
    if op and rows:
        yield op, head, rows


def main(paths):
    for path in paths:
        with open(path) as f:
            for op, (a, b), rows in tables(f.read().splitlines()):
                print("#### %s\n" % op)
                print("| size | %s us | %s us | latency x | %s busbw GB/s | %s busbw GB/s | busbw x |" % (a, b, a, b))
                print("|---:|---:|---:|---:|---:|---:|---:|")
                for size, lat_a, bw_a, lat_b, bw_b, lat_x, bw_x in rows:
                    print("| %s | %s | %s | %s | %s | %s | %s |" % (size, lat_a, lat_b, lat_x, bw_a, bw_b, bw_x))
                print()
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
