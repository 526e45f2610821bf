#!/usr/bin/env python3
"""compare_bench.py: side-by-side table of smddp-bench, mpi-bench and gloo_bench.py reports.

  compare_bench.py --md results/bench_cpu.md \\
      allreduce:smddp=raw/smddp_allreduce.txt,mpi=raw/mpi_allreduce.txt,gloo=raw/gloo_allreduce.txt ...

Each report is nccl-tests style: data rows are the lines that do not start with '#', with
size(B) in column 0, time(us) in column 5 and busbw(GB/s) in column 7. A missing or failed
report leaves its columns as "-". Ratios compare times at equal size (so they hold where
busbw rounds to 0.00): smddp/mpi > 1 means smddp is faster. Standard library only.
"""

import argparse
import sys

TOOLS = ("smddp", "mpi", "gloo")


def read_report(path):
    """{size: (time_us, busbw)} from one report; {} if it cannot be read."""
    rows = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                cols = line.split()
                if not cols or line.startswith("#") or not cols[0].isdigit() or len(cols) < 8:
                    continue
                try:
                    rows[int(cols[0])] = (float(cols[5]), float(cols[7]))
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


def ratio(t_other, t_smddp):
    if t_other is None or t_smddp is None or t_smddp <= 0:
        return "-"
    return f"{t_other / t_smddp:.2f}"


def table(op, reports):
    """Header and rows (lists of strings) for one op."""
    header = ["size", "smddp busbw", "mpi busbw", "gloo busbw", "smddp/mpi", "smddp/gloo",
              "smddp us", "mpi us", "gloo us"]
    sizes = sorted(set().union(*(r.keys() for r in reports.values())))
    rows = []
    for size in sizes:
        t = {tool: reports[tool].get(size, (None, None))[0] for tool in TOOLS}
        bw = {tool: reports[tool].get(size, (None, None))[1] for tool in TOOLS}
        cell = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
        rows.append([human(size)] + [cell(bw[x], "{:.2f}") for x in TOOLS] +
                    [ratio(t["mpi"], t["smddp"]), ratio(t["gloo"], t["smddp"])] +
                    [cell(t[x], "{:.1f}") for x in TOOLS])
    return header, rows


def render_text(op, header, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([f"== {op} (busbw GB/s; time us per call)", line(header)] + [line(r) for r in rows])


def render_md(op, header, rows):
    out = [f"### {op}", "", "| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def parse_spec(spec):
    """'allreduce:smddp=a.txt,mpi=b.txt' -> ('allreduce', {tool: path})."""
    op, _, rest = spec.partition(":")
    paths = {}
    for part in filter(None, rest.split(",")):
        tool, _, path = part.partition("=")
        if tool not in TOOLS:
            raise SystemExit(f"compare_bench.py: unknown tool '{tool}' in '{spec}'")
        paths[tool] = path
    return op, paths


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("specs", nargs="+", help="OP:smddp=FILE,mpi=FILE,gloo=FILE")
    p.add_argument("--md", help="also write the tables as markdown here")
    p.add_argument("--title", default="CPU collectives: smddp vs Open MPI vs gloo")
    p.add_argument("--note", action="append", default=[], help="a line under the markdown title")
    a = p.parse_args(argv)
    text, md = [], [f"## {a.title}", ""] + [f"{n}  " for n in a.note] + [""]
    for spec in a.specs:
        op, paths = parse_spec(spec)
        reports = {tool: read_report(paths[tool]) if tool in paths else {} for tool in TOOLS}
        header, rows = table(op, reports)
        text.append(render_text(op, header, rows))
        md += [render_md(op, header, rows), ""]
    print("\n\n".join(text))
    if a.md:
        md.append("busbw as nccl-tests (allreduce 2(n-1)/n, allgather (n-1)/n); smddp/X = X's time / "
                  "smddp's time at equal size (> 1: smddp faster).")
        with open(a.md, "w", encoding="utf-8") as f:
            f.write("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
