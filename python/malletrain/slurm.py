"""Harvesting idle nodes from a Slurm cluster: node agents as preemptible batch jobs.

A :class:`Harvester` keeps ``slots`` agent jobs submitted to a low-priority partition (one per
node, or one per CPU slot on a shared host). Each job's batch script ``exec``\\s ``malle-agent``,
which offers its node (named after the job: ``slurm-<job id>-<restart count>``) to the shared
allocator. When higher-priority work preempts an agent job, Slurm signals the batch shell (the
agent) with SIGTERM at the start of the partition's ``GraceTime`` (the job is submitted with
``--signal=B:TERM`` and the site sets ``SlurmctldParameters=preempt_send_user_signal``); the
agent makes its rank leave at the next step boundary before the grace time is over, then exits.
The harvester notices that the job is gone and submits a new one, which Slurm starts when the
nodes are free again. Every agent is told how long its node is expected to stay idle
(``--idle_until``), read from Slurm's own forecast: the expected start of pending jobs of
higher-priority partitions on the partition's nodes (``squeue --start``), reservations on those
nodes (``scontrol show reservation``) and the agent job's time limit::

    from malletrain.slurm import Harvester, HarvestOptions

    h = Harvester(HarvestOptions(store="10.0.0.5:29400", secret="/shared/malle/secret",
                                 slots=8, partition="scavenger", per="node"))
    h.start()          # a background thread polls squeue every options.poll seconds
    ...
    h.stop()           # TERM to every agent job (their ranks leave), then scancel

The Slurm commands (``sbatch``, ``squeue``, ``scontrol``, ``scancel``) are run as programs with a
timeout; a failure or a timeout raises :class:`SlurmCommandError` naming the command, its exit
status and what it printed. Their output is parsed by pure functions
(:func:`parse_squeue_start`, :func:`parse_reservations`, :func:`parse_partitions`,
:func:`parse_agent_jobs`) that raise :class:`~malletrain.errors.MalleValueError` naming the line
and the field of anything they do not understand; the decisions (:func:`forecast_idle_until`,
:func:`slots_to_submit`) are pure functions of (state, now, options) that return a reason.

Thread safety: a Harvester's public methods may be called from any thread; its poll loop runs in
one thread of its own. docs/slurm.md explains the deployment (partitions, GraceTime, secret).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from malletrain.errors import MalleValueError, SlurmCommandError

log = logging.getLogger("malletrain.slurm")

__all__ = [
    "SlurmCommandError", "PendingJob", "Reservation", "Partition", "AgentJob", "Forecast",
    "parse_slurm_time", "expand_hostlist", "parse_squeue_start", "parse_reservations",
    "parse_partitions", "parse_agent_jobs", "forecast_idle_until", "slots_to_submit",
    "SlurmCommands", "HarvestOptions", "Harvester", "add_slurm_parser",
]

# Job states in which an agent job holds, or waits for, a slot (squeue's %T).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING",
                           "STAGE_OUT", "STOPPED"})
# Ending: the slot is being freed; a replacement is submitted once the job is gone.
ENDING_STATES = frozenset({"COMPLETING"})
KNOWN_STATES = ACTIVE_STATES | ENDING_STATES | frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "RESV_DEL_HOLD", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"})
# Pending reasons that only mean "waiting for free resources".
_ROUTINE_PENDING = frozenset({"None", "Priority", "Resources", "submitted", "BeginTime"})
_UNKNOWN_TIMES = frozenset({"", "N/A", "n/a", "Unknown", "UNKNOWN", "None", "(null)", "NONE"})
_SEP = "|"


# --- parsing (pure) ---------------------------------------------------------------------------

def parse_slurm_time(text: str, *, what: str = "time") -> Optional[float]:
    """A Slurm timestamp (``2026-11-22T23:10:52``, local time as the commands print it) as unix
    seconds; None for ``N/A``, ``Unknown``, ``None`` and the like. Raises MalleValueError naming
    ``what`` for anything else."""
    t = text.strip()
    if t in _UNKNOWN_TIMES:
        return None
    try:
        return time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        raise MalleValueError(f"{what}: expected YYYY-MM-DDTHH:MM:SS or N/A, got {text!r}") \
            from None


def _split_top_level(text: str) -> List[str]:
    parts, depth, cur = [], 0, []
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise MalleValueError(f"hostlist: unbalanced ']' in {text!r}")
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if depth != 0:
        raise MalleValueError(f"hostlist: unbalanced '[' in {text!r}")
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(name: str, whole: str) -> List[str]:
    m = re.search(r"\[([^\[\]]*)\]", name)
    if m is None:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise MalleValueError(f"hostlist: not a host name: {name!r} (in {whole!r})")
        return [name]
    head, tail = name[:m.start()], name[m.end():]
    out = []
    for item in m.group(1).split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise MalleValueError(f"hostlist: bad range {item!r} in {whole!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b - a > 100000:
            raise MalleValueError(f"hostlist: bad range {item!r} in {whole!r}")
        width = len(lo)
        for i in range(a, b + 1):
            out.extend(_expand_one(f"{head}{i:0{width}d}{tail}", whole))
    return out


def expand_hostlist(text: str) -> List[str]:
    """``node[01-03,7],login`` -> ``['node01', 'node02', 'node03', 'node7', 'login']``; empty
    list for ``''``, ``(null)``, ``None``. Raises MalleValueError for a malformed list."""
    t = text.strip()
    if t in ("", "(null)", "None", "N/A", "n/a"):
        return []
    out: List[str] = []
    for part in _split_top_level(t):
        out.extend(_expand_one(part, t))
    return out


@dataclass(frozen=True)
class PendingJob:
    """A pending job as ``squeue --start`` forecasts it."""

    job_id: str
    name: str
    partitions: Tuple[str, ...]
    start: Optional[float]        # expected start, unix seconds; None: not forecast
    nodes: Tuple[str, ...]        # the nodes it is planned on (SCHEDNODES); () unknown


@dataclass(frozen=True)
class Reservation:
    """A reservation from ``scontrol show reservation``."""

    name: str
    start: float
    end: float
    nodes: Tuple[str, ...]
    flags: str = ""


@dataclass(frozen=True)
class Partition:
    """The fields of ``scontrol show partition`` the harvester uses."""

    name: str
    priority_tier: int
    grace_time: int               # seconds
    preempt_mode: str
    nodes: Tuple[str, ...]
    state: str = "UP"


@dataclass(frozen=True)
class AgentJob:
    """One of the harvester's agent jobs as squeue shows it."""

    job_id: str
    state: str
    reason: str
    nodes: Tuple[str, ...]
    start: Optional[float]


