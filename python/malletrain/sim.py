"""Replay a machine's idle-node history with a job mix, under any allocation policy.

The simulator drives the same allocator code as the live system (``libmalle/alloc``), so its
figures are the allocator's figures. Inputs are an idle-node transition trace (e.g.
``summit-idle-2021-02.csv.gz``) and a job-mix CSV (e.g. ``jobs-imagenet-1001.csv``); the format
of both is described in ``docs/simulator.md``.

Idle-node traces can also be derived from a scheduler log in the Standard Workload Format
(:func:`load_swf`), and job mixes drawn from a seed (:func:`synthetic_job_mix`).

Example (a notebook)::

    from malletrain import sim

    trace = sim.load_trace("../shared/data/summit-idle-2021-02.csv.gz")
    mix = sim.load_job_mix("../shared/data/jobs-hpo-shufflenet-10.csv")
    results = [sim.simulate(trace, mix, policy=p) for p in ("dp", "greedy", "equal_share")]
    for r in results:
        print(r.summary["policy"], r.summary["efficiency"])
    sim.plot_policy_comparison(results, "policies.png")

Results are plain records (dicts and tuples); :meth:`SimulationResult.to_dataframes` returns
pandas data frames when pandas is installed.
"""

from __future__ import annotations

import csv
import datetime
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from malletrain import _C

PathLike = Union[str, "os.PathLike[str]"]

TIMELINE_FIELDS = ("time", "idle_nodes", "used_nodes", "running_jobs", "waiting_jobs")
EVENT_FIELDS = (
    "time",
    "kind",
    "job",
    "node",
    "nodes_before",
    "nodes_after",
    "idle_nodes",
    "used_nodes",
    "decision_ms",
)

POLICIES = ("milp", "dp", "greedy", "equal_share", "static")


def load_trace(path: PathLike, *, strict: bool = False) -> _C.IdleTrace:
    """Loads an idle-node trace (``.csv`` or ``.csv.gz``).

    Lenient by default: malformed rows are skipped and listed in ``trace.rejected`` as
    ``(file, line, message)``; with ``strict=True`` the first one raises ``ValueError``.
    """
    return _C.sim_load_trace(os.fspath(path), strict)


def load_swf(
    path: PathLike,
    *,
    strict: bool = False,
    nodes: int | None = None,
    procs_per_node: int | None = None,
    unknown_wait_is_zero: bool = False,
) -> _C.IdleTrace:
    """Loads a scheduler log in the Standard Workload Format (``.swf`` or ``.swf.gz``) and
    derives the idle-node trace it implies (docs/simulator.md lists the assumptions).

    The machine has ``nodes`` nodes (default: the header's ``MaxNodes``, else ``MaxProcs``) of
    ``procs_per_node`` processors (default: ``MaxProcs / MaxNodes``). Malformed lines are listed
    in ``trace.rejected`` as ``(file, line, message)``, or raise ``ValueError`` with
    ``strict=True``; ``trace.swf_report`` says how many jobs were replayed, how many could not
    be (unknown times or sizes, zero length) and how far the log over-subscribes the machine.
    The replay starts at the log's first event; a log with absolute Unix submit times (with
    no ``UnixStartTime`` header, or one that is not added: ``["ignored_unix_start_time"]``) is
    detected and read as such (``swf_report["absolute_times"]``, ``["skipped_lead_s"]``).
    ``unknown_wait_is_zero=True`` replays jobs whose wait time is unknown (-1) as if they
    started at submit, for logs whose submit times are start times.
    The result is a trace like :func:`load_trace`'s: pass it to :func:`simulate`.
    """
    return _C.sim_load_swf(
        os.fspath(path),
        strict,
        _count(nodes, "nodes"),
        _count(procs_per_node, "procs_per_node"),
        bool(unknown_wait_is_zero),
    )


