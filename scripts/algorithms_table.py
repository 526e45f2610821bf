#!/usr/bin/env python3
"""algorithms_table.py: one markdown table per operation and node count from the raw reports of
scripts/bench_algorithms.sh (RAW/OP_KNODES_ALGORITHM.txt, nccl-tests style: size(B) in column 0,
time(us) in column 5). Cells are times in microseconds; the fastest forced algorithm of each row
is in bold, and the last column says what auto's time is against it. Standard library only.

  algorithms_table.py --raw results/algorithms/raw --nodes "4 8" --ops allreduce,allgather \\
      --algorithms direct,ring,halving,auto [--note TEXT]
"""

import argparse
import pathlib


def read_report(path):
    """{size: time_us} from one report; {} if it cannot be read."""
    rows = {}
    try:
        for line in pathlib.Path(path).read_text(errors="replace").splitlines():
            cols = line.split()
            if not cols or line.startswith("#") or not cols[0].isdigit() or len(cols) < 8:
                continue
            try:
                rows[int(cols[0])] = float(cols[5])
            except ValueError:
                continue
    except OSError:
        pass
    return rows


def human(size):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--nodes", default="4 8")
    ap.add_argument("--ops", default="allreduce,allgather")
    ap.add_argument("--algorithms", default="direct,ring,halving,auto")
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args()
    algorithms = a.algorithms.split(",")
    forced = [x for x in algorithms if x != "auto"]
    print("## Algorithms across simulated nodes: time per operation (us)\n")
    for n in a.note:
        print(n + "  ")
    for op in a.ops.split(","):
        for k in a.nodes.split():
            reports = {x: read_report(pathlib.Path(a.raw) / f"{op}_{k}nodes_{x}.txt") for x in algorithms}
            sizes = sorted(set().union(*(r.keys() for r in reports.values())))
            print(f"\n### {op}, {k} nodes\n")
            head = ["size"] + algorithms + (["auto / best forced"] if "auto" in algorithms else [])
            print("| " + " | ".join(head) + " |")
            print("|" + "---:|" * len(head))
            for size in sizes:
                t = {x: reports[x].get(size) for x in algorithms}
                known = [t[x] for x in forced if t[x] is not None]
                best = min(known) if known else None
                cells = [human(size)]
                for x in algorithms:
                    if t[x] is None:
                        cells.append("-")
                    elif x in forced and t[x] == best:
                        cells.append(f"**{t[x]:.1f}**")
                    else:
                        cells.append(f"{t[x]:.1f}")
                if "auto" in algorithms:
                    cells.append("-" if t["auto"] is None or not best else f"{t['auto'] / best:.2f}")
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
