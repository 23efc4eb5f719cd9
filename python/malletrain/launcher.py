"""The local launcher: an elastic job on this machine, with scripted joins, leaves and kills.

``malletrain local --nodes 4 --schedule "step=10 leave 2, step=20 join 1" -- python train.py``
hosts the job's control store (loopback, ephemeral port), starts one process per local
"node" and follows the schedule. It is the development and test harness of elastic jobs;
the allocator's node agents do the same on real nodes.

Schedule grammar (comma-separated events, fired in order, each waiting for its trigger)::

    EVENT   := AT ACTION [COUNT]
    AT      := step=K        when the job has committed K steps (rank 0 publishes it)
             | t=SECONDS     SECONDS after the launch
    ACTION  := join          start COUNT new members (they warm up, then join)
             | leave         planned leave of the COUNT highest-ranked members
             | kill          SIGKILL the COUNT highest-ranked members (random non-leaders
                             with --seed)
             | stop | cont   SIGSTOP / SIGCONT (a hang, and its end)

Every process the launcher starts gets ``PR_SET_PDEATHSIG=SIGKILL`` (it cannot outlive the
launcher) and is stopped by pid: at the end, on a timeout (exit 124) and on SIGINT/SIGTERM
(exit 130).
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from malletrain import _C
from malletrain.errors import MalleValueError

__all__ = ["Event", "LocalResult", "parse_schedule", "progress_key", "run_local"]

_ACTIONS = ("join", "leave", "kill", "stop", "cont")
_EVENT = re.compile(r"^(step|t)=([0-9]+(?:\.[0-9]*)?)\s+([a-z]+)(?:\s+([0-9]+))?$")


def progress_key(job_id: str) -> str:
    """Store key where rank 0 publishes the number of committed steps (ASCII)."""
    return f"malle/job/{job_id}/progress"


@dataclass
class Event:
    """One scheduled action."""

    trigger: str      # "step" or "t"
    at: float         # steps or seconds
    action: str       # join, leave, kill, stop, cont
    count: int = 1
    # Filled in when it fires:
    fired_t: Optional[float] = None
    fired_step: Optional[int] = None
    members: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        at = f"step={int(self.at)}" if self.trigger == "step" else f"t={self.at:g}"
        return f"{at} {self.action} {self.count}"


def parse_schedule(spec: str) -> List[Event]:
    """Parses a schedule; raises MalleValueError naming the bad item."""
    events: List[Event] = []
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
        if action not in _ACTIONS:
            raise MalleValueError(
                f"schedule: item {n} {item!r}: unknown action {action!r}; expected one of "
                f"{', '.join(_ACTIONS)}")
        if trigger == "step" and "." in at:
            raise MalleValueError(f"schedule: item {n} {item!r}: step must be an integer")
        c = int(count) if count is not None else 1
        if c < 1:
            raise MalleValueError(f"schedule: item {n} {item!r}: count must be >= 1")
        events.append(Event(trigger, float(at), action, c))
    return events


@dataclass
class LocalResult:
    """What a local run did."""

    exit_codes: Dict[str, int]          # member -> exit code (negative: killed by that signal)
    killed: List[str]                   # members the schedule killed
    unadmitted: List[str]               # joiners stopped because the job ended first
    events: List[Event]
    generations: int                    # generations the job went through
    final_members: List[str]
    wall_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """Every process the schedule did not kill exited 0 (and no timeout)."""
        return not self.timed_out and all(
            code == 0 for m, code in self.exit_codes.items()
            if m not in self.killed and m not in self.unadmitted)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Local:
    def __init__(self, command: Sequence[str], nodes: int, job_id: str, log_dir: Optional[str],
                 env: Optional[Dict[str, str]], seed: Optional[int], quiet: bool) -> None:
        self.command = list(command)
        self.nodes = nodes
        self.job_id = job_id
        self.log_dir = log_dir
        self.env = dict(os.environ if env is None else env)
        # libmalle logs every generation at INFO; ranks report their changes themselves.
        self.env.setdefault("MALLE_LOG_LEVEL", "warning")
        self.rng = random.Random(seed) if seed is not None else None
        self.quiet = quiet
        self.store = _C.ControlStore.serve("127.0.0.1", 0)
        self.procs: Dict[str, subprocess.Popen] = {}
        self.files: List = []
        self.killed: List[str] = []
        self.unadmitted: List[str] = []
        self.reported: set = set()
        self.next_id = 0
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(f"[malletrain local] t={time.monotonic() - self.t0:.1f}s {msg}", flush=True)

    def progress(self) -> int:
        v = self.store.try_get(progress_key(self.job_id))
        try:
            return int(v) if v else 0
        except ValueError:
            return 0

    def spawn(self, bootstrap: int) -> str:
        member = f"node{self.next_id}"
        self.next_id += 1
        env = dict(self.env, MALLE_STORE=f"127.0.0.1:{self.store.port}",
                   MALLE_JOB_ID=self.job_id, MALLE_MEMBER_ID=member,
                   MALLE_BOOTSTRAP_SIZE=str(bootstrap))
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, f"{member}.log"), "w")
            self.files.append(out)
        self.procs[member] = subprocess.Popen(
            self.command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
            preexec_fn=_die_with_parent)
        return member

    def members(self) -> List[str]:
        g = _C.latest_generation(self.store, self.job_id)
        return list(g["members"]) if g else []

    def running(self) -> List[str]:
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

    def pick(self, count: int, allow_leader: bool) -> List[str]:
        alive = set(self.running())
        members = [m for m in self.members() if m in alive]
        if not allow_leader:
            members = members[1:]  # never the last member / the leader
        if self.rng is not None:
            return self.rng.sample(members, min(count, len(members)))
        return list(reversed(members))[:count]

    def fire(self, ev: Event) -> None:
        ev.fired_t = time.monotonic() - self.t0
        ev.fired_step = self.progress()
        if ev.action == "join":
            ev.members = [self.spawn(0) for _ in range(ev.count)]
        elif ev.action == "leave":
            ev.members = self.pick(ev.count, allow_leader=False)
            for m in ev.members:
                _C.request_leave(self.store, self.job_id, m)
        else:
            ev.members = self.pick(ev.count, allow_leader=ev.action != "kill" or
                                   self.rng is None)
            sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}
            for m in ev.members:
                try:
                    self.procs[m].send_signal(sig[ev.action])
                except ProcessLookupError:
                    pass
                if ev.action == "kill":
                    self.killed.append(m)
            if ev.action == "kill":
                for m in ev.members:
                    try:
                        self.procs[m].wait(timeout=5)
                    except subprocess.TimeoutExpired:  # pragma: no cover
                        pass
                self.report_exits()
        self.say(f"step={ev.fired_step}: {ev.action} {' '.join(ev.members) or '(nobody)'}")

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                pass
        for f in self.files:
            f.close()


def run_local(command: Sequence[str], nodes: int, schedule: str = "", *, job_id: str = "local",
              timeout: float = 600.0, seed: Optional[int] = None, log_dir: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, quiet: bool = False) -> LocalResult:
    """Runs ``command`` as an elastic job of ``nodes`` local members, following ``schedule``.

    Returns when every started process has exited (or after ``timeout`` seconds, when it
    kills them all and sets ``timed_out``). Raises MalleValueError for a bad schedule or
    arguments.
    """
    if not command:
        raise MalleValueError("command: give the program to run, e.g. -- python train.py")
    if not isinstance(nodes, int) or nodes < 1:
        raise MalleValueError(f"nodes: must be a positive integer, got {nodes!r}")
    if timeout <= 0:
        raise MalleValueError(f"timeout: must be positive, got {timeout}")
    events = parse_schedule(schedule)
    run = _Local(command, nodes, job_id, log_dir, env, seed, quiet)
    timed_out = False
    try:
        for _ in range(nodes):
            run.spawn(nodes)
        pending = list(events)
        deadline = run.t0 + timeout
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                run.say(f"timeout after {timeout:g} s: killing every process")
                break
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
            if not pending and len(run.procs) > nodes:
                # Joiners still waiting for admission to a job whose members are all
                # gone will never get in: stop them (not a failure of theirs).
                members = run.members()
                if members and not set(members) & set(alive):
                    for m in alive:
                        run.procs[m].kill()
                        run.procs[m].wait(timeout=10)
                        run.unadmitted.append(m)
                    run.say(f"job over; stopped joiners never admitted: {' '.join(alive)}")
                    break
            time.sleep(0.01)
        for ev in pending:
            run.say(f"not fired (job ended first): {ev}")
    finally:
        last = _C.latest_generation(run.store, job_id)
        run.stop_all()
    codes = {m: p.returncode for m, p in run.procs.items()}
    result = LocalResult(exit_codes=codes, killed=run.killed, unadmitted=run.unadmitted,
                         events=events,
                         generations=(last["generation"] + 1) if last else 0,
                         final_members=list(last["members"]) if last else [],
                         wall_s=time.monotonic() - run.t0, timed_out=timed_out)
    if not quiet:
        for m, code in codes.items():
            how = "killed by the schedule" if m in run.killed else (
                "never admitted (the job ended first)" if m in run.unadmitted else
                "ok" if code == 0 else f"FAILED (exit {code})")
            print(f"[malletrain local] {m}: {how}", flush=True)
        print(f"[malletrain local] {result.generations} generations, {result.wall_s:.1f} s, "
              f"{'ok' if result.ok else 'FAILED'}", flush=True)
    return result


def main(args) -> int:  # called by malletrain.cli
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        parse_schedule(args.schedule)
        result_holder: Dict[str, LocalResult] = {}

        def on_signal(signum, frame):  # noqa: ARG001
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGTERM, on_signal)
        try:
            result_holder["r"] = run_local(command, args.nodes, args.schedule,
                                           job_id=args.job_id, timeout=args.timeout,
                                           seed=args.seed, log_dir=args.log_dir)
        finally:
            signal.signal(signal.SIGTERM, old)
    except MalleValueError as e:
        print(f"malletrain local: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("malletrain local: interrupted; every process was killed", file=sys.stderr)
        return 130
    r = result_holder["r"]
    if r.timed_out:
        return 124
    return 0 if r.ok else 1