def _count(value: int | None, name: str) -> int:
    """``None`` -> 0 (C++'s "from the file"); otherwise a positive int."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name}: must be >= 1, got {value}")
    return value


def load_job_mix(path: PathLike, *, strict: bool = False) -> _C.JobMix:
    """Loads a job-mix CSV file (bad lines in ``mix.rejected`` unless ``strict``)."""
    return _C.sim_load_job_mix(os.fspath(path), strict)


def repeat_mix(
    mix: _C.JobMix | PathLike, copies: int, period: float | datetime.timedelta
) -> _C.JobMix:
    """A saturated regime: ``copies`` copies of ``mix``, copy *k* submitted *k* x ``period``
    later (seconds or ``timedelta``) and named ``"<name>~k"``. Bad values raise ``ValueError``."""
    if not isinstance(mix, _C.JobMix):
        mix = load_job_mix(mix)
    if isinstance(copies, bool) or not isinstance(copies, int):
        raise TypeError(f"copies: expected an int, got {copies!r}")
    return _C.sim_repeat_mix(mix, copies, _seconds(period, "period"))


def synthetic_job_mix(n: int, seed: int = 1, **ranges: Any) -> _C.JobMix:
    """Draws ``n`` jobs from ``seed``: the same ``(n, seed, ranges)`` always give the same mix.

    Jobs arrive as a Poisson process (``mean_interarrival_s``, first at ``first_submit``, Unix
    seconds) and have Amdahl-like curves ``r(n) = r1 * n / (1 + s * (n - 1))``. ``ranges``
    override the defaults of :class:`malletrain._C.SyntheticMixOptions` (which resemble
    ``jobs-imagenet-1001.csv``): ``min_nodes_lo``/``_hi``, ``max_nodes_lo``/``_hi``,
    ``rate_lo``/``_hi`` (r1, samples/s), ``serial_lo``/``_hi`` (s), ``work_hours_lo``/``_hi``
    (hours on one node), ``rescale_up_s_lo``/``_hi``, ``rescale_down_s_lo``/``_hi``. Bad values
    raise ``ValueError`` naming the option; unknown names raise ``TypeError``.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n: expected an int, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {seed!r}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed: must be in [0, 2**64), got {seed}")
    o = _C.SyntheticMixOptions()
    for name, value in ranges.items():
        if name.startswith("_") or not hasattr(o, name):
            raise TypeError(f"synthetic_job_mix() got an unexpected option {name!r}")
        setattr(o, name, value)
    return _C.sim_synthetic_job_mix(n, seed, o)


