"""The ``malletrain`` command line.

    malletrain version                 versions of malletrain and of the torch it was built against
                                       (also: malletrain --version, python -m malletrain --version)
    malletrain alloc solve PROBLEM     decide which idle nodes each elastic job should hold
    malletrain alloc validate PROBLEM  check an allocation problem (JSON file, or - for stdin)
    malletrain simulate (--trace T | --swf LOG) (--jobs J | --synthetic N [--seed S])
                        [--policy dp,greedy ...] [--out DIR]
                                       replay an idle-node trace with a job mix per policy
    malletrain local --nodes N [--schedule SPEC] -- COMMAND ...
                                       run an elastic job on this machine, scripting joins,
                                       leaves and kills (malletrain.launcher)
    malletrain local --nodes N --idle-trace FILE -- COMMAND ...
                                       the same under the embedded allocator, with N local
                                       node agents appearing and vanishing as FILE says
    malletrain secret --new PATH       create a deployment's shared secret (mode 0600)
    malletrain store --listen H:P      host a deployment's control store
    malletrain allocator --store H:P   run the shared allocator (malle-allocator)
    malletrain agent --store H:P --node N
                                       run a node agent (malle-agent)
    malletrain submit --job ID -- COMMAND ...
                                       submit an elastic job to the allocator
    malletrain status [--watch S]      nodes, jobs, sizes and the last decision
    malletrain cancel --job ID         cancel a job

Each subcommand is a function ``_cmd_<name>(args) -> int`` registered in
:func:`build_parser`; the exit code is its return value (argparse itself exits
with 2 on a usage error).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from collections.abc import Sequence


def _cmd_version(args: argparse.Namespace) -> int:
    import torch

    import malletrain
    from malletrain import _C

    print(f"malletrain {malletrain.__version__}")
    print(f"torch (built against) {_C.torch_version()}")
    print(f"torch (runtime) {torch.__version__}")
    if _C.torch_version() != torch.__version__:
        # Another release cannot get here (malletrain/__init__.py refuses it): another build.
        print(
            "warning: the runtime torch is another build of the release malletrain was "
            "compiled against",
            file=sys.stderr,
        )
    return 0


class _VersionAction(argparse.Action):
    """``malletrain --version``: prints what ``malletrain version`` prints, then exits."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(_cmd_version(namespace))


def _read_problem(path: str) -> str | pathlib.Path:
    """The problem argument as :mod:`malletrain.alloc` takes it: ``-`` is stdin."""
    return sys.stdin.read() if path == "-" else pathlib.Path(path)


def _alloc_failed(e: Exception) -> int:
    """Prints an allocator error; bad input (the user's to fix) exits 2, anything else 1."""
    from malletrain.errors import MalleValueError

    print(f"malletrain alloc: {e}", file=sys.stderr)
    return 2 if isinstance(e, (MalleValueError, OSError)) else 1


def _cmd_alloc_solve(args: argparse.Namespace) -> int:
    from malletrain import alloc
    from malletrain.errors import MalleError

    try:
        decision = alloc.solve(
            _read_problem(args.problem),
            policy=args.policy,
            time_limit=args.time_limit,
            isolation=args.isolation,
        )
    except (MalleError, OSError) as e:
        return _alloc_failed(e)
    if args.compact:
        print(json.dumps(decision, separators=(",", ":")))
    else:
        print(json.dumps(decision, indent=2))
    return 0


