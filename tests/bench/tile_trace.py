"""A larger machine from an idle trace: K copies of it side by side, each shifted in time.

    python3 tests/bench/tile_trace.py ../shared/data/summit-idle-2021-02.csv.gz \
        /tmp/summit-x10.csv.gz --copies 10 --shift-s 5040

No public idle log of a ~50,000-node machine could be had (docs/benchmarks.md, "Other
machines' history": Mira's job list is one, but without its schedule, and the ImageNet mix
never competes on it), so `sim_bench --trace` replays this proxy instead: copy k's nodes are
named NODE~k and its events come k * shift seconds later. Every copy after the first starts
with all its nodes busy, so it adds idle nodes only from its own start; the copies' idle
pools rise and fall at different times, as separate partitions of one machine would.
Input and output are the trace format of libmalle/sim/idle_trace.h ("time,node,idle" rows
after "#" comments; the first timestamp lists every node's initial state).
"""

from __future__ import annotations

import argparse
import gzip
import sys


def read_rows(path: str) -> list[tuple[int, str, str]]:
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    with opener(path, "rt") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#") or line == "time,node,idle":
                continue
            parts = line.split(",")
            if len(parts) != 3 or parts[2] not in ("0", "1") or not parts[1]:
                sys.exit(f"{path}:{number}: expected 'time,node,idle' (idle 0 or 1), got {line!r}")
            try:
                t = int(parts[0])
            except ValueError:
                sys.exit(f"{path}:{number}: time {parts[0]!r} is not whole seconds")
            if rows and t < rows[-1][0]:
                sys.exit(f"{path}:{number}: time {t} is earlier than the row before it")
            rows.append((t, parts[1], parts[2]))
    if not rows:
        sys.exit(f"{path}: no rows")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out", help="output trace (.csv or .csv.gz)")
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--shift-s", type=int, default=5040, help="seconds between copies")
    args = ap.parse_args()
    if args.copies < 1 or args.shift_s < 0:
        sys.exit("--copies must be >= 1 and --shift-s >= 0")
    rows = read_rows(args.trace)
    t0 = rows[0][0]
    initial = [node for t, node, _ in rows if t == t0]
    out = []
    for c in range(args.copies):
        out.extend((t + c * args.shift_s, f"{node}~{c}", idle) for t, node, idle in rows)
        if c > 0:
            out.extend((t0, f"{node}~{c}", "0") for node in initial)
    out.sort(key=lambda r: r[0])  # stable: a copy's own order is kept
    opener = gzip.open if args.out.endswith(".gz") else open
    with opener(args.out, "wt") as f:
        f.write(f"# {args.trace} tiled {args.copies}x, copies {args.shift_s} s apart "
                f"({len(initial) * args.copies} nodes)\n")
        f.write("time,node,idle\n")
        f.writelines(f"{t},{node},{idle}\n" for t, node, idle in out)
    print(f"{args.out}: {len(initial) * args.copies} nodes, {len(out)} rows")


if __name__ == "__main__":
    main()