@dataclass
class SimulationResult:
    """What one replay produced, as plain records."""

    summary: dict[str, Any]
    jobs: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)

    def to_dataframes(self) -> dict[str, Any]:
        """``{"summary", "jobs", "timeline", "events"}`` as pandas data frames (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("to_dataframes() needs pandas: pip install pandas") from e
        return {
            "summary": pd.DataFrame([self.summary]),
            "jobs": pd.DataFrame(self.jobs),
            "timeline": pd.DataFrame(self.timeline),
            "events": pd.DataFrame(self.events, columns=list(EVENT_FIELDS)),
        }

    def write_csv(self, directory: PathLike) -> list[str]:
        """Writes ``summary.csv``, ``jobs.csv``, ``timeline.csv`` (and ``events.csv`` when events
        were recorded) into ``directory``; returns the paths written."""
        os.makedirs(directory, exist_ok=True)
        written = []
        tables = [
            ("summary.csv", [self.summary]),
            ("jobs.csv", self.jobs),
            ("timeline.csv", self.timeline),
        ]
        if self.events:
            tables.append(("events.csv", self.events))
        # One CSV cell per field: the summary's warnings joined.
        tables[0] = ("summary.csv", [{k: " | ".join(v) if isinstance(v, list) else v
                                      for k, v in self.summary.items()}])
        for name, rows in tables:
            path = os.path.join(os.fspath(directory), name)
            with open(path, "w", newline="") as f:
                if rows:
                    writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                    writer.writeheader()
                    writer.writerows(rows)
            written.append(path)
        return written


def _as_trace(trace: _C.IdleTrace | PathLike) -> _C.IdleTrace:
    """A loaded trace, or a path: ``*.swf`` / ``*.swf.gz`` through :func:`load_swf` (machine
    size from its header), anything else through :func:`load_trace`."""
    if isinstance(trace, _C.IdleTrace):
        return trace
    path = os.fspath(trace)
    if path.endswith((".swf", ".swf.gz")):
        return load_swf(path)
    return load_trace(path)


def _seconds(value: float | datetime.timedelta, name: str) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected seconds (float) or datetime.timedelta, got {value!r}")
    return float(value)


def simulate(
    trace: _C.IdleTrace | PathLike,
    mix: _C.JobMix | PathLike,
    *,
    policy: str = "dp",
    objective: str = "throughput",
    resize_cost: str = "bftrainer",
    accounting: str = "bftrainer",
    preemption_cost: str = "park",
    state_bytes: float | None = None,
    write_bytes_per_s: float | None = None,
    read_bytes_per_s: float | None = None,
    copy_bytes_per_s: float | None = None,
    park_fixed: float | datetime.timedelta | None = None,
    unpark_fixed: float | datetime.timedelta | None = None,
    snapshot_interval: float | datetime.timedelta = 0.0,
    snapshot_budget: float | None = None,
    curves: str = "oracle",
    forecast: str = "none",
    node_classes: str = "",
    cross_locality_factor: float = 1.0,
    reclaim_hazard: bool = False,
    resize_hysteresis: float = 1.0,
    rank_weights: float = 0.0,
    rank_aging: float | datetime.timedelta | None = None,
    forward_window: float | datetime.timedelta = 120.0,
    debounce: float | datetime.timedelta = 0.0,
    max_waiting: int = 64,
    learned_warmup: float | datetime.timedelta = 0.0,
    time_limit: float | datetime.timedelta = 1.0,
    skip_snapshots: int = 0,
    seed: int = 1,
    record_events: bool = False,
    timeline_step: float | datetime.timedelta = 600.0,
    progress: Callable[[float], None] | None = None,
) -> SimulationResult:
    """Replays ``trace`` with the jobs of ``mix`` under one allocation ``policy``.

    ``trace`` and ``mix`` are loaded objects (:func:`load_trace` or :func:`load_swf`,
    :func:`load_job_mix` or :func:`synthetic_job_mix`) or paths (a ``.swf``/``.swf.gz`` trace
    path is read as an SWF log). ``policy`` is one of ``milp``, ``dp``, ``greedy``, ``equal_share``, ``static``;
    ``curves="learned"`` hides the true scalability curves from the policy (it sees only what
    the job measured at the sizes it ran at), ``curves="linear"`` shows it no scalability
    information (every job linear from its rate at ``min_nodes``); ``forecast`` is ``none``,
    ``oracle``, ``estimated`` or ``reservation`` (a reclaim is known from the submit of the job
    that makes it, as SWF logs give it). ``node_classes`` (``"id:locality:speed:share,..."``,
    e.g. ``"fast:r0:1:0.5,slow:r1:0.85:0.5"``; empty: one class) splits the trace's nodes, in
    their order, into contiguous blocks of those classes: a job trains at its curve's rate times
    the smallest speed among its nodes, times ``cross_locality_factor`` when they span locality
    groups, and the policies see the classes as pools. ``reclaim_hazard=True`` tells the policy the machine's
    reclaim rate so far, so that it prices the forced shrinks more nodes risk;
    ``resize_hysteresis`` (>= 1) makes it charge every resize that many times its pause.
    ``rank_weights`` (>= 0; 0 = off) multiplies each job's value by rank^rank_weights, rank 1
    for the job with the most work left: with ``objective="speedup"`` and 1, the setting that
    won on the figures users feel in docs/benchmarks.md. ``rank_aging`` (seconds or a
    timedelta, > 0; None = off; only with rank weights) ranks a job's work left as
    work / (1 + age / rank_aging), its age counted from its submit, so that no job stays ranked
    last: it cut the longest completion times in docs/benchmarks.md ("Aging").
    ``objective`` is ``throughput``, ``speedup``, ``weighted`` or ``completion`` (work as a
    share of the work left: the value of finishing). ``accounting="bftrainer"`` charges a
    resize as BFTrainer's replayer does
    (old rate x pause); ``"pause"`` stops the job for the pause. ``preemption_cost`` is what a
    stop (a preemption or a policy stop) costs: ``"park"`` (the default, the live system with a
    park store: park + unpark time of ``state_bytes`` at ``write_bytes_per_s`` /
    ``read_bytes_per_s`` plus ``park_fixed`` / ``unpark_fixed``), ``"snapshot"`` (back to the
    last snapshot, every ``snapshot_interval`` or adaptive to ``snapshot_budget``, copies at
    ``copy_bytes_per_s``), ``"restart"`` (all progress lost) or ``"free"`` (BFTrainer's
    replayer); None keeps the C++ defaults (docs/simulator.md). ``progress`` is called with the
    fraction done (0..1). Bad options raise ``ValueError`` naming the option.
    """
    trace = _as_trace(trace)
    if not isinstance(mix, _C.JobMix):
        mix = load_job_mix(mix)
    o = _C.SimOptions()
    o.policy = policy
    o.objective = objective
    o.resize_cost = resize_cost
    o.accounting = accounting
    o.preemption_cost = preemption_cost
    for name, value in (("state_bytes", state_bytes), ("write_bytes_per_s", write_bytes_per_s),
                        ("read_bytes_per_s", read_bytes_per_s),
                        ("copy_bytes_per_s", copy_bytes_per_s),
                        ("snapshot_budget", snapshot_budget)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: expected a number, got {value!r}")
        setattr(o, name, float(value))
    if park_fixed is not None:
        o.park_fixed_s = _seconds(park_fixed, "park_fixed")
    if unpark_fixed is not None:
        o.unpark_fixed_s = _seconds(unpark_fixed, "unpark_fixed")
    o.snapshot_interval_s = _seconds(snapshot_interval, "snapshot_interval")
    o.curves = curves
    o.forecast = forecast
    if not isinstance(node_classes, str):
        raise TypeError(f"node_classes: expected a string, got {node_classes!r}")
    o.node_classes = node_classes
    if (isinstance(cross_locality_factor, bool)
            or not isinstance(cross_locality_factor, (int, float))):
        raise TypeError(
            f"cross_locality_factor: expected a number, got {cross_locality_factor!r}")
    o.cross_locality_factor = float(cross_locality_factor)
    if not isinstance(reclaim_hazard, bool):
        raise TypeError(f"reclaim_hazard: expected a bool, got {reclaim_hazard!r}")
    o.reclaim_hazard = reclaim_hazard
    if isinstance(resize_hysteresis, bool) or not isinstance(resize_hysteresis, (int, float)):
        raise TypeError(f"resize_hysteresis: expected a number, got {resize_hysteresis!r}")
    o.resize_hysteresis = float(resize_hysteresis)
    if isinstance(rank_weights, bool) or not isinstance(rank_weights, (int, float)):
        raise TypeError(f"rank_weights: expected a number, got {rank_weights!r}")
    o.rank_weight_exponent = float(rank_weights)
    if rank_aging is not None:
        o.rank_aging_s = _seconds(rank_aging, "rank_aging")
    o.forward_window_s = _seconds(forward_window, "forward_window")
    o.debounce_s = _seconds(debounce, "debounce")
    o.max_waiting = int(max_waiting)
    o.learned_warmup_s = _seconds(learned_warmup, "learned_warmup")
    o.time_limit_s = _seconds(time_limit, "time_limit")
    o.skip_snapshots = int(skip_snapshots)
    o.seed = int(seed)
    o.record_events = bool(record_events)
    o.timeline_step_s = _seconds(timeline_step, "timeline_step")
    raw = _C.sim_run(trace, mix, o, progress)
    return SimulationResult(
        summary=raw["summary"],
        jobs=raw["jobs"],
        timeline=[dict(zip(TIMELINE_FIELDS, t)) for t in raw["timeline"]],
        events=[dict(zip(EVENT_FIELDS, e)) for e in raw["events"]],
    )


def compare(
    trace: _C.IdleTrace | PathLike,
    mix: _C.JobMix | PathLike,
    policies: Iterable[str] = ("milp", "dp", "greedy", "equal_share", "static"),
    **options: Any,
) -> list[SimulationResult]:
    """Runs :func:`simulate` once per policy on the same inputs (loaded once)."""
    trace = _as_trace(trace)
    if not isinstance(mix, _C.JobMix):
        mix = load_job_mix(mix)
    return [simulate(trace, mix, policy=p, **options) for p in policies]


def summary_table(results: Sequence[SimulationResult]) -> str:
    """A fixed-width text table of the summaries, one row per policy, every column with its
    unit, then the summaries' warnings (results that cannot be right or say little)."""
    hour = 1 / 3600
    cols = [
        # (header, key, format, scale, width)
        ("policy", "policy", "{}", None, 11),
        ("samples", "samples_trained", "{:.4g}", None, 10),
        ("samples/node-h", "samples_per_node_hour", "{:.4g}", None, 14),
        ("idle node-h", "idle_node_hours", "{:.1f}", None, 11),
        ("used node-h", "used_node_hours", "{:.1f}", None, 11),
        ("util %", "utilisation", "{:.1%}", None, 7),
        ("util active %", "active_utilisation", "{:.1%}", None, 13),
        ("contended %", "contended_fraction", "{:.1%}", None, 11),
        ("eff %", "efficiency", "{:.1%}", None, 6),
        ("finished", "jobs_finished", "{}", None, 8),
        ("resizes", "resizes", "{}", None, 7),
        ("preempt", "preemptions", "{}", None, 7),
        ("stops", "stops", "{}", None, 5),
        # Samples lost to preemptions (stops), by the --preemption-cost mode.
        ("lost samples", "lost_to_preemptions", "{:.4g}", None, 12),
        ("dec p50 ms", "decision_p50_ms", "{:.2f}", None, 10),
        ("dec p99 ms", "decision_p99_ms", "{:.2f}", None, 10),
        ("JCT mean h", "jct_mean_s", "{:.2f}", hour, 10),
        ("JCT median h", "jct_median_s", "{:.2f}", hour, 12),
        ("JCT p95 h", "jct_p95_s", "{:.2f}", hour, 9),
        ("JCT max h", "jct_max_s", "{:.2f}", hour, 9),
        ("makespan h", "makespan_s", "{:.2f}", hour, 10),
        ("wall s", "wall_s", "{:.1f}", None, 7),
    ]

    def cell(summary: dict, key: str, fmt: str, scale: float | None) -> str:
        value = summary.get(key)
        if isinstance(value, float) and math.isnan(value):
            return "-"
        if scale is not None:
            value = value * scale
        return fmt.format(value)

    header = "  ".join(name.rjust(w) for name, _, _, _, w in cols)
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append("  ".join(cell(r.summary, key, fmt, scale).rjust(w)
                               for _, key, fmt, scale, w in cols))
    costs = sorted({r.summary["preemption_cost"] for r in results
                    if r.summary.get("preemption_cost")})
    lines.extend(f"preemption cost: {c}" for c in costs)
    warnings = [(r.summary["policy"], w) for r in results for w in r.summary.get("warnings", [])]
    if warnings:
        lines.append("")
        lines.extend(f"WARNING ({policy}): {w}" for policy, w in warnings)
    return "\n".join(lines)