def _cmd_alloc_validate(args: argparse.Namespace) -> int:
    from malletrain import alloc
    from malletrain.errors import MalleError

    try:
        summary = alloc._summary(_read_problem(args.problem))
    except (MalleError, OSError) as e:
        return _alloc_failed(e)
    print(summary)
    return 0


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (e.g. 0.5), got {text!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return seconds


def _add_alloc_parser(commands: argparse._SubParsersAction) -> None:
    # No choices=: building the parser must not import malletrain (and torch);
    # the allocator itself rejects a wrong name, listing the valid ones.
    alloc = commands.add_parser(
        "alloc",
        help="allocate idle nodes to elastic jobs",
        description="Solve or check an allocation problem given as JSON "
        "(docs/allocator-json.md). Exit codes: 0 ok, 2 bad input, 1 other errors.",
    )
    alloc_commands = alloc.add_subparsers(dest="alloc_command", metavar="COMMAND", required=True)
    problem_help = "the problem: a JSON file, or - for stdin"

    solve = alloc_commands.add_parser(
        "solve",
        help="decide which nodes each job should hold; prints the decision as JSON",
        description="Decide which idle nodes each elastic job should hold and print the "
        "decision as JSON on stdout.",
    )
    solve.add_argument("problem", metavar="PROBLEM", help=problem_help)
    solve.add_argument(
        "--policy",
        default="milp",
        help="milp (default), dp, greedy, equal_share or static",
    )
    solve.add_argument(
        "--time-limit",
        type=_positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="wall-clock limit of the MILP solve (default: 1)",
    )
    solve.add_argument(
        "--isolation",
        default="fork",
        help="fork: CBC runs in a child process (default); in_process: cheaper",
    )
    solve.add_argument("--compact", action="store_true", help="print the decision on one line")
    solve.set_defaults(func=_cmd_alloc_solve)

    validate = alloc_commands.add_parser(
        "validate",
        help="check a problem; prints 'ok: N jobs, M nodes, K pools'",
        description="Check an allocation problem without solving it.",
    )
    validate.add_argument("problem", metavar="PROBLEM", help=problem_help)
    validate.set_defaults(func=_cmd_alloc_validate)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from malletrain import errors, sim

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if not policies:
        print("malletrain simulate: --policy: give at least one policy", file=sys.stderr)
        return 2
    if args.seed is not None and args.synthetic is None:
        print("malletrain simulate: --seed: only with --synthetic", file=sys.stderr)
        return 2
    if args.swf is None and (args.swf_nodes is not None or args.swf_procs_per_node is not None
                             or args.swf_unknown_wait_zero):
        print("malletrain simulate: --swf-nodes/--swf-procs-per-node/--swf-unknown-wait-zero: "
              "only with --swf", file=sys.stderr)
        return 2
    if args.repeat_period is not None and args.repeat_mix is None:
        print("malletrain simulate: --repeat-period: only with --repeat-mix", file=sys.stderr)
        return 2
    terms_for = [p.strip() for p in args.terms_for.split(",") if p.strip()]
    unknown = [p for p in terms_for if p != "all" and p not in sim.POLICIES]
    if not terms_for or unknown:
        print(f"malletrain simulate: --terms-for: expected 'all' or policies among "
              f"{', '.join(sim.POLICIES)}, got {args.terms_for!r}", file=sys.stderr)
        return 2
    if args.out and not sim.plots_available():
        # Before the simulation, not after it: --out writes plots too.
        print(f"malletrain simulate: --out: {sim.PLOTS_MISSING}", file=sys.stderr)
        return 2
    try:
        if args.swf is not None:
            trace = sim.load_swf(args.swf, strict=args.strict, nodes=args.swf_nodes,
                                 procs_per_node=args.swf_procs_per_node,
                                 unknown_wait_is_zero=args.swf_unknown_wait_zero)
        else:
            trace = sim.load_trace(args.trace, strict=args.strict)
        if args.synthetic is not None:
            seed = 1 if args.seed is None else args.seed
            mix = sim.synthetic_job_mix(args.synthetic, seed=seed)
        else:
            mix = sim.load_job_mix(args.jobs, strict=args.strict)
        if args.repeat_mix is not None:
            period_h = 10.0 if args.repeat_period is None else args.repeat_period
            mix = sim.repeat_mix(mix, args.repeat_mix, period_h * 3600)
    except (ValueError, TypeError, OSError, errors.MalleError) as e:
        print(f"malletrain simulate: {e}", file=sys.stderr)
        return 2
    for what, rejected in (("trace", trace.rejected), ("jobs", mix.rejected)):
        for file, line, message in rejected:
            print(f"warning: {file}:{line}: {message} (row skipped)", file=sys.stderr)
        if rejected:
            print(f"warning: {len(rejected)} {what} rows rejected", file=sys.stderr)
    report = trace.swf_report
    if report is not None:
        print(_swf_report_text(report), file=sys.stderr)
    mix_text = (f"synthetic, seed {1 if args.seed is None else args.seed}"
                if args.synthetic is not None else args.jobs)
    print(f"trace: {trace.num_nodes} nodes, {trace.rows} rows, {trace.num_events} state changes; "
          f"jobs: {mix.num_jobs} ({mix_text})", file=sys.stderr)
    results = []
    for policy in policies:
        bar = None
        try:
            from tqdm import tqdm

            bar = tqdm(total=1000, desc=policy, unit="‰", leave=True, file=sys.stderr,
                       disable=args.quiet)
        except ImportError:
            pass

        def progress(fraction: float, bar=bar) -> None:
            if bar is not None:
                bar.update(max(0, int(fraction * 1000) - bar.n))

        # The objective terms apply to the policies in --terms-for; the others run as
        # published (throughput objective, no terms), as sim_bench's --terms_for does.
        terms = "all" in terms_for or policy in terms_for
        try:
            result = sim.simulate(
                trace, mix, policy=policy, curves=args.curves, forecast=args.forecast,
                node_classes=args.node_classes,
                cross_locality_factor=args.cross_locality_factor,
                accounting=args.accounting,
                objective=args.objective if terms else "throughput",
                preemption_cost=args.preemption_cost, state_bytes=args.state_mb * 1e6,
                write_bytes_per_s=args.park_write_mb_s * 1e6,
                read_bytes_per_s=args.park_read_mb_s * 1e6,
                copy_bytes_per_s=args.snapshot_copy_mb_s * 1e6,
                park_fixed=args.park_fixed_s, unpark_fixed=args.unpark_fixed_s,
                snapshot_interval=args.snapshot_interval_s, snapshot_budget=args.snapshot_budget,
                reclaim_hazard=args.reclaim_hazard and terms,
                resize_hysteresis=args.hysteresis if terms else 1.0,
                rank_weights=args.rank_weights if terms else 0.0,
                rank_aging=(args.rank_aging * 3600.0
                            if terms and args.rank_aging is not None else None),
                forward_window=(args.terms_forward_window
                                if terms and args.terms_forward_window is not None
                                else args.forward_window),
                debounce=args.debounce,
                max_waiting=args.max_waiting, time_limit=args.time_limit,
                skip_snapshots=args.skip_snapshots, record_events=args.events,
                progress=progress)
        except (ValueError, errors.MalleError) as e:
            if bar is not None:
                bar.close()
            print(f"malletrain simulate: {e}", file=sys.stderr)
            return 2
        if bar is not None:
            bar.update(1000 - bar.n)
            bar.close()
        results.append(result)
        if args.out:
            out = pathlib.Path(args.out) / policy
            result.write_csv(out)
            sim.plot_utilisation(result, out / "utilisation.png")
            sim.plot_gantt(result, out / "gantt.png")
    print(sim.summary_table(results))
    if len(results) > 1:
        print()
        print(sim.dominance_table(results))
    if args.out and args.synthetic is not None:
        # The mix is part of the result: write it so that the run can be repeated with --jobs.
        pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(args.out) / "jobs.csv").write_text(mix.to_csv())
    if args.out:
        sim.plot_policy_comparison(results, pathlib.Path(args.out) / "policies.png")
        print(f"written to {args.out}/ (per policy: summary/jobs/timeline CSV and plots)")
    return 0


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _positive_float_or_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text!r}")
    return value