# The squeue formats the parsers below expect (fields separated by _SEP).
SQUEUE_START_FORMAT = _SEP.join(["%i", "%j", "%P", "%S", "%Y"])
SQUEUE_AGENT_FORMAT = _SEP.join(["%i", "%T", "%r", "%N", "%S"])


def _fields(line: str, lineno: int, n: int, what: str) -> List[str]:
    parts = line.split(_SEP)
    if len(parts) != n:
        raise MalleValueError(f"{what}: line {lineno}: expected {n} fields separated by "
                              f"{_SEP!r}, got {len(parts)}: {line!r}")
    return [p.strip() for p in parts]


def _job_id(text: str, lineno: int, what: str) -> str:
    if not re.fullmatch(r"\d+(_\d+|_\[[^\]]*\])?(\+\d+)?", text):
        raise MalleValueError(f"{what}: line {lineno}: job id: not a Slurm job id: {text!r}")
    return text


def parse_squeue_start(text: str) -> List[PendingJob]:
    """Parses ``squeue --start -h -t PENDING -o SQUEUE_START_FORMAT`` (job id, name,
    partitions, expected start, planned nodes). Raises MalleValueError naming the line and the
    field of a line it cannot read."""
    jobs = []
    what = "squeue --start"
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        job_id, name, parts, start, nodes = _fields(line, lineno, 5, what)
        _job_id(job_id, lineno, what)
        if not parts:
            raise MalleValueError(f"{what}: line {lineno}: partition: empty")
        st = parse_slurm_time(start, what=f"{what}: line {lineno}: start time")
        try:
            hosts = tuple(expand_hostlist(nodes))
        except MalleValueError as e:
            raise MalleValueError(f"{what}: line {lineno}: nodes: {e}") from None
        jobs.append(PendingJob(job_id, name, tuple(p for p in parts.split(",") if p), st, hosts))
    return jobs


def _key_values(line: str) -> Dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:]*)=(\S*)",
                                                        line)}


def _require(kv: Mapping[str, str], key: str, where: str) -> str:
    if key not in kv:
        raise MalleValueError(f"{where}: field {key} missing")
    return kv[key]


def parse_reservations(text: str) -> List[Reservation]:
    """Parses ``scontrol -o show reservation`` (one reservation a line, ``Key=Value`` fields);
    ``No reservations in the system`` is an empty list. Raises MalleValueError naming the line
    and the field of a line it cannot read."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.lower().startswith("no reservations"):
            continue
        where = f"scontrol show reservation: line {lineno}"
        kv = _key_values(s)
        name = _require(kv, "ReservationName", where)
        start = parse_slurm_time(_require(kv, "StartTime", where), what=f"{where}: StartTime")
        end = parse_slurm_time(_require(kv, "EndTime", where), what=f"{where}: EndTime")
        if start is None or end is None:
            raise MalleValueError(f"{where}: reservation {name} has no start or end time")
        nodes = tuple(expand_hostlist(kv.get("Nodes", "")))
        out.append(Reservation(name, start, end, nodes, kv.get("Flags", "")))
    return out


def parse_partitions(text: str) -> List[Partition]:
    """Parses ``scontrol -o show partition``. Raises MalleValueError naming the line and the
    field of a line it cannot read."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s:
            continue
        where = f"scontrol show partition: line {lineno}"
        kv = _key_values(s)
        name = _require(kv, "PartitionName", where)
        ints = {}
        for key in ("PriorityTier", "GraceTime"):
            v = _require(kv, key, where)
            if not v.isdigit():
                raise MalleValueError(f"{where}: {key}: expected a non-negative integer, got {v!r}")
            ints[key] = int(v)
        out.append(Partition(name, ints["PriorityTier"], ints["GraceTime"],
                             kv.get("PreemptMode", "OFF"),
                             tuple(expand_hostlist(kv.get("Nodes", ""))), kv.get("State", "UP")))
    return out