USER_FIGURES = ("samples/nh", "JCT mean", "JCT p95", "eff")


def worse_figures(ours: SimulationResult, base: SimulationResult) -> list[str]:
    """The figures users feel (samples per node-hour, mean and p95 JCT, efficiency: the names
    in :data:`USER_FIGURES`) on which ``ours`` is worse than ``base``, two replays of the same
    jobs. A figure ours lacks (NaN: no job finished) is worse."""
    return _C.sim_worse_user_figures(ours.summary, base.summary)


def dominated(ours: SimulationResult, base: SimulationResult) -> bool:
    """Whether ``base`` is at least as good as ``ours`` on every figure users feel and better on
    one. No policy can be at least as good as every other on all four in general (a faster mean
    JCT can need jobs on less efficient sizes; docs/simulator.md), so "dominated by none" is the
    verdict to look for."""
    return _C.sim_dominated_on_user_figures(ours.summary, base.summary)


def dominance_table(results: Sequence[SimulationResult]) -> str:
    """For each replay (same jobs, same trace, different policies): the policies that dominate
    it on the figures users feel, and those on which it is better than each other policy."""
    lines = [f"dominated? (by a policy at least as good on {', '.join(USER_FIGURES)} and "
             "better on one)"]
    for r in results:
        name = r.summary["policy"]
        others = [o for o in results if o is not r]
        by = [o.summary["policy"] for o in others if dominated(r, o)]
        better = [f"{o.summary['policy']}: {', '.join(worse_figures(o, r)) or '-'}"
                  for o in others]
        verdict = f"by {', '.join(by)}" if by else "no"
        lines.append(f"  {name:<11} {verdict:<24} better than {'; '.join(better)}")
    return "\n".join(lines)