def _swf_report_text(r: dict) -> str:
    """The SWF replay's counts, one line each, for stderr."""
    over_h = r["oversubscribed_node_seconds"] / 3600
    asked_h = r["asked_node_seconds"] / 3600
    share = over_h / asked_h if asked_h > 0 else 0.0
    lines = []
    if r.get("absolute_times"):
        lead_years = r["skipped_lead_s"] / (365.25 * 86400)
        ignored = r.get("ignored_unix_start_time")
        header = ("no UnixStartTime header" if ignored is None else
                  f"a UnixStartTime header of {ignored}, not added (the times already are "
                  f"Unix times)")
        lines.append(
            f"WARNING: swf: the log gives absolute Unix submit times (the first one is "
            f"{r['skipped_lead_s']:.0f} s, {lead_years:.1f} years after 1970) and {header}: "
            f"it is replayed from its first event, not from 1970")
    lines += [
        f"swf: machine of {r['nodes']} nodes x {r['procs_per_node']} procs; "
        f"{r['jobs_replayed']} jobs replayed"
        + (f" ({r['jobs_requested_procs']} with their requested procs)"
           if r["jobs_requested_procs"] else ""),
        f"swf: replayed span {r.get('span_s', 0) / 86400:.2f} days from the log's first event"
        + (f"; {r['jobs_wait_assumed_zero']} jobs with an unknown wait replayed with wait 0"
           if r.get("jobs_wait_assumed_zero") else ""),
        f"swf: not replayed: {r['jobs_zero_length']} zero-length, "
        f"{r['jobs_unknown_times']} with unknown times, {r['jobs_unknown_procs']} with unknown "
        f"size, {r['summary_lines_replaced']} summary lines replaced by partial executions",
        f"swf: over-subscription: {over_h:.1f} node-hours asked beyond the machine "
        f"({share:.2%} of {asked_h:.1f}), {r['oversubscribed_jobs']} jobs ran short "
        f"({r['oversized_jobs']} larger than the machine), peak {r['peak_asked_nodes']} nodes "
        f"asked; short jobs got nodes as others ended (busy nodes = min(machine, asked))",
    ]
    return "\n".join(lines)