def parse_agent_jobs(text: str) -> List[AgentJob]:
    """Parses ``squeue -h -o SQUEUE_AGENT_FORMAT`` (job id, state, reason, nodes, start).
    Raises MalleValueError naming the line and the field of a line it cannot read."""
    out = []
    what = "squeue"
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        job_id, state, reason, nodes, start = _fields(line, lineno, 5, what)
        _job_id(job_id, lineno, what)
        if state not in KNOWN_STATES:
            raise MalleValueError(f"{what}: line {lineno}: state: unknown job state {state!r}")
        try:
            hosts = tuple(expand_hostlist(nodes))
        except MalleValueError as e:
            raise MalleValueError(f"{what}: line {lineno}: nodes: {e}") from None
        out.append(AgentJob(job_id, state, reason, hosts,
                            parse_slurm_time(start, what=f"{what}: line {lineno}: start time")))
    return out


# --- decisions (pure) -------------------------------------------------------------------------

@dataclass(frozen=True)
class Forecast:
    """When the harvested nodes are expected to be wanted back, and why."""

    idle_until: Optional[float]   # unix seconds; None: no end in sight
    reason: str


def forecast_idle_until(partition: str, partitions: Iterable[Partition],
                        pending: Iterable[PendingJob], reservations: Iterable[Reservation],
                        now: float, *, time_limit: Optional[float] = None) -> Forecast:
    """The expected end of the idle window of ``partition``'s nodes: the earliest of

    - the expected start of a pending job of a partition with a higher PriorityTier (one that
      may preempt ours) that is planned on one of our nodes (or not yet placed, but its
      partition shares a node with ours),
    - the start of a reservation on one of our nodes that has not begun,
    - ``now + time_limit`` (the agent job's own time limit, seconds), if given.

    Conservative on purpose: with several nodes the earliest claim on any of them is the
    forecast of all, since a batch job does not know its node before it starts. Raises
    MalleValueError if ``partition`` is not among ``partitions``."""
    parts = {p.name: p for p in partitions}
    ours = parts.get(partition)
    if ours is None:
        raise MalleValueError(f"partition: {partition!r} is not one of {sorted(parts)}")
    our_nodes = set(ours.nodes)
    best: Optional[Tuple[float, str]] = None

    def consider(t: float, why: str) -> None:
        nonlocal best
        t = max(t, now)
        if best is None or t < best[0]:
            best = (t, why)

    for j in pending:
        if j.start is None:
            continue
        tiers = [parts[p] for p in j.partitions if p in parts]
        preemptors = [p for p in tiers
                      if p.priority_tier > ours.priority_tier and our_nodes & set(p.nodes)]
        if not preemptors:
            continue
        if j.nodes and not our_nodes & set(j.nodes):
            continue
        consider(j.start, f"job {j.job_id} ({','.join(j.partitions)}) is expected to start at "
                          f"{_fmt(j.start)}")
    for r in reservations:
        if r.start <= now or not our_nodes & set(r.nodes):
            continue
        consider(r.start, f"reservation {r.name} starts at {_fmt(r.start)}")
    if time_limit is not None:
        consider(now + time_limit, f"the agent job's time limit ({time_limit:g} s)")
    if best is None:
        return Forecast(None, f"no pending higher-priority job, reservation or time limit on "
                              f"partition {partition}'s nodes")
    return Forecast(best[0], best[1])


def slots_to_submit(jobs: Sequence[AgentJob], slots: int, now: float, *,
                    not_before: float = 0.0, forecast: Optional[Forecast] = None,
                    min_window: float = 0.0) -> Tuple[int, str]:
    """How many agent jobs to submit now so that ``slots`` are held or waited for, and why.
    Jobs that are still ending (COMPLETING) count: their slot is not free yet. ``not_before``
    (a backoff after agents that ended early) defers every submission, and so does a
    ``forecast`` whose idle window is shorter than ``min_window`` seconds: the nodes are about
    to be claimed (typically by the very job that preempted an agent, still pending until the
    agent's slot is free), and an agent submitted now would be told its node is worthless.
    Once that job has started, its claim leaves the forecast and the agent is submitted; Slurm
    starts it when the nodes free up."""
    held = sum(1 for j in jobs if j.state in ACTIVE_STATES or j.state in ENDING_STATES)
    missing = max(0, slots - held)
    if missing == 0:
        return 0, f"{held} agent jobs for {slots} slots"
    if now < not_before:
        return 0, f"{missing} missing, backing off for {not_before - now:.0f} s more"
    if forecast is not None and forecast.idle_until is not None and \
            forecast.idle_until - now < min_window:
        return 0, (f"{missing} missing, waiting: idle window {forecast.idle_until - now:.0f} s < "
                   f"{min_window:g} s ({forecast.reason})")
    return missing, f"{held} agent jobs for {slots} slots: submitting {missing}"