PLOTS_MISSING = ("plots need matplotlib, which is not installed: "
                 "pip install 'malletrain[plots]' (or pip install matplotlib)")


def plots_available() -> bool:
    """Whether the plot functions can run (matplotlib, the ``plots`` extra, is installed)."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        raise ImportError(PLOTS_MISSING) from e

    matplotlib.use("Agg")  # files only; works without a display
    import matplotlib.pyplot as plt

    return plt


def _datetime(unix_s: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)


def plot_utilisation(result: SimulationResult, path: PathLike) -> None:
    """Idle nodes offered and nodes used over time (PNG)."""
    plt = _pyplot()
    t = [_datetime(s["time"]) for s in result.timeline]
    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.fill_between(t, [s["idle_nodes"] for s in result.timeline], step="post", alpha=0.3,
                    label="idle nodes offered")
    ax.step(t, [s["used_nodes"] for s in result.timeline], where="post", lw=0.8,
            label="used by jobs")
    ax.set_ylabel("nodes")
    ax.set_title(f"Utilisation of idle nodes ({result.summary['policy']})")
    ax.legend(loc="upper right")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=120)
    plt.close(fig)


def plot_gantt(result: SimulationResult, path: PathLike, max_jobs: int = 60) -> None:
    """Per-job life lines (submit to finish, running part highlighted) for the first jobs."""
    plt = _pyplot()
    jobs = result.jobs[:max_jobs]
    fig, ax = plt.subplots(figsize=(10, 0.15 * len(jobs) + 1.5))
    end = max((s["time"] for s in result.timeline), default=0.0)
    for i, j in enumerate(jobs):
        finish = j["finish"] if j["finish"] >= 0 else end
        ax.hlines(i, _datetime(j["submit"]), _datetime(finish), color="0.8", lw=3)
        if j["first_start"] >= 0:
            ax.hlines(i, _datetime(j["first_start"]), _datetime(finish), color="C0", lw=3)
    ax.set_yticks(range(len(jobs)))
    ax.set_yticklabels([j["name"] for j in jobs], fontsize=5)
    ax.invert_yaxis()
    ax.set_title(f"Jobs: waiting (grey) and running until done (blue), {result.summary['policy']}")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=120)
    plt.close(fig)


def plot_policy_comparison(results: Sequence[SimulationResult], path: PathLike) -> None:
    """Bars of samples trained, efficiency and utilisation per policy (PNG)."""
    plt = _pyplot()
    names = [r.summary["policy"] for r in results]
    metrics = [("samples_trained", "samples trained"), ("efficiency", "efficiency"),
               ("utilisation", "utilisation of idle nodes")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(12, 3.5))
    for ax, (key, label) in zip(axes, metrics):
        ax.bar(names, [r.summary[key] for r in results], color="C0")
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=120)
    plt.close(fig)