def _add_simulate_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "simulate",
        help="replay an idle-node trace with a job mix under allocation policies",
        description="Replay an idle-node trace (CSV or CSV.gz) with a job mix (CSV) under one or "
        "more allocation policies; print a summary table and optionally write CSVs and plots.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="idle-node transition trace (.csv or .csv.gz)")
    source.add_argument("--swf", metavar="LOG",
                        help="scheduler log in the Standard Workload Format (.swf or .swf.gz); "
                        "its idle-node trace is derived by replaying its start/end times")
    p.add_argument("--swf-nodes", type=int, metavar="N",
                   help="machine size for --swf (default: the log's MaxNodes, else MaxProcs)")
    p.add_argument("--swf-procs-per-node", type=int, metavar="P",
                   help="processors per node for --swf (default: MaxProcs / MaxNodes)")
    p.add_argument("--swf-unknown-wait-zero", action="store_true",
                   help="replay jobs with an unknown wait time (-1) as starting at submit (for "
                   "logs whose submit times are start times)")
    mix = p.add_mutually_exclusive_group(required=True)
    mix.add_argument("--jobs", help="job-mix CSV")
    mix.add_argument("--synthetic", type=_non_negative_int, metavar="N",
                     help="a synthetic mix of N jobs drawn from --seed (written to OUT/jobs.csv)")
    p.add_argument("--seed", type=_non_negative_int, metavar="S",
                   help="seed of --synthetic (default 1); same seed, same mix")
    p.add_argument("--repeat-mix", type=_positive_int, metavar="K",
                   help="a saturated regime: K copies of the mix, --repeat-period apart")
    p.add_argument("--repeat-period", type=_positive_float_or_zero, metavar="HOURS",
                   help="hours between the copies of --repeat-mix (default 10)")
    p.add_argument("--policy", default="dp",
                   help="comma-separated policies: milp, dp, greedy, equal_share, static")
    p.add_argument("--curves", default="oracle",
                   help="what the policy knows of scalability: oracle, learned or linear")
    p.add_argument("--forecast", default="none",
                   help="none, oracle, estimated or reservation (reclaims known from the submit "
                   "of the job that makes them; SWF logs)")
    p.add_argument("--node-classes", default="", metavar="SPEC",
                   help="node classes over the trace's nodes in order, "
                   "id:locality:speed:share[,...] (e.g. fast:r0:1:0.5,slow:r1:0.85:0.5); "
                   "default: one class")
    p.add_argument("--cross-locality-factor", type=float, default=1.0, metavar="X",
                   help="with --node-classes: a job spanning locality groups trains at X "
                   "(0 < X <= 1) times its rate")
    p.add_argument("--reclaim-hazard", action="store_true",
                   help="tell the policy the machine's reclaim rate so far (it prices the "
                   "forced shrinks that holding more nodes risks)")
    p.add_argument("--hysteresis", type=float, default=1.0, metavar="X",
                   help="the policy charges every resize X >= 1 times its pause")
    p.add_argument("--accounting", default="bftrainer", help="bftrainer or pause")
    p.add_argument("--preemption-cost", default="park",
                   choices=("free", "park", "snapshot", "restart"),
                   help="what a stop costs a job: park (default; the live system with a park "
                   "store: park + unpark time), snapshot (back to its last snapshot), restart "
                   "(all progress lost) or free (BFTrainer's replayer); docs/simulator.md")
    p.add_argument("--state-mb", type=_positive_float_or_zero, default=250.0, metavar="MB",
                   help="job state parked or snapshotted (default 250, resize_bench's state)")
    p.add_argument("--park-write-mb-s", type=_positive_float, default=125.0, metavar="MB/S",
                   help="park store write bandwidth (default 125, this VM's disk with fsync)")
    p.add_argument("--park-read-mb-s", type=_positive_float, default=1000.0, metavar="MB/S",
                   help="park store read bandwidth (default 1000)")
    p.add_argument("--snapshot-copy-mb-s", type=_positive_float, default=1000.0, metavar="MB/S",
                   help="copy bandwidth of a snapshot, paid by the step (default 1000)")
    p.add_argument("--park-fixed-s", type=_positive_float_or_zero, default=1.0,
                   metavar="SECONDS", help="fixed part of a park (default 1)")
    p.add_argument("--unpark-fixed-s", type=_positive_float_or_zero, default=1.0,
                   metavar="SECONDS", help="fixed part of an unpark (default 1)")
    p.add_argument("--snapshot-interval-s", type=_positive_float_or_zero, default=0.0,
                   metavar="SECONDS", help="snapshot mode: seconds between snapshots (default "
                   "0: adaptive, copies under --snapshot-budget of the training time)")
    p.add_argument("--snapshot-budget", type=_fraction, default=0.01, metavar="F",
                   help="adaptive snapshots: copy time / training time, in (0, 1) (default "
                   "0.01, the live engine's)")
    p.add_argument("--objective", default="throughput",
                   help="throughput, speedup, weighted or completion (the value of finishing)")
    p.add_argument("--rank-weights", type=_positive_float_or_zero, default=0.0, metavar="P",
                   help="each job's value times rank^P, rank 1 for the job with the most work "
                   "left (0 = off; --objective speedup --rank-weights 1 is the setting that won "
                   "in docs/benchmarks.md)")
    p.add_argument("--rank-aging", type=_positive_float, metavar="HOURS",
                   help="with --rank-weights: a job's work left ranks as work / (1 + age / "
                   "HOURS), its age counted from its submit, so that no job stays ranked last "
                   "(default: off)")
    p.add_argument("--terms-for", default="all", metavar="POLICIES",
                   help="the policies that get --objective, --reclaim-hazard, --hysteresis, "
                   "--rank-weights and --rank-aging (default all); the others run as published "
                   "(throughput objective, no terms), e.g. --terms-for dp")
    p.add_argument("--terms-forward-window", type=_positive_seconds, metavar="SECONDS",
                   help="the forward window of the policies in --terms-for (default: "
                   "--forward-window)")
    p.add_argument("--forward-window", type=_positive_seconds, default=120.0, metavar="SECONDS")
    p.add_argument("--debounce", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--max-waiting", type=int, default=64)
    p.add_argument("--time-limit", type=_positive_seconds, default=1.0, metavar="SECONDS",
                   help="MILP time limit per decision")
    p.add_argument("--skip-snapshots", type=int, default=0,
                   help="start at this trace timestamp index (BFTrainer's replayer uses 999)")
    p.add_argument("--events", action="store_true", help="record every event (events.csv)")
    p.add_argument("--strict", action="store_true", help="fail on the first bad input row")
    p.add_argument("--out", help="directory for CSVs and PNG plots (plots: malletrain[plots])")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_simulate)


