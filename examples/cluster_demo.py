"""The main demo: elastic jobs sharing transiently idle nodes under the shared allocator.

An embedded allocator (the same C++ service as the ``malle-allocator`` daemon) and four local
node agents that appear and vanish following ``examples/demo_idle_trace.csv``. Four jobs share
them, all trained on the 8x8 digits set that scikit-learn ships (real data, no download):

* ``digits``    the MLP classifier of examples/train_digits.py, 4 logical workers;
* ``cnn``       a small convolutional network on the same images, 4 logical workers;
* ``hpo-lr1``, ``hpo-lr3``   a hyperparameter pair (learning rate 1e-3 / 3e-3), 2 workers each.

The allocator decides on every event (a node appears, a node is reclaimed, a job arrives or
ends, a job's profiling advisor reports how it scales) which job runs on which node; jobs
grow and shrink in place at step boundaries, without restarting their other ranks.

Once the digits job has passed step ``--outage-at`` (100), the main scheduler takes *every*
node back for ``--outage`` seconds (10, scaled like the trace): each job that was training
loses all its nodes, so its last rank parks the job's state in the job's park store (a
directory under --out) and exits; when the nodes come back, each parked job starts again from
its parked state at exactly that step. A live table follows the run; at the end: each job's
result, what happened (nodes, parks, resumes), the allocation over time as a plot, and the
digits job's scalability table learned by its advisor.

Each node agent keeps a warm interpreter (a zygote that has imported torch, malletrain and
scikit-learn's data sets) while its node is idle, and forks a job's rank from it when the
allocator gives it the node, so a job holding a node trains on it within a fraction of a
second; ``--cold`` starts every rank as a new interpreter instead (for comparison).

    python examples/cluster_demo.py [--out out/demo] [--policy milp] [--time-scale 1]
                                    [--outage 10] [--outage-at 100] [--cold]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from malletrain import _C
from malletrain.cluster import (LocalCluster, format_status, held_summary, live_table,
                                load_idle_trace)

HERE = Path(__file__).resolve().parent


def jobs(python: str, scale: float) -> list:
    # --compute-sleep stands in for a model heavier than this tiny one: it is spent per
    # micro-batch, so it is divided among the ranks like real compute and the jobs scale.
    train = [python, str(HERE / "train_digits.py"), "--compute-sleep", f"{0.02 / scale:g}"]
    return [
        dict(job="digits", command=train + ["--epochs", "30", "--logical-workers", "4"],
             max_nodes=4, logical_workers=4),
        dict(job="cnn", command=train + ["--arch", "cnn", "--hidden", "64", "--epochs", "20",
                                         "--logical-workers", "4"], max_nodes=4, logical_workers=4),
        dict(job="hpo-lr1", command=train + ["--lr", "1e-3", "--epochs", "15",
                                             "--logical-workers", "2"], max_nodes=2,
             logical_workers=2),
        dict(job="hpo-lr3", command=train + ["--lr", "3e-3", "--epochs", "15",
                                             "--logical-workers", "2"], max_nodes=2,
             logical_workers=2),
    ]


def results(log_dir: Path) -> dict:
    """Each job's 'done:' line (printed by its rank 0), found through the agents' logs, which
    say which rank (member) of which job they started."""
    members: dict = {}
    for log in log_dir.glob("agent-*.log"):
        # "started rank <member> [(local rank i of n) ]of <job>.i<k>" (agent.cc)
        for m in re.finditer(r"started rank (\S+) (?:\(local rank \d+ of \d+\) )?of (\S+)\.i\d+",
                             log.read_text()):
            members.setdefault(m.group(2), []).append(m.group(1))
    found = {}
    for job, ms in members.items():
        for member in ms:
            out = log_dir / f"{member}.out"
            if out.exists():
                for line in out.read_text(errors="replace").splitlines():
                    if line.startswith("done:"):
                        found[job] = line
    return found


def rank_starts(log_dir: Path) -> str:
    """How the agents started ranks (warm: forked from their zygote) and how long their
    zygotes took to be ready, before each agent offered its node (no job held it then)."""
    text = "".join(log.read_text(errors="replace") for log in log_dir.glob("agent-*.log"))
    warm = len(re.findall(r"started rank .*, warm: forked from the zygote\)", text))
    started = len(re.findall(r"started rank ", text))
    ready = [float(x) for x in re.findall(r"zygote ready after ([0-9.]+) s", text)]
    line = f"rank starts: {started}, {warm} warm (forked from the node's zygote)"
    if ready:
        line += (f"; zygotes ready {len(ready)} times, {sum(ready):.1f} s in all (median "
                 f"{sorted(ready)[len(ready) // 2]:.1f} s) before their agents offered the nodes")
    return line


def plot(samples: list, names: list, nodes_up: list, path: Path) -> None:
    """Per job, the nodes it trains on (solid) and the nodes it holds without training
    (hatched: starting, warming up, draining), stacked, with the idle nodes offered."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.8))
    t = [s[0] for s in samples]
    bottom = [0] * len(samples)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, name in enumerate(names):
        color = colors[k % len(colors)]
        productive = [s[1].get(name, (0, 0))[0] for s in samples]
        held = [s[1].get(name, (0, 0))[1] for s in samples]
        top = [b + p for b, p in zip(bottom, productive)]
        ax.fill_between(t, bottom, top, step="post", label=name, color=color, alpha=0.8)
        idle_top = [b + max(h, p) for b, h, p in zip(bottom, held, productive)]
        ax.fill_between(t, top, idle_top, step="post", facecolor="none", edgecolor=color,
                        hatch="//", linewidth=0,
                        label=f"{name}: held, not training" if any(h > p for h, p in
                                                                    zip(held, productive)) else None)
        bottom = idle_top
    ax.step(t, nodes_up, where="post", color="black", linewidth=1.5, label="idle nodes offered")
    ax.set_xlabel("seconds")
    ax.set_ylabel("nodes")
    ax.set_title("malletrain: nodes each job trains on (solid) and holds without training "
                 "(hatched)", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out/demo", help="logs, plot and summary go here")
    p.add_argument("--policy", default="milp")
    p.add_argument("--trace", default=str(HERE / "demo_idle_trace.csv"))
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="replay the trace (and the jobs' pace) this many times faster")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--outage", type=float, default=10.0,
                   help="seconds every node is taken back once digits passes --outage-at "
                        "(scaled by --time-scale); 0: no outage")
    p.add_argument("--outage-at", type=int, default=100, help="the digits job's step that "
                   "triggers the outage")
    p.add_argument("--cold", action="store_true",
                   help="no zygotes: every rank starts a new interpreter on its node's clock")
    p.add_argument("--preload", default="torch,torch._dynamo,malletrain,sklearn.datasets",
                   help="modules the agents' zygotes import (those the jobs import)")
    args = p.parse_args(argv)
    if args.outage < 0 or args.outage_at < 0:
        p.error("--outage and --outage-at must be >= 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # A previous run's work directory holds the allocator's journal: starting on it would
    # replay that run (its jobs already succeeded) instead of running the demo again.
    previous = out / "cluster"
    if previous.exists():
        shutil.rmtree(previous)
        print(f"removed the previous run's {previous}", flush=True)
    events = load_idle_trace(args.trace, time_scale=args.time_scale)
    specs = jobs(sys.executable, args.time_scale)
    names = [s["job"] for s in specs]
    samples: list = []
    nodes_up: list = []
    t_start = time.monotonic()
    with LocalCluster(["n0", "n1", "n2", "n3"], policy=args.policy, workdir=out / "cluster",
                      grace=5.0, keep_logs=True, zygote=not args.cold,
                      preload=[m for m in args.preload.split(",") if m]) as cluster:
        print(f"control store {cluster.address}; logs in {cluster.log_dir}", flush=True)
        cluster.follow_trace(events)
        for s in specs:
            cluster.submit(**s)
        last = [0.0]
        outage = [args.outage <= 0]  # fired (or not wanted)

        def poll(c: LocalCluster) -> None:
            st = c.status()
            now = time.monotonic() - t_start
            digits = next((j for j in st.get("jobs", []) if j["job"] == "digits"), {})
            if not outage[0] and digits.get("step", 0) >= args.outage_at:
                outage[0] = True
                c.outage(args.outage / args.time_scale)
            samples.append((now, {j["job"]: (j.get("productive_nodes", 0), j.get("held_nodes", 0))
                                  for j in st.get("jobs", [])}))
            nodes_up.append(sum(1 for n in st.get("nodes", []) if n.get("offered")))
            if now - last[0] >= 3:
                last[0] = now
                print(live_table(c), flush=True)

        final = cluster.wait(names, timeout=args.timeout, poll=0.5, on_poll=poll)
        poll(cluster)
        status = cluster.status()
        reports = {n: cluster.report(n) for n in names}
        print()
        print(format_status(status))
        print()
        print("what happened:")
        print("\n".join(cluster.events))
        done = results(cluster.log_dir)
        print()
        print("results (rank 0 of each job):")
        for n in names:
            print(f"  {n:<8} {final[n]['phase']:<9} {done.get(n, '(no result line)')}")
        print()
        print("node time, per job (productive: a member training where the plan wants it; held "
              "without training: starting, warming up, draining):")
        for j in status.get("jobs", []):
            h = j.get("held") or {}
            print(f"  {j['job']:<8} productive {h.get('productive_node_s', 0):6.1f} node-s, held "
                  f"without training {h.get('held_idle_node_s', 0):5.1f} node-s (starting "
                  f"{h.get('starting_node_s', 0):.1f}, warming {h.get('warming_node_s', 0):.1f}, "
                  f"draining {h.get('draining_node_s', 0):.1f})")
        print("  " + held_summary(status.get("held") or {}))
        print("  " + rank_starts(cluster.log_dir))
        if reports.get("digits"):
            print()
            print("the digits job's scalability, as its profiling advisor learned it:")
            print(_C.advisor_report_table(json.dumps(reports["digits"])))
        plot(samples, names, nodes_up, out / "allocation.png")
        (out / "summary.json").write_text(json.dumps(
            {"status": status, "reports": reports, "events": cluster.events}, indent=1))
        print(f"\nplot: {out / 'allocation.png'}; summary: {out / 'summary.json'}; "
              f"took {time.monotonic() - t_start:.0f} s")
        ok = all(final[n]["phase"] == "succeeded" for n in names)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