def _fmt(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


# --- the commands -----------------------------------------------------------------------------

class SlurmCommands:
    """Runs the Slurm commands with a timeout each. ``env``: their environment (default this
    process's; e.g. with ``SLURM_CONF``). Every method blocks for at most ``timeout`` seconds and
    raises SlurmCommandError (not installed, exit status not 0, timed out) or MalleValueError
    (output it cannot parse)."""

    def __init__(self, env: Optional[Mapping[str, str]] = None, timeout: float = 30.0) -> None:
        self.env = dict(os.environ if env is None else env)
        self.timeout = float(timeout)

    def run(self, argv: Sequence[str], *, stdin: Optional[str] = None,
            timeout: Optional[float] = None) -> str:
        timeout = self.timeout if timeout is None else timeout
        cmd = " ".join(shlex.quote(a) for a in argv)
        try:
            r = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                               env=self.env, timeout=timeout)
        except FileNotFoundError:
            raise SlurmCommandError(f"{argv[0]}: not found on PATH; is the Slurm client "
                                    f"installed (Debian: slurm-client)?", argv) from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(f"`{cmd}` gave no answer within {timeout:g} s (is slurmctld "
                                    f"up and reachable?)", argv) from None
        if r.returncode != 0:
            out = (r.stderr.strip() or r.stdout.strip() or "(no output)")[-1500:]
            raise SlurmCommandError(f"`{cmd}` failed (exit {r.returncode}): {out}", argv,
                                    r.returncode)
        return r.stdout

    def partitions(self) -> List[Partition]:
        return parse_partitions(self.run(["scontrol", "-o", "show", "partition"]))

    def reservations(self) -> List[Reservation]:
        return parse_reservations(self.run(["scontrol", "-o", "show", "reservation"]))

    def pending_start(self) -> List[PendingJob]:
        return parse_squeue_start(self.run(["squeue", "--start", "-h", "-t", "PENDING",
                                            "-o", SQUEUE_START_FORMAT]))

    def agent_jobs(self, job_name: str, user: Optional[str] = None) -> List[AgentJob]:
        user = user or str(os.getuid())
        return parse_agent_jobs(self.run(["squeue", "-h", "-n", job_name, "-u", user,
                                          "-o", SQUEUE_AGENT_FORMAT]))

    def sbatch(self, args: Sequence[str], script: str) -> str:
        """Submits ``script`` (given on stdin); returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], stdin=script).strip()
        job_id = out.split(";")[0].strip()
        if not job_id.isdigit():
            raise SlurmCommandError(f"sbatch --parsable printed {out!r}, not a job id",
                                    ["sbatch", *args])
        return job_id

    def scancel(self, job_ids: Sequence[str], *, signal: Optional[str] = None,
                batch: bool = False) -> None:
        if not job_ids:
            return
        args = ["scancel"]
        if signal:
            args.append(f"--signal={signal}")
        if batch:
            args.append("--batch")
        self.run([*args, *job_ids])

    def forecast(self, partition: str, now: Optional[float] = None, *,
                 time_limit: Optional[float] = None) -> Forecast:
        """Queries Slurm and returns :func:`forecast_idle_until` for ``partition``."""
        now = time.time() if now is None else now
        return forecast_idle_until(partition, self.partitions(), self.pending_start(),
                                   self.reservations(), now, time_limit=time_limit)


# --- the harvester ----------------------------------------------------------------------------

@dataclass
class HarvestOptions:
    """What the harvester submits.

    Attributes:
        store: the control store, HOST:PORT, as the agents on the compute nodes reach it.
        secret: the shared secret file; must be readable on the compute nodes (docs/slurm.md).
        slots: agent jobs to keep submitted (running or pending).
        partition: the low-priority (preemptible) partition.
        per: ``node`` (one agent per whole node, ``--exclusive``) or ``cpu`` (one agent per
            ``cpus_per_slot`` CPUs; several per node).
        cpus_per_slot: CPUs of one slot when ``per == "cpu"``.
        grace: seconds the agent gives its rank to leave after the preemption signal (default:
            the partition's GraceTime, which must then not be 0).
        time_limit: the agent jobs' ``--time``, seconds (None: the partition's default).
        job_name: the agent jobs' name; the harvester adopts running jobs of this name and user.
        node_prefix: node names are ``<prefix>-<job id>-<restart count>``.
        group, speed: the agents' locality group and relative speed.
        log_dir: agent job output (``agent-<job id>.log``) and rank logs; must exist on the
            compute nodes (default: Slurm's default, the submit directory).
        park_dir: the jobs' park stores (``<park_dir>/<job>``, ``malle-agent --park_dir``):
            where a job whose last slot is preempted parks its state, to resume at the same
            step on the next slots; must be a shared file system the compute nodes reach
            (default: none, such a job starts over).
        qos, account: passed to sbatch if given.
        sbatch_args: more sbatch arguments, as given.
        poll: seconds between two looks at the queue.
        min_window: seconds; no agent is submitted while the forecast idle window is shorter
            (see :func:`slots_to_submit`). Must be less than ``time_limit``.
        min_lifetime: an agent job that ends sooner than this after it started counts as a
            failure; consecutive failures back off the next submission (2 s doubling to 5 min).
        agent: the malle-agent program as seen on the compute nodes (default: this package's).
        command_timeout: seconds each Slurm command may take.
        zygote_python: warm rank starts (docs/operations.md, "Warm rank starts"): the Python
            interpreter, as seen on the compute nodes, whose zygote each agent starts; the
            agent offers its node once the zygote has imported ``zygote_preload`` and forks
            the ranks from it (default: none, every rank starts a new interpreter).
        zygote_preload: the modules the zygote imports, comma-separated (default: the
            agent's, torch, torch._dynamo and malletrain).
    """

    store: str
    secret: str
    slots: int
    partition: str = "scavenger"
    per: str = "node"
    cpus_per_slot: int = 1
    grace: Optional[float] = None
    time_limit: Optional[float] = None
    job_name: str = "malle-agent"
    node_prefix: str = "slurm"
    group: str = "default"
    speed: float = 1.0
    log_dir: Optional[str] = None
    park_dir: Optional[str] = None
    qos: Optional[str] = None
    account: Optional[str] = None
    sbatch_args: List[str] = field(default_factory=list)
    poll: float = 2.0
    min_window: float = 60.0
    min_lifetime: float = 10.0
    agent: Optional[str] = None
    command_timeout: float = 30.0
    zygote_python: Optional[str] = None
    zygote_preload: Optional[str] = None

    def validate(self) -> None:
        """Raises MalleValueError naming the first invalid field."""
        host, sep, port = self.store.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise MalleValueError(f"store: expected HOST:PORT, got {self.store!r}")
        if not self.secret:
            raise MalleValueError("secret: the shared secret file is required")
        if not isinstance(self.slots, int) or not 1 <= self.slots <= 100000:
            raise MalleValueError(f"slots: must be an integer in [1, 100000], got {self.slots!r}")
        if self.per not in ("node", "cpu"):
            raise MalleValueError(f"per: 'node' or 'cpu', got {self.per!r}")
        if not 1 <= self.cpus_per_slot <= 4096:
            raise MalleValueError(f"cpus_per_slot: must be in [1, 4096], got {self.cpus_per_slot}")
        for name in ("grace", "time_limit"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and 0 < v <= 3600 * 24 * 365):
                raise MalleValueError(f"{name}: must be a positive number of seconds, got {v!r}")
        if self.grace is not None and self.grace > 3600:
            raise MalleValueError(f"grace: must be at most 3600 s (the agent's limit), "
                                  f"got {self.grace:g}")
        for name in ("job_name", "node_prefix", "group", "partition"):
            v = getattr(self, name)
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", v or ""):
                raise MalleValueError(f"{name}: 1-64 of [A-Za-z0-9._-], got {v!r}")
        if not (math.isfinite(self.poll) and 0.1 <= self.poll <= 600):
            raise MalleValueError(f"poll: must be in [0.1, 600] s, got {self.poll!r}")
        if not (math.isfinite(self.min_window) and self.min_window >= 0):
            raise MalleValueError(f"min_window: must be >= 0 s, got {self.min_window!r}")
        if self.time_limit is not None and self.min_window >= self.time_limit:
            raise MalleValueError(f"min_window: {self.min_window:g} s must be less than "
                                  f"time_limit ({self.time_limit:g} s), or no agent is ever "
                                  f"submitted")
        if not 0 < self.speed <= 100:
            raise MalleValueError(f"speed: must be in (0, 100], got {self.speed!r}")


class Harvester:
    """Keeps ``options.slots`` agent jobs submitted (see the module doc).

    ``commands``: the SlurmCommands to use (its environment selects the cluster). Construction
    does no I/O; :meth:`check` and :meth:`poll_once` talk to Slurm."""

    _MAX_BACKOFF = 300.0

    def __init__(self, options: HarvestOptions, commands: Optional[SlurmCommands] = None) -> None:
        options.validate()
        self.options = options
        self.commands = commands or SlurmCommands(timeout=options.command_timeout)
        self.events: List[str] = []           # what it did, with times (the last 1000)
        self.event_count = 0                  # events ever noted (for events_since)
        self._pending_why: Dict[str, str] = {}
        self.last_error: Optional[str] = None
        self.submitted: Dict[str, float] = {}  # job id -> when submitted (unix seconds)
        self._started: Dict[str, float] = {}   # job id -> first seen running
        self._known: Dict[str, AgentJob] = {}
        self._failures = 0
        self._not_before = 0.0
        self._waiting = False
        self._grace: Optional[float] = options.grace
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._agent = options.agent

    # --- setup ------------------------------------------------------------------------------
    def check(self) -> Partition:
        """Reads the partition's setup; fills in the grace time from its GraceTime. Raises
        SlurmCommandError if Slurm cannot be asked, MalleValueError if the partition is missing
        or cannot preempt gracefully. Blocks for at most one command timeout."""
        parts = {p.name: p for p in self.commands.partitions()}
        p = parts.get(self.options.partition)
        if p is None:
            raise MalleValueError(f"partition: {self.options.partition!r} does not exist in this "
                                  f"cluster (it has {sorted(parts)})")
        if self._grace is None:
            if p.grace_time <= 0:
                raise MalleValueError(
                    f"partition {p.name} has GraceTime=0: a preempted agent's rank would be "
                    f"killed without a chance to leave; ask the admin for a GraceTime (docs/"
                    f"slurm.md) or give grace explicitly")
            self._grace = float(min(p.grace_time, 3600))
        elif p.grace_time and self._grace > p.grace_time:
            raise MalleValueError(f"grace: {self._grace:g} s is longer than partition {p.name}'s "
                                  f"GraceTime={p.grace_time}; Slurm would kill the rank first")
        if self._agent is None:
            from malletrain.cluster import agent_binary
            self._agent = agent_binary("malle-agent")
        return p

    @property
    def grace(self) -> Optional[float]:
        return self._grace

    def set_slots(self, slots: int) -> None:
        """Harvests ``slots`` from the next poll on. More: new agent jobs are submitted; fewer:
        nothing is cancelled, agents that end are not replaced until the count is below. Raises
        MalleValueError for a count out of range; does no I/O."""
        if not isinstance(slots, int) or not 1 <= slots <= 100000:
            raise MalleValueError(f"slots: must be an integer in [1, 100000], got {slots!r}")
        with self._lock:
            self.options.slots = slots

    # --- the batch job ----------------------------------------------------------------------
    def sbatch_args(self) -> List[str]:
        o = self.options
        assert self._grace is not None
        # The preemption notice: SIGTERM to the batch shell only (the agent, which exec'd it),
        # never to the ranks (they leave when the agent tells them). With a time limit the same
        # signal comes this long before the end, so the rank also leaves before the limit.
        signal_at = int(math.ceil(self._grace)) + 5
        args = [f"--job-name={o.job_name}", f"--partition={o.partition}", "--ntasks=1",
                f"--signal=B:TERM@{signal_at}", "--export=ALL"]
        if o.per == "node":
            args += ["--nodes=1", "--exclusive"]
        else:
            args += [f"--cpus-per-task={o.cpus_per_slot}"]
        if o.time_limit is not None:
            args.append(f"--time={max(1, int(math.ceil(o.time_limit / 60)))}")
        if o.qos:
            args.append(f"--qos={o.qos}")
        if o.account:
            args.append(f"--account={o.account}")
        if o.log_dir:
            args.append(f"--output={os.path.join(o.log_dir, 'agent-%j.log')}")
        return args + list(o.sbatch_args)

    def batch_script(self, idle_until: Optional[float]) -> str:
        o = self.options
        assert self._grace is not None and self._agent is not None
        q = shlex.quote
        argv = [q(self._agent), q(f"--store={o.store}"), q(f"--secret={o.secret}"),
                f'"--node={o.node_prefix}-${{SLURM_JOB_ID}}-${{SLURM_RESTART_COUNT:-0}}"',
                q(f"--group={o.group}"), q(f"--speed={o.speed:g}"),
                q(f"--grace={self._grace:g}s")]
        if idle_until is not None:
            argv.append(q(f"--idle_until={idle_until:.0f}"))
        if o.log_dir:
            argv.append(q(f"--log_dir={o.log_dir}"))
        if o.park_dir:
            argv.append(q(f"--park_dir={o.park_dir}"))
        if o.zygote_python:
            argv.append(q(f"--zygote_python={o.zygote_python}"))
            if o.zygote_preload:
                argv.append(q(f"--zygote_preload={o.zygote_preload}"))
        return ("#!/bin/sh\n"
                "# A malletrain node agent, submitted by `malletrain slurm harvest`.\n"
                "# exec: the agent is the batch shell, so --signal=B:TERM reaches it alone.\n"
                f"exec {' '.join(argv)}\n")

    def submit_one(self, now: Optional[float] = None,
                   forecast: Optional[Forecast] = None) -> Tuple[str, Forecast]:
        """Submits one agent job told ``forecast`` (default: a fresh one); returns its id and
        the forecast. Raises SlurmCommandError / MalleValueError. Blocks for at most a few
        command timeouts."""
        if self._grace is None or self._agent is None:
            self.check()
        now = time.time() if now is None else now
        f = forecast or self.commands.forecast(self.options.partition, now,
                                               time_limit=self.options.time_limit)
        job_id = self.commands.sbatch(self.sbatch_args(), self.batch_script(f.idle_until))
        with self._lock:
            self.submitted[job_id] = now
        self._note(f"submitted agent job {job_id} (idle until "
                   f"{_fmt(f.idle_until) if f.idle_until else 'unknown'}: {f.reason})")
        return job_id, f

    # --- the loop ---------------------------------------------------------------------------
    def poll_once(self, now: Optional[float] = None) -> List[AgentJob]:
        """One look at the queue: notes agent jobs that ended, submits what is missing. Returns
        the agent jobs seen. Raises SlurmCommandError / MalleValueError (the loop logs them and
        tries again at the next poll)."""
        if self._grace is None or self._agent is None:
            self.check()
        now = time.time() if now is None else now
        jobs = self.commands.agent_jobs(self.options.job_name)
        seen = {j.job_id: j for j in jobs}
        with self._lock:
            for j in jobs:
                if j.state == "RUNNING" and j.job_id not in self._started:
                    self._started[j.job_id] = now
                    self._note(f"agent job {j.job_id} running on {','.join(j.nodes)}")
                # Waiting for resources is normal; any other reason (a reservation, a limit,
                # a partition that is down) is worth telling the operator, once.
                if j.state == "PENDING" and j.reason not in _ROUTINE_PENDING and \
                        self._pending_why.get(j.job_id) != j.reason:
                    self._note(f"agent job {j.job_id} pending: {j.reason}")
                self._pending_why[j.job_id] = j.reason
            for job_id, old in list(self._known.items()):
                if job_id in seen:
                    continue
                started = self._started.pop(job_id, None)
                self._pending_why.pop(job_id, None)
                self.submitted.pop(job_id, None)
                ran = now - started if started is not None else 0.0
                if started is not None and ran >= self.options.min_lifetime:
                    self._failures = 0
                    self._not_before = 0.0
                else:
                    self._failures += 1
                    self._not_before = now + min(self._MAX_BACKOFF, 2.0 ** self._failures)
                self._note(f"agent job {job_id} ended (last seen {old.state}"
                           + (f", ran {ran:.0f} s" if started is not None else ", never ran")
                           + ")")
            self._known = seen
            n, why = slots_to_submit(jobs, self.options.slots, now, not_before=self._not_before)
        if n == 0:
            return jobs
        f = self.commands.forecast(self.options.partition, now, time_limit=self.options.time_limit)
        n, why = slots_to_submit(jobs, self.options.slots, now, not_before=self._not_before,
                                 forecast=f, min_window=self.options.min_window)
        if n == 0:
            if not self._waiting:
                self._note(why)
            self._waiting = True
            return jobs
        self._waiting = False
        for _ in range(n):
            job_id, _f = self.submit_one(now, f)
            with self._lock:
                self._known[job_id] = AgentJob(job_id, "PENDING", "submitted", (), None)
        log.info("slurm harvester: %s", why)
        return jobs

    def run(self) -> None:
        """Polls until :meth:`stop`; errors are logged and kept in ``last_error``, never
        raised."""
        while not self._stop.is_set():
            try:
                self.poll_once()
                self.last_error = None
            except (SlurmCommandError, MalleValueError) as e:
                if str(e) != self.last_error:
                    self._note(f"error (retrying every {self.options.poll:g} s): {e}")
                    log.warning("slurm harvester: %s", e)
                self.last_error = str(e)
            self._stop.wait(self.options.poll)

    def start(self) -> "Harvester":
        """check(), then the poll loop in a background thread. Raises what check() raises."""
        self.check()
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="malle-slurm-harvest", daemon=True)
        self._thread.start()
        return self

    def agent_jobs(self) -> List[AgentJob]:
        with self._lock:
            return list(self._known.values())

    def stop(self, *, cancel: bool = True, timeout: float = 60.0) -> None:
        """Stops the loop; with ``cancel``, reclaims every agent job of this name and user
        (SIGTERM to the agent: its rank leaves within the grace time), waits up to ``timeout``
        seconds for them to end, then scancels what is left. Never raises; errors go to
        ``events``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.options.command_timeout * 3 + self.options.poll)
            self._thread = None
        if not cancel:
            return
        deadline = time.monotonic() + timeout
        try:
            jobs = self.commands.agent_jobs(self.options.job_name)
            running = [j.job_id for j in jobs if j.state == "RUNNING"]
            pending = [j.job_id for j in jobs if j.state != "RUNNING"]
            self.commands.scancel(pending)
            self.commands.scancel(running, signal="TERM", batch=True)
            while jobs and time.monotonic() < deadline:
                time.sleep(0.5)
                jobs = self.commands.agent_jobs(self.options.job_name)
                jobs = [j for j in jobs if j.state != "COMPLETING"]
            if jobs:
                self._note(f"agent jobs {[j.job_id for j in jobs]} did not end in {timeout:g} s: "
                           f"scancel")
                self.commands.scancel([j.job_id for j in jobs])
        except (SlurmCommandError, MalleValueError) as e:
            self._note(f"stop: {e}")

    def __enter__(self) -> "Harvester":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _note(self, what: str) -> None:
        line = f"{time.strftime('%H:%M:%S')}  {what}"
        self.events.append(line)
        self.event_count += 1
        del self.events[:-1000]
        log.info("slurm harvester: %s", what)

    def events_since(self, count: int) -> Tuple[int, List[str]]:
        """The events noted after the first ``count`` (as many as are kept) and the new count:
        ``n, lines = h.events_since(n)`` follows them without reading one twice."""
        events, total = list(self.events), self.event_count
        return total, events[max(0, len(events) - (total - count)):]


# --- command line -----------------------------------------------------------------------------

def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return v


def _cmd_harvest(args: argparse.Namespace) -> int:
    import signal as _signal

    from malletrain import _C

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # The deployment's variables (names from libmalle/cluster/rank_env.h), read only now so
    # that building the parser does not load the extension.
    store = args.store or os.environ.get(_C.ENV_STORE) or ""
    secret = args.secret or os.environ.get(_C.ENV_SECRET) or ""
    try:
        options = HarvestOptions(
            store=store, secret=secret, slots=args.slots,
            partition=args.partition, per=args.per, cpus_per_slot=args.cpus_per_slot,
            grace=args.grace, time_limit=args.time_limit, job_name=args.job_name,
            node_prefix=args.node_prefix, group=args.group, log_dir=args.log_dir,
            park_dir=args.park_dir, zygote_python=args.zygote_python,
            zygote_preload=args.zygote_preload, qos=args.qos,
            account=args.account, sbatch_args=list(args.sbatch_arg or []), poll=args.poll,
            agent=args.agent, command_timeout=args.command_timeout, min_window=args.min_window)
        h = Harvester(options)
        p = h.check()
    except MalleValueError as e:
        print(f"malletrain slurm harvest: {e}", file=sys.stderr)
        return 2
    except SlurmCommandError as e:
        print(f"malletrain slurm harvest: {e}", file=sys.stderr)
        return 1
    print(f"harvesting {options.slots} slots of partition {p.name} (PriorityTier "
          f"{p.priority_tier}, GraceTime {p.grace_time} s, PreemptMode {p.preempt_mode}); agents "
          f"get {h.grace:g} s to leave. Ctrl-C stops and cancels the agent jobs.", flush=True)
    if args.once:
        try:
            h.poll_once()
        except (SlurmCommandError, MalleValueError) as e:
            print(f"malletrain slurm harvest: {e}", file=sys.stderr)
            return 1
        print("\n".join(h.events))
        return 0
    done = threading.Event()
    for sig in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(sig, lambda *_: done.set())
    try:
        h.start()
    except (SlurmCommandError, MalleValueError) as e:
        print(f"malletrain slurm harvest: {e}", file=sys.stderr)
        return 1
    printed = 0
    while not done.wait(0.5):
        printed, lines = h.events_since(printed)
        for line in lines:
            print(line, flush=True)
    h.stop(cancel=not args.keep_jobs)
    for line in h.events_since(printed)[1]:
        print(line, flush=True)
    return 0


def _cmd_forecast(args: argparse.Namespace) -> int:
    try:
        f = SlurmCommands(timeout=args.command_timeout).forecast(args.partition,
                                                                 time_limit=args.time_limit)
    except MalleValueError as e:
        print(f"malletrain slurm forecast: {e}", file=sys.stderr)
        return 2
    except SlurmCommandError as e:
        print(f"malletrain slurm forecast: {e}", file=sys.stderr)
        return 1
    when = f"{f.idle_until:.0f} ({_fmt(f.idle_until)})" if f.idle_until else "unknown"
    print(f"idle until: {when}\nwhy: {f.reason}")
    return 0


def add_slurm_parser(commands: argparse._SubParsersAction) -> None:
    """Adds ``malletrain slurm harvest`` and ``malletrain slurm forecast``."""
    p = commands.add_parser("slurm", help="harvest idle nodes of a Slurm cluster",
                            description="Node agents as preemptible Slurm jobs (docs/slurm.md).")
    sub = p.add_subparsers(dest="slurm_command", metavar="COMMAND", required=True)

    h = sub.add_parser(
        "harvest", help="keep N agent jobs submitted to a low-priority partition",
        description="Keeps SLOTS malle-agent jobs submitted to PARTITION, each told when its "
        "node is expected to be wanted back; resubmits those that end (preempted, cancelled). "
        "Runs until SIGINT/SIGTERM, then reclaims and cancels its agent jobs. Exit codes: "
        "0 stopped, 1 Slurm failed, 2 bad input or partition setup.")
    h.add_argument("--store", default=None, metavar="HOST:PORT",
                   help="the control store as the compute nodes reach it (default $MALLE_STORE)")
    h.add_argument("--secret", default=None, metavar="FILE",
                   help="shared secret, readable on the compute nodes (default $MALLE_SECRET)")
    h.add_argument("--slots", type=int, required=True, help="agent jobs to keep submitted")
    h.add_argument("--partition", default="scavenger", help="the preemptible partition")
    h.add_argument("--per", choices=["node", "cpu"], default="node",
                   help="one agent per whole node (default) or per --cpus-per-slot CPUs")
    h.add_argument("--cpus-per-slot", type=int, default=1)
    h.add_argument("--grace", type=_seconds, default=None, metavar="SECONDS",
                   help="time a preempted rank has to leave (default: the partition's GraceTime)")
    h.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help="agent jobs' time limit (default: the partition's)")
    h.add_argument("--min-window", type=float, default=60.0, metavar="SECONDS",
                   help="submit no agent while the forecast idle window is shorter (default 60)")
    h.add_argument("--job-name", default="malle-agent")
    h.add_argument("--node-prefix", default="slurm")
    h.add_argument("--group", default="default", help="locality group of the agents")
    h.add_argument("--log-dir", default=None, help="agent and rank logs (shared file system)")
    h.add_argument("--park-dir", default=None,
                   help="jobs park here when their last slot is preempted, <DIR>/<job> (a "
                   "shared file system); they resume at the same step (default: no parking)")
    h.add_argument("--zygote-python", default=None, metavar="PYTHON",
                   help="warm rank starts: each agent forks its ranks from a zygote of this "
                   "interpreter (as seen on the compute nodes) that imported --zygote-preload "
                   "before the node was offered (default: cold starts)")
    h.add_argument("--zygote-preload", default=None, metavar="MODULES",
                   help="comma-separated modules the zygote imports (default: the agent's)")
    h.add_argument("--qos", default=None)
    h.add_argument("--account", default=None)
    h.add_argument("--sbatch-arg", action="append", metavar="ARG",
                   help="one more sbatch argument (repeatable), e.g. --sbatch-arg=--constraint=cpu")
    h.add_argument("--agent", default=None, help="malle-agent path on the compute nodes")
    h.add_argument("--poll", type=_seconds, default=2.0, metavar="SECONDS")
    h.add_argument("--command-timeout", type=_seconds, default=30.0, metavar="SECONDS")
    h.add_argument("--once", action="store_true", help="submit what is missing once and exit "
                   "(agent jobs stay)")
    h.add_argument("--keep-jobs", action="store_true", help="at exit, leave the agent jobs")
    h.set_defaults(func=_cmd_harvest)

    f = sub.add_parser("forecast", help="print when the partition's nodes are expected back",
                       description="The idle-until forecast the harvester gives new agents.")
    f.add_argument("--partition", default="scavenger")
    f.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS")
    f.add_argument("--command-timeout", type=_seconds, default=30.0, metavar="SECONDS")
    f.set_defaults(func=_cmd_forecast)