def _cmd_local(args: argparse.Namespace) -> int:
    if args.idle_trace is not None:
        if args.schedule:
            print("malletrain local: --schedule and --idle-trace exclude each other (a trace "
                  "makes the allocator decide who runs where)", file=sys.stderr)
            return 2
        if args.warm:
            print("malletrain local: with --idle-trace ranks start warm already (--cold: not)",
                  file=sys.stderr)
            return 2
        from malletrain import cluster

        return cluster.run_local_cli(args)
    if args.cold:
        print("malletrain local: --cold needs --idle-trace (without it, ranks start cold "
              "unless --warm)", file=sys.stderr)
        return 2
    if args.slots is not None:
        print("malletrain local: --slots needs --idle-trace (node agents run the slots; without "
              "a trace --nodes counts ranks)", file=sys.stderr)
        return 2
    from malletrain import launcher

    return launcher.main(args)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _add_local_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "local",
        help="run an elastic job on this machine with scripted joins, leaves and kills",
        description="Hosts the job's control store, starts NODES rank processes running "
        "COMMAND and follows SCHEDULE: comma-separated events 'step=K ACTION [COUNT]' or "
        "'t=SECONDS ACTION [COUNT]' with ACTION one of join, leave, kill, term, stop, cont "
        "(docs/launcher.md). Example: --schedule \"step=10 leave 2, step=20 join 1, "
        "step=30 kill 1\". Exit codes: 0 every rank not killed by the schedule exited 0, "
        "1 one did not, 2 bad input, 124 timeout, 130 SIGINT/SIGTERM.",
    )
    p.add_argument("--nodes", type=_positive_int, required=True, help="members at the start")
    p.add_argument("--schedule", default="", help="joins, leaves and kills (see above)")
    p.add_argument("--job-id", default="local", help="job id in the control store")
    p.add_argument("--timeout", type=_positive_seconds, default=600.0, metavar="SECONDS",
                   help="kill every process after this many seconds, exit 124 (default: 600)")
    p.add_argument("--seed", type=int, default=None,
                   help="kill (and stop) random non-leader members, reproducibly")
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="one log file per member (DIR/<member>.log) instead of the terminal")
    p.add_argument("--idle-trace", default=None, metavar="FILE",
                   help="run under the embedded allocator: N local node agents appear and vanish "
                   "following FILE (CSV time,node,idle; docs/operations.md); the job may use "
                   "every node the allocator gives it")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                   help="with --idle-trace: replay the trace X times faster")
    p.add_argument("--policy", default="milp", help="with --idle-trace: the allocation policy")
    p.add_argument("--logical-workers", type=_positive_int, default=None, metavar="L",
                   help="with --idle-trace: the job's logical workers (caps its size)")
    p.add_argument("--grace", type=_positive_seconds, default=10.0, metavar="SECONDS",
                   help="with --idle-trace: time a reclaimed node gives its rank to leave")
    p.add_argument("--slots", type=int, default=None, metavar="N",
                   help="with --idle-trace: ranks per node (each agent's --slots); the job runs "
                   "N ranks on every node it gets")
    p.add_argument("--park-dir", default=None, metavar="DIR",
                   help="the job's park store: where its last rank parks the state when every "
                   "node goes, and snapshots are kept; a later run with the same DIR resumes "
                   "from it (with --idle-trace: DIR/<job id>; default there: the cluster's "
                   "work directory)")
    p.add_argument("--warm", action="store_true",
                   help="without --idle-trace: fork every member from a zygote, an interpreter "
                   "of COMMAND's (a Python that imports malletrain) that has imported torch and "
                   "malletrain once (docs/launcher.md)")
    p.add_argument("--cold", action="store_true",
                   help="with --idle-trace: no zygotes, every rank starts a new interpreter "
                   "(default there: warm starts, docs/operations.md)")
    # Not dest="command": the top-level subcommand already uses that name.
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the rank program and its arguments, after --")
    p.set_defaults(func=_cmd_local)


