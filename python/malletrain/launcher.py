"""The local launcher: an elastic job on this machine, with scripted joins, leaves and kills.

``malletrain local --nodes 4 --schedule "step=10 leave 2, step=20 join 1" -- python train.py``
hosts the job's control store (loopback, ephemeral port), starts one process per local
"node" and follows the schedule. It is the development and test harness of elastic jobs;
the allocator's node agents do the same on real nodes.

Schedule grammar (comma-separated events, fired in order, each waiting for its trigger)::

    EVENT   := AT ACTION [COUNT]          COUNT >= 1, default 1
    AT      := step=K        when the job has committed K steps (rank 0 publishes the count
                             at progress_key(job_id))
             | t=SECONDS     SECONDS after the launch
    ACTION  := join          start COUNT new members (they warm up, then join)
             | leave         planned leave of the COUNT highest-ranked members (never rank 0,
                             so never the last member)
             | kill          SIGKILL the COUNT highest-ranked members (with a seed: random
                             non-leaders, reproducibly)
             | stop          SIGSTOP members, chosen like kill (a hang)
             | cont          SIGCONT the COUNT members stopped first (the hang ends)

Every process the launcher starts is a ``_C.LocalProcess`` (libmalle/cluster/local_process.h,
the one way ranks are started): it gets ``PR_SET_PDEATHSIG=SIGKILL`` (it cannot outlive the
launcher), leads its own process group (a kill reaches what the rank started too) and is
stopped by pid: at the end, on a timeout (exit 124) and on SIGINT/SIGTERM (exit 130). Nothing here blocks for long except :func:`run_local` itself, which returns
when every process it started has exited.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Optional

from malletrain import _C
from malletrain.errors import MalleError, MalleTimeoutError, MalleValueError

__all__ = ["Event", "Generation", "LocalResult", "choose_members", "parse_schedule",
           "progress_key", "run_local"]

ACTIONS = ("join", "leave", "kill", "term", "stop", "cont")
_EVENT = re.compile(r"^(step|t)=([0-9]+(?:\.[0-9]*)?)\s+([a-z]+)(?:\s+([0-9]+))?$")
_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # the library's id rule
_POLL_S = 0.02  # step triggers and exits are polled this often
_GENERATION_POLL_S = 0.1


def progress_key(job_id: str) -> str:
    """Store key where rank 0 publishes the number of committed steps (ASCII integer)."""
    return f"malle/job/{job_id}/progress"


@dataclass
class Event:
    """One scheduled action."""

    trigger: str      # "step" or "t"
    at: float         # steps or seconds
    action: str       # join, leave, kill, term, stop, cont
    count: int = 1
    # Filled in when it fires:
    fired_t: Optional[float] = None     # seconds after the launch
    fired_step: Optional[int] = None    # progress when it fired
    members: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        at = f"step={int(self.at)}" if self.trigger == "step" else f"t={self.at:g}"
        return f"{at} {self.action} {self.count}"


@dataclass(frozen=True)
class Generation:
    """A generation of the job as the launcher saw it (``_C.latest_generation``)."""

    generation: int
    cause: str                 # bootstrap, planned or recovery (first word of the reason)
    members: tuple[str, ...]   # rank order
    reason: str
    seen_t: float              # seconds after the launch (polled: up to ~0.1 s late)


def parse_schedule(spec: str) -> list[Event]:
    """Parses a schedule (grammar in the module docstring). Pure; does not block.

    Raises MalleValueError naming the bad item by position and text. An empty or blank
    spec is a fixed-size run (no events).
    """
    events: list[Event] = []
    for n, raw in enumerate(spec.split(","), start=1):
        item = " ".join(raw.split())
        if not item:
            if spec.strip():
                raise MalleValueError(f"schedule: item {n} is empty in {spec!r}")
            continue
        m = _EVENT.match(item)
        if not m:
            raise MalleValueError(
                f"schedule: item {n} {item!r} is not 'step=K ACTION [COUNT]' or "
                f"'t=SECONDS ACTION [COUNT]'")
        trigger, at, action, count = m.groups()
        if action not in ACTIONS:
            raise MalleValueError(
                f"schedule: item {n} {item!r}: unknown action {action!r}; expected one of "
                f"{', '.join(ACTIONS)}")
        if trigger == "step" and "." in at:
            raise MalleValueError(f"schedule: item {n} {item!r}: step must be an integer")
        c = int(count) if count is not None else 1
        if c < 1:
            raise MalleValueError(f"schedule: item {n} {item!r}: count must be >= 1")
        events.append(Event(trigger, float(at), action, c))
    return events


def choose_members(action: str, count: int, members: Sequence[str], *,
                   alive: Collection[str], stopped: Sequence[str] = (),
                   rng: Optional[random.Random] = None) -> list[str]:
    """The members a leave/kill/stop/cont applies to. Pure; does not block.

    ``members`` is the latest generation in rank order, ``alive`` the members whose process
    runs, ``stopped`` those the schedule stopped and has not continued, oldest first.
    leave: the highest ranks, never rank 0 (so never the last member). kill, term, stop:
    the highest ranks, rank 0 included; with ``rng``, a random sample of the non-leaders.
    stop skips members already stopped. cont: the members stopped first (they may have
    been excluded from the generation meanwhile). Returns fewer than ``count`` when there
    are not enough candidates.
    """
    if action not in ("leave", "kill", "term", "stop", "cont"):
        raise MalleValueError(f"action: {action!r} does not choose members")
    if action == "cont":
        return [m for m in stopped if m in alive][:count]
    candidates = [m for m in members if m in alive]
    if action == "stop":
        candidates = [m for m in candidates if m not in stopped]
    if action == "leave" or (rng is not None and action in ("kill", "term", "stop")):
        candidates = [m for m in candidates if members and m != members[0]]
    if rng is not None and action in ("kill", "term", "stop"):
        return rng.sample(candidates, min(count, len(candidates)))
    return list(reversed(candidates))[:count]


@dataclass
class LocalResult:
    """What a local run did."""

    exit_codes: dict[str, int]          # member -> exit code (negative: killed by that signal)
    killed: list[str]                   # members the schedule killed
    unadmitted: list[str]               # joiners stopped because the job ended first
    events: list[Event]                 # the schedule; fired ones have fired_t/fired_step
    generations: int                    # generations the job went through
    final_members: list[str]            # the latest generation, rank order
    wall_s: float
    timed_out: bool = False
    pids: dict[str, int] = field(default_factory=dict)        # member -> pid (all reaped)
    history: list[Generation] = field(default_factory=list)  # generations seen, in order

    @property
    def ok(self) -> bool:
        """Every process the schedule did not kill exited 0 (and no timeout)."""
        return not self.timed_out and all(
            code == 0 for m, code in self.exit_codes.items()
            if m not in self.killed and m not in self.unadmitted)


def _generation(record: dict, seen_t: float) -> Generation:
    reason = str(record["reason"])
    # The library starts every reason with its cause ("bootstrap of 3 members",
    # "planned: +[..] -[..]", "recovery from generation 2: ...").
    cause = reason.split(" ", 1)[0].rstrip(":") if reason else "?"
    return Generation(generation=int(record["generation"]), cause=cause,
                      members=tuple(record["members"]), reason=reason, seen_t=seen_t)


class _Local:
    def __init__(self, command: Sequence[str], nodes: int, job_id: str, log_dir: Optional[str],
                 env: Optional[dict[str, str]], seed: Optional[int], quiet: bool,
                 park_dir: Optional[str] = None, warm: bool = False) -> None:
        self.command = list(command)
        self.park_dir = os.fspath(park_dir) if park_dir else ""
        self.nodes = nodes
        self.job_id = job_id
        self.log_dir = log_dir
        self.env = dict(os.environ if env is None else env)
        # libmalle logs every generation at INFO; ranks report their changes themselves.
        self.env.setdefault(_C.ENV_LOG_LEVEL, "warning")
        self.rng = random.Random(seed) if seed is not None else None
        self.quiet = quiet
        self.store = _C.ControlStore.serve("127.0.0.1", 0)
        self.zygote = None
        if warm:
            if log_dir:
                os.makedirs(log_dir, exist_ok=True)
            # The rank program's interpreter, warm (libmalle/cluster/zygote.h): imports done
            # once, every member (the first ones and each joiner) is a fork of it.
            self.zygote = _C.Zygote.start(self.command[0], env=self.env,
                                          log=os.path.join(log_dir, "zygote.log") if log_dir else "")
        self.procs: dict[str, _C.LocalProcess] = {}
        self.killed: list[str] = []
        self.unadmitted: list[str] = []
        self.stopped: list[str] = []
        self.reported: set[str] = set()
        self.history: list[Generation] = []
        self.generation_polled = 0.0
        self.next_id = 0
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[malletrain local] t={self.now():.1f}s {msg}", flush=True)

    def progress(self) -> int:
        v = self.store.try_get(progress_key(self.job_id))
        try:
            return int(v) if v else 0
        except ValueError:
            return 0

    def spawn(self, bootstrap: int) -> str:
        member = f"node{self.next_id}"
        self.next_id += 1
        rank = _C.RankEnv()  # the rank environment contract (libmalle/cluster/rank_env.h)
        rank.store = f"127.0.0.1:{self.store.port}"
        rank.job_id = self.job_id
        rank.member_id = member
        rank.bootstrap_size = bootstrap
        rank.park_dir = self.park_dir
        log = ""
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            log = os.path.join(self.log_dir, f"{member}.log")
        self.procs[member] = p = _C.LocalProcess.spawn(
            self.command, env=self.env, clear_env=True, rank_env=rank, stdout=log,
            stderr_to_stdout=True, truncate=True, new_process_group=True, zygote=self.zygote)
        if self.zygote is not None and not p.warm:
            self.say(f"{member} started cold: {p.cold_reason}")
        return member

    def poll_generations(self, force: bool = False) -> list[str]:
        """Notes the latest generation if it is new; returns its members (rank order).

        latest_generation() reads every record from 0, so unless forced this asks at most
        every _GENERATION_POLL_S; a generation replaced sooner than that (a successor that
        failed to build) may go unseen."""
        if not force and time.monotonic() - self.generation_polled < _GENERATION_POLL_S:
            return list(self.history[-1].members) if self.history else []
        self.generation_polled = time.monotonic()
        latest = _C.latest_generation(self.store, self.job_id)
        if latest is None:
            return []
        if not self.history or latest["generation"] > self.history[-1].generation:
            g = _generation(latest, self.now())
            self.history.append(g)
            self.say(f"generation {g.generation}: {' '.join(g.members)}  ({g.reason})")
        return list(latest["members"])

    def members(self) -> list[str]:
        return self.poll_generations(force=True)

    def running(self) -> list[str]:
        return [m for m, p in self.procs.items() if p.poll() is None]

    def report_exits(self) -> None:
        """Tells the job which members' processes are gone, like a node agent would, so a
        recovery does not wait out its grace period for them."""
        for m, p in self.procs.items():
            if m not in self.reported and p.poll() is not None:
                self.reported.add(m)
                try:
                    _C.report_dead(self.store, self.job_id, m)
                except Exception as e:  # noqa: BLE001 - advisory; recovery still works
                    self.say(f"could not report {m} as exited: {e}")

    def fire(self, ev: Event) -> None:
        ev.fired_t = self.now()
        ev.fired_step = self.progress()
        if ev.action == "join":
            ev.members = [self.spawn(0) for _ in range(ev.count)]
        else:
            ev.members = choose_members(ev.action, ev.count, self.members(),
                                        alive=set(self.running()), stopped=self.stopped,
                                        rng=self.rng)
        if ev.action == "leave":
            for m in ev.members:
                _C.request_leave(self.store, self.job_id, m)
        elif ev.action in ("kill", "term", "stop", "cont"):
            sig = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP,
                   "cont": signal.SIGCONT}
            for m in ev.members:
                try:
                    self.procs[m].signal(sig[ev.action])
                except MalleError:  # pragma: no cover - exited since running()
                    pass
            if ev.action == "kill":
                self.killed.extend(ev.members)
                for m in ev.members:
                    try:
                        self.procs[m].wait(timeout=5)
                    except MalleTimeoutError:  # pragma: no cover
                        pass
                self.report_exits()
            elif ev.action == "stop":
                self.stopped.extend(ev.members)
            elif ev.action == "cont":
                self.stopped = [m for m in self.stopped if m not in ev.members]
            # term: the process leaves (or parks) and exits by itself, like any member
        self.say(f"step={ev.fired_step}: {ev.action} {' '.join(ev.members) or '(nobody)'}")

    def stop_all(self) -> None:
        """SIGKILLs every process still running (and its group), by pid, and reaps all."""
        for p in self.procs.values():
            if p.poll() is None:
                p.kill(timeout=10)


class _SignalsDeferred:
    """Holds SIGINT/SIGTERM while the launcher kills its children, so a second Ctrl-C cannot
    leave some running (PDEATHSIG would still catch them when this process ends, but
    run_local may run inside a long-lived interpreter). Main thread only; a no-op elsewhere."""

    def __enter__(self) -> "_SignalsDeferred":
        self.pending: list[int] = []
        self.old: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self.old[s] = signal.signal(s, lambda signum, _f: self.pending.append(signum))
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        for s in self.pending:
            signal.raise_signal(s)


def run_local(command: Sequence[str], nodes: int, schedule: str = "", *, job_id: str = "local",
              timeout: float = 600.0, seed: Optional[int] = None, log_dir: Optional[str] = None,
              env: Optional[dict[str, str]] = None, quiet: bool = False,
              park_dir: Optional[str] = None, warm: bool = False) -> LocalResult:
    """Runs ``command`` as an elastic job of ``nodes`` local members, following ``schedule``.

    Blocks until every started process has exited, or ``timeout`` seconds after the launch,
    when it SIGKILLs them all and sets ``timed_out``. Joiners still waiting for admission
    when every member of the job has exited are stopped (``unadmitted``); so are members the
    schedule stopped and never continued (counted as ``killed``). ``env`` replaces
    ``os.environ`` for the children; the launcher adds the ``MALLE_*`` variables.
    ``park_dir``: the job's park store (``MALLE_PARK_DIR``): where its last member parks the
    state and snapshots go; a later ``run_local`` with the same directory resumes from it.
    ``warm``: start a zygote of the command's interpreter first (``command[0]``, which must
    be a Python that can import malletrain) and fork every member from it once it is ready,
    instead of starting each as a new interpreter (a member it cannot start exactly as a new
    interpreter would is started cold, and the launcher says why). Raises MalleValueError for a bad schedule or argument; KeyboardInterrupt (SIGINT)
    propagates after every child has been killed.
    """
    if not command:
        raise MalleValueError("command: give the program to run, e.g. -- python train.py")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise MalleValueError(f"nodes: must be a positive integer, got {nodes!r}")
    if not _ID.match(job_id):
        raise MalleValueError(f"job_id: must match [A-Za-z0-9._-]{{1,128}}, got {job_id!r}")
    if not timeout > 0:
        raise MalleValueError(f"timeout: must be a positive number of seconds, got {timeout}")
    events = parse_schedule(schedule)
    run = _Local(command, nodes, job_id, log_dir, env, seed, quiet, park_dir, warm)
    timed_out = False
    last = None
    try:
        if run.zygote is not None:
            try:
                run.zygote.wait_ready(timeout=max(1.0, timeout / 2))
                run.say(f"zygote ready after {run.zygote.warmup_s:.1f} s")
            except MalleError as e:
                run.say(f"no warm starts: {e}")
        for _ in range(nodes):
            run.spawn(nodes)
        run.say(f"job {job_id!r}: store 127.0.0.1:{run.store.port}, "
                f"{nodes} members: {' '.join(run.procs)}")
        pending = list(events)
        deadline = run.t0 + timeout
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                run.say(f"timeout after {timeout:g} s: killing every process")
                break
            run.poll_generations()
            while pending:
                ev = pending[0]
                due = (run.progress() >= ev.at) if ev.trigger == "step" \
                    else (now - run.t0 >= ev.at)
                if not due:
                    break
                run.fire(pending.pop(0))
            run.report_exits()
            alive = run.running()
            if not alive:
                break
            if not pending:
                members = set(run.members())
                # A process that was a member of an earlier generation and is still
                # running has left (a planned leave, or its job parked) and is exiting
                # by itself: it is waited for, not killed (the timeout still holds).
                was_member = {m for g in run.history for m in g.members}
                leaving = [m for m in alive if m in was_member and m not in run.stopped]
                if members and not members & set(alive) and not leaving:
                    # Every member of the job is gone: what still runs is a joiner waiting
                    # to be admitted, or a process stopped and never continued. Neither
                    # will ever finish; stop them instead of waiting for the timeout.
                    hung = [m for m in alive if m in run.stopped]
                    waiting = [m for m in alive if m not in run.stopped]
                    for m in alive:
                        run.procs[m].kill(timeout=10)
                    run.killed.extend(hung)
                    run.unadmitted.extend(waiting)
                    run.say("job over; killed "
                            + "; ".join(f"{what}: {' '.join(ms)}" for what, ms in (
                                ("joiners never admitted", waiting),
                                ("stopped and never continued", hung)) if ms))
                    break
            time.sleep(_POLL_S)
        for ev in pending:
            run.say(f"not fired (job ended first): {ev}")
    finally:
        with _SignalsDeferred():
            run.stop_all()
            try:
                run.poll_generations(force=True)
            except Exception:  # noqa: BLE001 - the summary only; never mask the real error
                pass
    last = run.history[-1] if run.history else None
    codes = {m: p.poll() for m, p in run.procs.items()}
    result = LocalResult(exit_codes=codes, killed=run.killed, unadmitted=run.unadmitted,
                         events=events,
                         generations=(last.generation + 1) if last else 0,
                         final_members=list(last.members) if last else [],
                         wall_s=run.now(), timed_out=timed_out,
                         pids={m: p.pid for m, p in run.procs.items()},
                         history=run.history)
    if not quiet:
        print(summary(result), flush=True)
    return result


def summary(result: LocalResult) -> str:
    """The end-of-run report: per member its exit, the generations, the total time."""
    lines = ["[malletrain local] summary:"]
    for m, code in result.exit_codes.items():
        if m in result.killed:
            how = f"killed by the schedule (exit {code})"
        elif m in result.unadmitted:
            how = "never admitted (the job ended first; stopped by the launcher)"
        elif result.timed_out and code == -signal.SIGKILL:
            how = "killed at the timeout"
        else:
            how = f"exit {code}" + ("" if code == 0 else "  FAILED")
        lines.append(f"  {m:<8} pid {result.pids.get(m, '?'):<8} {how}")
    for g in result.history:
        lines.append(f"  generation {g.generation} at t={g.seen_t:.1f}s ({g.cause}): "
                     f"{' '.join(g.members)}")
    verdict = "timed out" if result.timed_out else "ok" if result.ok else "FAILED"
    lines.append(f"  {result.generations} generations, {result.wall_s:.1f} s: {verdict}")
    return "\n".join(lines)


def main(args) -> int:
    """``malletrain local`` (see malletrain.cli): 0 ok, 1 a rank failed, 2 bad input,
    124 timeout, 130 SIGINT/SIGTERM."""
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("malletrain local: error: give the program to run after --, e.g. "
              "-- python train.py", file=sys.stderr)
        return 2

    def on_sigterm(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    try:
        result = run_local(command, args.nodes, args.schedule, job_id=args.job_id,
                           timeout=args.timeout, seed=args.seed, log_dir=args.log_dir,
                           park_dir=args.park_dir, warm=getattr(args, "warm", False))
    except MalleValueError as e:
        print(f"malletrain local: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("malletrain local: interrupted; every process was killed", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old)
    if result.timed_out:
        return 124
    return 0 if result.ok else 1
