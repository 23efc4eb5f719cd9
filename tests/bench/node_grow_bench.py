"""Grow by one node of 2 slots against a grow by two 1-slot nodes, same job state (issue 23).

A job of 2 ranks (nodes a and b) is joined by 2 ranks at one step boundary:

* ``one 2-slot node``: both joiners on node c: the state crosses into c once, to its first
  rank, which copies it to the second there (state_pack.h PlanNodeTransfer);
* ``two 1-slot nodes``: the joiners on nodes c and d: one state to each;
* ``2-slot node, unnamed``: both joiners without MALLE_NODE (what a rank that does not say its
  node gets, and what every transfer did before node names): one state to each.

Per layout, alternating, ``--reps`` times: the pause of the running ranks (their ResizeEvent's
phases: total less the boundary's wait, and the state transfer), and the bytes across node boundaries (the sum over the
ranks of state_received_remote) and inside a node (relay copies). Ranks are processes on
this machine (tests/python/node_job.py: an MLP of ``--width`` with BatchNorm, AdamW and a
tracked scheduler; one torch thread each), Gloo over loopback: a "node" is a name, so a
copy inside a node costs what a copy across nodes costs here, and the pause shows the
protocol's cost, not a network's.

    .venv/bin/python tests/bench/node_grow_bench.py [--reps 3] [--width 2048] [--json out.json]

Every process is started and stopped by tests/python/node_job.run_grow, by its pid, with a
timeout on every wait.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from node_job import run_grow  # noqa: E402

LAYOUTS = [
    ("one 2-slot node", ("c", "c")),
    ("two 1-slot nodes", ("c", "d")),
    ("2-slot node, unnamed", ("", "")),
]


def measure(results: dict) -> dict:
    """The grow's figures from every rank's history."""
    grow = {}
    for member, r in results.items():
        events = [e for e in r["history"] if e["size"] == 4 and e["kind"] in ("planned", "joined")]
        if len(events) != 1:
            raise RuntimeError(f"{member}: expected one grow to 4 ranks, history {r['history']}")
        grow[member] = events[0]
    founders = [grow[m] for m in grow if m.startswith("f")]
    return {
        # What the change costs the running ranks: agreement, group build, committed-step
        # exchange and state transfer (not `wait`, the boundary's wait for the step in
        # flight, which every boundary pays).
        "pause_s": max(e["phases"]["total"] - e["phases"]["wait"] for e in founders),
        "state_s": max(e["phases"]["state"] for e in founders),
        "joiner_state_s": max(grow[m]["phases"]["state"] for m in grow if m.startswith("j")),
        "state_bytes": max(e["state_bytes"] for e in grow.values()),
        "wire_bytes": sum(e["received_remote"] for e in grow.values()),
        "local_bytes": sum(e["sent_local"] for e in grow.values()),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.reps < 1 or args.width < 1 or args.steps < 3:
        p.error("--reps >= 1, --width >= 1, --steps >= 3")
    rows: dict[str, list[dict]] = {name: [] for name, _ in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="node_grow_") as tmp:
        for rep in range(args.reps):
            for i, (name, joiners) in enumerate(LAYOUTS):
                out = pathlib.Path(tmp) / f"r{rep}-{i}"
                results = run_grow(out, f"grow{rep}x{i}", founders=("a", "b"), joiners=joiners,
                                   args=("--width", str(args.width), "--steps", str(args.steps),
                                         "--no-digest"))
                m = measure(results)
                rows[name].append(m)
                print(f"rep {rep} {name:22s} pause {m['pause_s'] * 1e3:7.1f} ms  state "
                      f"{m['state_s'] * 1e3:7.1f} ms  wire {m['wire_bytes'] / 1e6:7.1f} MB  "
                      f"local {m['local_bytes'] / 1e6:6.1f} MB", flush=True)
    state_mb = rows[LAYOUTS[0][0]][0]["state_bytes"] / 1e6
    print(f"\nGrow 2 -> 4 ranks, job state {state_mb:.1f} MB (MLP width {args.width}, AdamW), "
          f"{args.reps} reps per layout, medians:")
    print(f"| layout | pause (ms) | state transfer, running ranks (ms) | joiners' state (ms) "
          f"| bytes across nodes (MB) | in states | copied inside a node (MB) |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in LAYOUTS:
        r = rows[name]
        med = {k: statistics.median(x[k] for x in r) for k in r[0]}
        print(f"| {name} | {med['pause_s'] * 1e3:.0f} | {med['state_s'] * 1e3:.0f} | "
              f"{med['joiner_state_s'] * 1e3:.0f} | {med['wire_bytes'] / 1e6:.1f} | "
              f"{med['wire_bytes'] / med['state_bytes']:.2f} | {med['local_bytes'] / 1e6:.1f} |")
    one = statistics.median(x["wire_bytes"] / x["state_bytes"] for x in rows[LAYOUTS[0][0]])
    two = statistics.median(x["wire_bytes"] / x["state_bytes"] for x in rows[LAYOUTS[1][0]])
    verdict = "MET" if one == 1.0 and two == 2.0 else "NOT MET"
    print(f"\nbytes across nodes: one 2-slot node {one:.2f} states, two 1-slot nodes {two:.2f}: "
          f"{verdict} (target: one state per node)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"width": args.width, "rows": rows}, indent=1))
    return 0 if verdict == "MET" else 1


if __name__ == "__main__":
    sys.exit(main())