# --- the control plane ---------------------------------------------------------------------

def _store_address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def _deployment_defaults(args: argparse.Namespace) -> None:
    """--store and --secret default to the deployment's variables (their names come from the
    rank environment contract, libmalle/cluster/rank_env.h). Resolved here rather than when
    the parser is built, so that ``malletrain --help`` does not load the extension."""
    import os

    from malletrain import _C

    if getattr(args, "store", "unset") is None and os.environ.get(_C.ENV_STORE):
        try:
            args.store = _store_address(os.environ[_C.ENV_STORE])
        except argparse.ArgumentTypeError as e:
            raise SystemExit(_usage_error(args, f"{_C.ENV_STORE}: {e}")) from None
    if getattr(args, "secret", "unset") is None:
        args.secret = os.environ.get(_C.ENV_SECRET) or None


def _control_client(args: argparse.Namespace):
    from malletrain import _C

    _deployment_defaults(args)
    if not args.store:
        raise SystemExit(_usage_error(args, f"--store (or {_C.ENV_STORE}) is required"))
    if not args.secret:
        raise SystemExit(_usage_error(args, f"--secret (or {_C.ENV_SECRET}) is required"))
    host, _, port = args.store.rpartition(":")
    secret = _C.load_secret(args.secret)
    store = _C.ControlStore.connect(host, int(port), timeout=args.connect_timeout)
    return _C.ControlClient(store, secret)


def _usage_error(args: argparse.Namespace, message: str) -> int:
    print(f"malletrain {args.command}: {message}", file=sys.stderr)
    return 2


def _control_failed(args: argparse.Namespace, e: Exception) -> int:
    from malletrain.errors import MalleValueError

    print(f"malletrain {args.command}: {e}", file=sys.stderr)
    return 2 if isinstance(e, (MalleValueError, ValueError, OSError)) else 1


def _cmd_secret(args: argparse.Namespace) -> int:
    from malletrain import _C

    try:
        _C.write_new_secret(args.new)
    except Exception as e:  # noqa: BLE001 - reported with its class
        return _control_failed(args, e)
    print(f"created {args.new} (mode 0600); give it to the allocator, the agents and the clients")
    return 0


def _cmd_store(args: argparse.Namespace) -> int:
    import signal
    import threading

    from malletrain import _C

    host, _, port = args.listen.rpartition(":")
    try:
        store = _C.ControlStore.serve(host, int(port))
    except Exception as e:  # noqa: BLE001
        return _control_failed(args, e)
    print(f"control store listening on {host}:{store.port}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    return 0


def _exec_daemon(name: str, argv: list) -> int:
    import os

    from malletrain.cluster import agent_binary

    path = agent_binary(name)
    os.execv(path, [path, *argv])
    return 1  # not reached


def _cmd_allocator(args: argparse.Namespace) -> int:
    from malletrain import _C
    from malletrain.cluster import allocator_objective_flags

    _deployment_defaults(args)
    if (args.store is None) == (args.listen is None):
        return _usage_error(args, "give exactly one of --store and --listen")
    if not args.secret:
        return _usage_error(args, f"--secret (or {_C.ENV_SECRET}) is required")
    argv = [f"--secret={args.secret}", f"--policy={args.policy}",
            f"--forward_window={args.forward_window}s",
            f"--heartbeat_timeout={args.heartbeat_timeout}s",
            *allocator_objective_flags(args.objective, args.hysteresis, args.rank_weights,
                                       args.reclaim_hazard,
                                       None if args.rank_aging is None
                                       else args.rank_aging * 3600.0)]
    argv.append(f"--store={args.store}" if args.store else f"--listen={args.listen}")
    if args.journal:
        argv.append(f"--journal={args.journal}")
    return _exec_daemon("malle-allocator", argv)


def _cmd_agent(args: argparse.Namespace) -> int:
    from malletrain import _C

    _deployment_defaults(args)
    if not args.store or not args.secret:
        return _usage_error(args, f"--store and --secret (or {_C.ENV_STORE}, {_C.ENV_SECRET}) are "
                            "required")
    argv = [f"--store={args.store}", f"--secret={args.secret}", f"--node={args.node}",
            f"--group={args.group}", f"--speed={args.speed}", f"--grace={args.grace}s"]
    if args.idle_until is not None:
        argv.append(f"--idle_until={args.idle_until}")
    if args.log_dir:
        argv.append(f"--log_dir={args.log_dir}")
    if args.slots is not None:
        argv.append(f"--slots={args.slots}")
    if args.gpus:
        argv.append(f"--gpus={args.gpus}")
    if args.zygote_python:
        argv.append(f"--zygote_python={args.zygote_python}")
    if args.zygote_preload:
        argv.append(f"--zygote_preload={args.zygote_preload}")
    return _exec_daemon("malle-agent", argv)


def _cmd_submit(args: argparse.Namespace) -> int:
    import os

    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return _usage_error(args, "give the job's command after --, e.g. -- python train.py")
    env = {}
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            return _usage_error(args, f"--env: expected NAME=VALUE, got {item!r}")
        env[name] = value
    max_nodes = args.max_nodes if args.max_nodes is not None else (args.logical_workers or 1)
    try:
        client = _control_client(args)
        client.submit(job=args.job, command=command, env=env,
                      cwd=os.path.abspath(args.cwd or os.getcwd()), min_nodes=args.min_nodes,
                      max_nodes=max_nodes, logical_workers=args.logical_workers,
                      weight=args.weight, priority=args.priority,
                      total_steps=args.total_steps)
    except Exception as e:  # noqa: BLE001
        return _control_failed(args, e)
    print(f"submitted {args.job}; see `malletrain status`")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import time

    from malletrain.cluster import format_status

    try:
        client = _control_client(args)
        while True:
            text = client.status_json()
            if args.json:
                print(text)
            else:
                if args.watch:
                    print("\033[2J\033[H", end="")
                print(format_status(json.loads(text)))
            if not args.watch:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
    except Exception as e:  # noqa: BLE001
        return _control_failed(args, e)


def _cmd_cancel(args: argparse.Namespace) -> int:
    try:
        _control_client(args).cancel(job=args.job, reason=args.reason)
    except Exception as e:  # noqa: BLE001
        return _control_failed(args, e)
    print(f"cancel of {args.job} sent")
    return 0


def _add_control_parsers(commands: argparse._SubParsersAction) -> None:
    def connection(p: argparse.ArgumentParser, store: bool = True) -> None:
        if store:
            p.add_argument("--store", type=_store_address, default=None,
                           metavar="HOST:PORT", help="the control store (default: $MALLE_STORE)")
        p.add_argument("--secret", default=None, metavar="FILE",
                       help="the shared secret file, mode 0600 (default: $MALLE_SECRET)")
        p.add_argument("--connect-timeout", type=_positive_seconds, default=30.0,
                       metavar="SECONDS", help=argparse.SUPPRESS)

    p = commands.add_parser("secret", help="create a deployment's shared secret",
                            description="Creates a new random secret file (mode 0600). The "
                            "allocator, every agent and every client need it.")
    p.add_argument("--new", required=True, metavar="PATH", help="file to create (must not exist)")
    p.set_defaults(func=_cmd_secret)

    p = commands.add_parser("store", help="host a deployment's control store",
                            description="Hosts the control store (a c10d TCPStore) until "
                            "SIGINT/SIGTERM. Run it where it outlives allocator restarts.")
    p.add_argument("--listen", type=_store_address, default="127.0.0.1:29400", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:29400; port 0: any)")
    p.set_defaults(func=_cmd_store)

    p = commands.add_parser("allocator", help="run the shared allocator (malle-allocator)",
                            description="Runs the allocator daemon over a control store hosted "
                            "elsewhere (--store) or hosted by itself (--listen).")
    p.add_argument("--store", type=_store_address, default=None, metavar="HOST:PORT")
    p.add_argument("--listen", type=_store_address, default=None, metavar="HOST:PORT")
    connection(p, store=False)
    p.add_argument("--journal", default=None, metavar="FILE",
                   help="journal: a kill -9 and restart loses nothing (recommended)")
    p.add_argument("--policy", default="milp", choices=["milp", "dp", "greedy", "equal_share",
                                                        "static"])
    p.add_argument("--forward-window", type=_positive_seconds, default=120.0, metavar="SECONDS")
    p.add_argument("--heartbeat-timeout", type=_positive_seconds, default=15.0, metavar="SECONDS")
    p.add_argument("--objective", default="throughput", choices=["throughput", "speedup",
                                                                 "weighted"])
    p.add_argument("--hysteresis", type=float, default=1.0, metavar="X",
                   help="charge every resize X >= 1 times its pause")
    p.add_argument("--rank-weights", type=_positive_float_or_zero, default=0.0, metavar="P",
                   help="each job's value times rank^P, rank 1 for the job with the most work "
                   "left (jobs say their length with submit --total-steps); 0 = off. "
                   "--objective speedup --rank-weights 1 won in docs/benchmarks.md")
    p.add_argument("--rank-aging", type=_positive_float, metavar="HOURS",
                   help="with --rank-weights: a job's work left ranks as work / (1 + age / "
                   "HOURS), its age counted from its submit (default: off)")
    p.add_argument("--reclaim-hazard", action="store_true",
                   help="price the expected cost of a reclaim within the window, at the rate of "
                   "reclaims this allocator has seen")
    p.set_defaults(func=_cmd_allocator)

    p = commands.add_parser("agent", help="run a node agent (malle-agent)",
                            description="Offers this node to the allocator and runs the ranks "
                            "it assigns. SIGTERM = the node is reclaimed (the rank leaves within "
                            "--grace); SIGINT = stop offering it.")
    connection(p)
    p.add_argument("--node", required=True, help="this node's name")
    p.add_argument("--group", default="default", help="locality group (rack, switch)")
    p.add_argument("--speed", type=float, default=1.0, help="relative speed, (0, 100]")
    p.add_argument("--idle-until", type=float, default=None, metavar="UNIX_SECONDS",
                   help="forecast end of this node's idle window")
    p.add_argument("--grace", type=_positive_seconds, default=30.0, metavar="SECONDS")
    p.add_argument("--log-dir", default=None, metavar="DIR", help="ranks' stdout/stderr files")
    p.add_argument("--slots", type=int, default=None, metavar="N",
                   help="ranks per job on this node, LOCAL_RANK 0..N-1 (default: one per GPU "
                   "with --gpus, else 1)")
    p.add_argument("--gpus", default=None, metavar="auto|LIST",
                   help="'auto': the GPUs of this node or its Slurm allocation "
                   "(CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS/SLURM_JOB_GPUS, SLURM_GPUS_ON_NODE, the "
                   "driver); a list such as 0,1: those")
    p.add_argument("--zygote-python", default=None, metavar="PYTHON",
                   help="warm rank starts: this interpreter imports --zygote-preload once, "
                   "before the node is offered, and the ranks of jobs whose command runs it are "
                   "forked from it (docs/operations.md, 'Warm rank starts')")
    p.add_argument("--zygote-preload", default=None, metavar="MODULES",
                   help="comma-separated modules the zygote imports (default: "
                   "torch,torch._dynamo,malletrain)")
    p.set_defaults(func=_cmd_agent)

    p = commands.add_parser("submit", help="submit an elastic job to the allocator",
                            description="Submits a job; its command runs as one rank per node "
                            "the allocator gives it.")
    connection(p)
    p.add_argument("--job", required=True, help="job id ([A-Za-z0-9._-], unique)")
    p.add_argument("--min-nodes", type=_positive_int, default=1)
    p.add_argument("--max-nodes", type=_positive_int, default=None,
                   help="default: --logical-workers, else 1")
    p.add_argument("--logical-workers", type=_positive_int, default=None)
    p.add_argument("--weight", type=float, default=1.0)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--total-steps", type=_positive_int, default=None, metavar="N",
                   help="the job's length in optimizer steps, if known: the allocator's rank "
                   "weights order jobs by the work they have left")
    p.add_argument("--env", action="append", metavar="NAME=VALUE")
    p.add_argument("--cwd", default=None, help="working directory of the ranks (default: here)")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=_cmd_submit)

    p = commands.add_parser("status", help="nodes, jobs, sizes and the last decision",
                            description="Prints the allocator's status document.")
    connection(p)
    p.add_argument("--json", action="store_true", help="the raw JSON document")
    p.add_argument("--watch", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="refresh every SECONDS until Ctrl-C")
    p.set_defaults(func=_cmd_status)

    p = commands.add_parser("cancel", help="cancel a job")
    connection(p)
    p.add_argument("--job", required=True)
    p.add_argument("--reason", default="cancelled by the user")
    p.set_defaults(func=_cmd_cancel)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="malletrain",
        description="Elastic data-parallel training for PyTorch.",
    )
    parser.add_argument("--version", action=_VersionAction,
                        help="print the versions of malletrain and torch, then exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    version = commands.add_parser(
        "version",
        help="print the versions of malletrain and torch",
        description="Print malletrain's version, the torch it was compiled against and the "
        "torch installed now.",
    )
    version.set_defaults(func=_cmd_version)
    _add_alloc_parser(commands)
    _add_simulate_parser(commands)
    _add_local_parser(commands)
    _add_control_parsers(commands)
    __import__("malletrain.slurm").slurm.add_slurm_parser(commands)  # malletrain slurm ...
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
