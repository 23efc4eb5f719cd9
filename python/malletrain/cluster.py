"""A local elastic cluster: the allocator, its control store and node agents on this machine.

:class:`LocalCluster` runs the shared allocator embedded (a thread of this process, the same
C++ service as the ``malle-allocator`` daemon), hosts the control store, and starts one node
agent process (``malle-agent``) per local "node". Nodes come and go as you say, or following an
idle-node trace; jobs you submit grow and shrink in place as the allocator decides::

    from malletrain.cluster import LocalCluster

    with LocalCluster(nodes=["n0", "n1", "n2", "n3"], policy="milp") as cluster:
        cluster.node_up("n0"); cluster.node_up("n1")
        cluster.submit("digits", ["python", "examples/train_digits.py", "--epochs", "4"],
                       max_nodes=4, logical_workers=4)
        cluster.node_down("n1", grace=10)        # the main scheduler reclaims n1
        cluster.wait(["digits"], timeout=600)
        print(cluster.jobs())

Everything binds to 127.0.0.1. The shared secret is a fresh random file (mode 0600) in the
cluster's work directory; agents and ranks read it from there. Every process the cluster starts
is a ``_C.LocalProcess`` (it dies with this process) and is stopped by pid when it closes
(agents with SIGINT, then SIGKILL; their ranks die with them).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from malletrain import _C
from malletrain.errors import MalleError, MalleTimeoutError, MalleValueError

log = logging.getLogger("malletrain")

__all__ = ["LocalCluster", "TraceEvent", "load_idle_trace", "agent_binary", "format_status",
           "held_summary", "saved_state", "park_summary"]

_ENDED = ("succeeded", "failed", "cancelled")


def _check_slots(slots: Any) -> None:
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 1024:
        raise MalleValueError(f"slots: ranks per node, an integer in [1, 1024], got {slots!r}")


def _free_port() -> int:
    """An ephemeral loopback port that is free now (the store process binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allocator_objective_flags(objective: str, resize_hysteresis: float,
                              rank_weight_exponent: float, reclaim_hazard: bool,
                              rank_aging_s: Optional[float] = None) -> List[str]:
    """``malle-allocator``'s flags for its objective and terms (docs/allocator.md), as
    ``malletrain allocator`` and a :class:`LocalCluster` with ``allocator="process"`` pass them.
    ``rank_aging_s`` None or infinite: no aging."""
    flags = [f"--objective={objective}", f"--resize_hysteresis={resize_hysteresis!r}",
             f"--rank_weight_exponent={rank_weight_exponent!r}",
             f"--reclaim_hazard={'true' if reclaim_hazard else 'false'}"]
    if rank_aging_s is not None and not math.isinf(rank_aging_s):
        flags.append(f"--rank_aging={rank_aging_s!r}s")
    return flags


def agent_binary(name: str = "malle-agent") -> str:
    """Path of a daemon shipped with the package (``malle-agent``, ``malle-allocator``)."""
    here = Path(__file__).resolve().parent / "bin" / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    env = os.environ.get(_C.ENV_BIN_DIR)
    if env and (Path(env) / name).is_file():
        return str(Path(env) / name)
    raise MalleValueError(f"{name}: not found in {here.parent} (reinstall malletrain) "
                          f"nor in ${_C.ENV_BIN_DIR}")


@dataclass(frozen=True)
class TraceEvent:
    """A node becoming idle (``idle=True``: offered to the jobs) or busy (reclaimed)."""

    t: float    # seconds after the start of the trace
    node: str
    idle: bool


def load_idle_trace(path: str | os.PathLike, *, time_scale: float = 1.0) -> List[TraceEvent]:
    """Reads an idle-node trace: CSV with header ``time,node,idle`` (``#`` lines are comments),
    the format of ``summit-idle-2021-02.csv.gz`` (docs/simulator.md). Times become seconds after
    the first row, divided by ``time_scale``. Raises MalleValueError naming file and line for a
    bad row; nothing is skipped silently."""
    if not time_scale > 0:
        raise MalleValueError(f"time_scale: must be > 0, got {time_scale!r}")
    events: List[TraceEvent] = []
    header_seen = False
    t0: Optional[float] = None
    last = float("-inf")
    with open(path, newline="") as f:
        for lineno, line in enumerate(f, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            fields = next(csv.reader([text]))
            if not header_seen:
                if [x.strip() for x in fields] != ["time", "node", "idle"]:
                    raise MalleValueError(f"{path}:{lineno}: expected the header 'time,node,idle', "
                                          f"got {text!r}")
                header_seen = True
                continue
            if len(fields) != 3:
                raise MalleValueError(f"{path}:{lineno}: expected 3 fields, got {len(fields)}")
            try:
                t = float(fields[0])
            except ValueError:
                raise MalleValueError(f"{path}:{lineno}: time: not a number: {fields[0]!r}") from None
            node = fields[1].strip()
            if not node or not all(c.isalnum() or c in "._-" for c in node) or len(node) > 128:
                raise MalleValueError(f"{path}:{lineno}: node: not an id: {node!r}")
            if fields[2].strip() not in ("0", "1"):
                raise MalleValueError(f"{path}:{lineno}: idle: must be 0 or 1, got {fields[2]!r}")
            if t < last:
                raise MalleValueError(f"{path}:{lineno}: time: {t:g} is before the previous "
                                      f"row's {last:g}; rows must be in time order")
            last = t
            if t0 is None:
                t0 = t
            events.append(TraceEvent((t - t0) / time_scale, node, fields[2].strip() == "1"))
    if not header_seen:
        raise MalleValueError(f"{path}: no header 'time,node,idle'")
    return events


class LocalCluster:
    """An embedded allocator, its control store and local node agents (see the module doc).

    Args:
        nodes: the node names this cluster may start (an int ``n`` means ``n0 .. n{n-1}``).
            None is up until :meth:`node_up` (or a trace) says so.
        policy: ``milp``, ``dp``, ``greedy``, ``equal_share`` or ``static``.
        workdir: where the secret, the journal and the logs go (default: a new temporary
            directory, removed at close if it was created here and ``keep_logs`` is False).
        grace: seconds a reclaimed node gives its rank to leave (SIGTERM to its agent).
        forward_window: the allocator's look-ahead (seconds).
        objective, resize_hysteresis, rank_weights, rank_aging, reclaim_hazard: the
            allocator's objective and its terms
            (``throughput``/``speedup``/``weighted``; every resize charged ``resize_hysteresis``
            times its pause; each job's value times rank^``rank_weights``, rank 1 for the job
            with the most work left, from the ``total_steps`` jobs declare at :meth:`submit`;
            ``rank_aging``: seconds (None: off) over which a job's work left ranks as
            work / (1 + age / rank_aging), its age counted from its submit;
            ``reclaim_hazard``: price the expected reclaims at the rate this allocator has seen).
            ``objective="speedup", rank_weights=1, rank_aging=36000`` is the setting that won on
            the figures users feel in docs/benchmarks.md.
        heartbeat_timeout: seconds after which a silent agent's node is withdrawn.
        journal: keep the allocator's journal in the work directory.
        allocator: ``"thread"`` (embedded in this process, the default) or ``"process"`` (the
            ``malle-allocator`` daemon as a child process, which :meth:`stop_allocator` can
            kill -9 and :meth:`start_allocator` restart from its journal).
        store: where the control store is. ``"embedded"`` (default): a TCPStore server in
            this process. ``"process"``: a ``malletrain store`` child process on a fixed
            loopback port, which :meth:`stop_store` can kill -9 (or SIGSTOP) and
            :meth:`start_store` bring back on the same port (an outage). An
            ``"etcd://h1:p1,h2:p2,..."`` address: an etcd cluster run by the caller.
        metrics: export Prometheus metrics on loopback, ephemeral ports: the allocator's at
            :attr:`metrics_url` (through ``prometheus-client`` for the embedded one), each
            agent's at :meth:`agent_metrics_url`.
        slots: ranks per node (every agent's ``--slots``; :meth:`node_up` may give a node
            another count): a job on k nodes runs k x slots ranks, ``LOCAL_RANK`` 0..slots-1
            on each; a node that leaves takes its ranks out in one generation change.
        zygote: warm rank starts (the default): each agent starts a zygote, an interpreter
            (this one, ``sys.executable``) that has imported ``preload``, offers its node once
            that is ready, and forks the ranks of jobs whose command runs this interpreter
            from it (libmalle/cluster/zygote.h), so that process start and imports are not
            paid while a job holds the node. False: every rank is a new interpreter.
        preload: the modules the zygotes import (those the jobs' scripts import are worth
            adding: each rank then imports nothing heavy on the node's clock).
        agent_prefix: a function of the node name giving a command the node's agent runs
            under, e.g. ``lambda n: ["ip", "netns", "exec", f"host-{n}"]`` to run each node
            in a network namespace of its own (the agent's pid is the prefix's, which must
            exec the agent). The store address must then be reachable from there.
    """

    def __init__(self, nodes: int | Sequence[str] = 4, *, policy: str = "milp",
                 workdir: Optional[str | os.PathLike] = None, grace: float = 10.0,
                 forward_window: float = 120.0, heartbeat_timeout: float = 5.0,
                 debounce: float = 0.2, report_min_interval: float = 5.0, journal: bool = True,
                 objective: str = "throughput", resize_hysteresis: float = 1.0,
                 rank_weights: float = 0.0, reclaim_hazard: bool = False,
                 rank_aging: Optional[float] = None,
                 keep_logs: bool = False,
                 allocator: str = "thread", store: str = "embedded",
                 metrics: bool = False, park_dir: Optional[str | os.PathLike] = None,
                 slots: int = 1, zygote: bool = True,
                 preload: Sequence[str] = ("torch", "torch._dynamo", "malletrain"),
                 agent_prefix: Optional[Callable[[str], Sequence[str]]] = None) -> None:
        if allocator not in ("thread", "process"):
            raise MalleValueError(f"allocator: 'thread' or 'process', got {allocator!r}")
        _check_slots(slots)
        self.slots = slots
        self.zygote = bool(zygote)
        self._agent_prefix = agent_prefix
        self.preload = [str(m) for m in preload]
        bad = [m for m in self.preload if not m or not all(c.isalnum() or c in "._" for c in m)]
        if zygote and (bad or not self.preload):
            raise MalleValueError(f"preload: module names ([A-Za-z0-9_.]), at least one, got "
                                  f"{list(preload)!r}")
        names = [f"n{i}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        if not names or len(set(names)) != len(names):
            raise MalleValueError(f"nodes: give a positive count or distinct names, got {nodes!r}")
        self.nodes = names
        self.grace = float(grace)
        self.t0 = time.monotonic()
        self.events: List[str] = []  # what the cluster did, for the demo's summary
        self._agent = agent_binary("malle-agent")
        self._own_dir = workdir is None
        self._keep_logs = keep_logs
        self.workdir = Path(tempfile.mkdtemp(prefix="malle-cluster-") if workdir is None else workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.workdir / "logs"
        self.log_dir.mkdir(exist_ok=True)
        # Every job's park store is <park_dir>/<job> (the agents' --park_dir).
        self.park_dir = Path(park_dir) if park_dir is not None else self.workdir / "park"
        self.park_dir.mkdir(parents=True, exist_ok=True)
        self.secret_path = self.workdir / "secret"
        if not self.secret_path.exists():
            _C.write_new_secret(str(self.secret_path))
        self._secret = _C.load_secret(str(self.secret_path))
        self._store_proc: Any = None  # _C.LocalProcess of store="process"
        self._store_port = 0
        if store == "embedded":
            self.store = _C.ControlStore.serve("127.0.0.1", 0)
            self.address = f"127.0.0.1:{self.store.port}"
        elif store == "process":
            self._store_port = _free_port()
            self.start_store()
            self.address = f"127.0.0.1:{self._store_port}"
            self.store = _C.open_store(self.address, timeout=30.0)
        elif store.startswith("etcd://"):
            self.address = store
            self.store = _C.open_store(store, timeout=30.0)
        else:
            raise MalleValueError(f"store: 'embedded', 'process' or an etcd:// address, got {store!r}")
        self.journal_path = self.workdir / "journal" if journal else None
        self._service_args = dict(
            policy=policy, journal=str(self.journal_path) if journal else "",
            forward_window_s=float(forward_window), heartbeat_timeout_s=float(heartbeat_timeout),
            debounce_s=float(debounce), report_min_interval_s=float(report_min_interval),
            default_samples_per_s=1.0, max_rank_failures=3, objective=objective,
            resize_hysteresis=float(resize_hysteresis), rank_weight_exponent=float(rank_weights),
            reclaim_hazard=bool(reclaim_hazard),
            rank_aging_s=math.inf if rank_aging is None else float(rank_aging))
        self._service: Any = None
        self._allocator_mode = allocator
        self._metrics = bool(metrics)
        self.metrics_url: Optional[str] = None
        self._metrics_server: Any = None
        self._allocator_proc: Any = None  # _C.LocalProcess
        self.start_allocator()
        self.client = _C.ControlClient(self.store, self._secret)
        self._agents: Dict[str, Any] = {}  # node -> _C.LocalProcess
        self._lock = threading.Lock()
        self._trace_thread: Optional[threading.Thread] = None
        self._trace_idle: Dict[str, bool] = {}  # each node's latest state in the trace
        self._outage_thread: Optional[threading.Thread] = None
        self._in_outage = False  # trace events are deferred while every node is taken back
        self._seen_jobs: Dict[str, tuple] = {}  # job -> (phase, runtime_id, parks): what wait() noted
        self._stop = threading.Event()
        self.closed = False

    # --- the allocator ------------------------------------------------------------------
    def start_allocator(self) -> None:
        """Starts the allocator (again, after :meth:`stop_allocator`: it replays its
        journal and continues where the inbox says)."""
        if self.allocator_running:
            raise MalleValueError("the allocator is already running")
        if self._allocator_mode == "thread":
            self._service = _C.AllocatorService(self.store, self._secret, **self._service_args)
            self._service.start()
            if self._metrics and self._metrics_server is None:
                self._start_metrics()
            return
        a = self._service_args
        args = [agent_binary("malle-allocator"), f"--store={self.address}",
                f"--secret={self.secret_path}", f"--policy={a['policy']}",
                f"--forward_window={a['forward_window_s']}s",
                f"--heartbeat_timeout={a['heartbeat_timeout_s']}s",
                f"--debounce={a['debounce_s']}s",
                *allocator_objective_flags(a["objective"], a["resize_hysteresis"],
                                           a["rank_weight_exponent"], a["reclaim_hazard"],
                                           a["rank_aging_s"])]
        if a["journal"]:
            args.append(f"--journal={a['journal']}")
        if self._metrics:
            args.append("--metrics=127.0.0.1:0")
        self._allocator_proc = _C.LocalProcess.spawn(
            args, stdout=str(self.log_dir / "allocator.log"), stderr_to_stdout=True)
        self._note(f"allocator started (pid {self._allocator_proc.pid})")

    def stop_allocator(self, *, kill: bool = False) -> None:
        """Stops the allocator; jobs keep training at their current size. ``kill=True``
        (process mode only): kill -9, as a crash would."""
        if self._service is not None:
            service, self._service = self._service, None
            service.stop()
        p, self._allocator_proc = self._allocator_proc, None
        if p is not None and p.poll() is None:
            p.signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except MalleTimeoutError:
                p.kill(timeout=10)
            self._note(f"allocator {'killed (kill -9)' if kill else 'stopped'}")

    @property
    def allocator_running(self) -> bool:
        return self._service is not None or (
            self._allocator_proc is not None and self._allocator_proc.poll() is None)

    # --- metrics ------------------------------------------------------------------------
    def _start_metrics(self) -> None:
        """The embedded allocator's metrics through prometheus-client, on loopback. The
        metrics themselves are defined once, in C++ (AllocatorService::MetricsText)."""
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.parser import text_string_to_metric_families

        cluster = self

        class _Allocator:
            def collect(self):
                service = cluster._service
                if service is not None:
                    yield from text_string_to_metric_families(service.metrics_text())

        registry = CollectorRegistry()
        registry.register(_Allocator())
        server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        self._metrics_server = server
        self.metrics_url = f"http://127.0.0.1:{server.server_port}/metrics"

    def agent_metrics_url(self, node: str, timeout: float = 10.0) -> str:
        """Where the agent of ``node`` serves its metrics (it says so in its log)."""
        import re

        deadline = time.monotonic() + timeout
        log_file = self.log_dir / f"agent-{node}.log"
        while True:
            text = log_file.read_text(errors="replace") if log_file.exists() else ""
            found = re.findall(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", text)
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                raise MalleTimeoutError(f"agent {node}: no metrics endpoint in {log_file}")
            time.sleep(0.05)

    def allocator_metrics_url(self, timeout: float = 10.0) -> str:
        """The allocator's metrics endpoint (embedded: :attr:`metrics_url`; daemon: its log)."""
        if self.metrics_url is not None:
            return self.metrics_url
        import re

        deadline = time.monotonic() + timeout
        log_file = self.log_dir / "allocator.log"
        while True:
            text = log_file.read_text(errors="replace") if log_file.exists() else ""
            found = re.findall(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", text)
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                raise MalleTimeoutError(f"allocator: no metrics endpoint in {log_file}")
            time.sleep(0.05)

    # --- the store (store="process") ----------------------------------------------------
    def start_store(self) -> None:
        """Starts the ``malletrain store`` process on the cluster's port (again, after
        :meth:`stop_store`: a restarted TCPStore is empty; the allocator re-seeds it)."""
        if self._store_port == 0:
            raise MalleValueError("start_store: the cluster's store is not a process")
        if self._store_proc is not None and self._store_proc.poll() is None:
            raise MalleValueError("the store is already running")
        self._store_proc = _C.LocalProcess.spawn(
            [sys.executable, "-m", "malletrain.cli", "store", "--listen",
             f"127.0.0.1:{self._store_port}"],
            stdout=str(self.log_dir / "store.log"), stderr_to_stdout=True)
        deadline = time.monotonic() + 30
        while True:  # serving once it accepts a connection
            try:
                with socket.create_connection(("127.0.0.1", self._store_port), timeout=1):
                    break
            except OSError:
                if self._store_proc.poll() is not None or time.monotonic() > deadline:
                    raise MalleError(f"the store process did not start; see {self.log_dir}/store.log")
                time.sleep(0.05)
        self._note(f"store started (pid {self._store_proc.pid}, port {self._store_port})")

    def stop_store(self, *, kill: bool = True) -> None:
        """kill -9 of the store process (``kill=False``: SIGTERM): a store outage."""
        p = self._store_proc
        if p is not None and p.poll() is None:
            if kill:
                p.kill(timeout=10)
            else:
                p.signal(signal.SIGTERM)
                p.wait(timeout=15)
            self._note(f"store {'killed (kill -9)' if kill else 'stopped'}")

    def pause_store(self, paused: bool = True) -> None:
        """SIGSTOP (or SIGCONT) of the store process: unreachable, its contents kept."""
        if self._store_proc is not None and self._store_proc.poll() is None:
            self._store_proc.signal(signal.SIGSTOP if paused else signal.SIGCONT)
            self._note(f"store {'paused (SIGSTOP)' if paused else 'resumed (SIGCONT)'}")

    # --- nodes --------------------------------------------------------------------------
    def node_up(self, node: str, *, idle_until: Optional[float] = None, group: str = "default",
                speed: float = 1.0, slots: Optional[int] = None) -> int:
        """Starts the agent of ``node`` (it registers and offers the node) with ``slots`` ranks
        per job (default: the cluster's). Returns its pid."""
        if node not in self.nodes:
            raise MalleValueError(f"node {node!r} is not one of this cluster's {self.nodes}")
        slots = self.slots if slots is None else slots
        _check_slots(slots)
        with self._lock:
            if self._stop.is_set():  # close() has taken its list of agents to stop
                raise MalleValueError(f"node_up({node!r}): the cluster is closing")
            p = self._agents.get(node)
            if p is not None and p.poll() is None:
                return p.pid
            args = [self._agent, f"--store={self.address}", f"--secret={self.secret_path}",
                    f"--node={node}", f"--group={group}", f"--speed={speed}",
                    f"--grace={self.grace}s", f"--log_dir={self.log_dir}",
                    f"--park_dir={self.park_dir}", f"--slots={slots}"]
            if idle_until is not None:
                args.append(f"--idle_until={idle_until}")
            if self._metrics:
                args.append("--metrics=127.0.0.1:0")
            if self.zygote:
                args += [f"--zygote_python={sys.executable}",
                         f"--zygote_preload={','.join(self.preload)}"]
            if self._agent_prefix is not None:
                args = [*self._agent_prefix(node), *args]
            p = _C.LocalProcess.spawn(args, stdout=str(self.log_dir / f"agent-{node}.log"),
                                      stderr_to_stdout=True)
            self._agents[node] = p
            self._note(f"node {node} up (agent pid {p.pid})")
            return p.pid

    def node_down(self, node: str, *, grace: Optional[float] = None, wait: bool = False) -> None:
        """The main scheduler reclaims ``node``: SIGTERM to its agent, which makes its rank
        leave at the next step boundary within the grace time, then exits. ``grace`` other than
        the cluster's needs a new agent flag, so it only bounds the wait here."""
        with self._lock:
            p = self._agents.get(node)
        if p is None or p.poll() is not None:
            return
        try:
            p.signal(signal.SIGTERM)
        except MalleError:  # exited meanwhile
            return
        self._note(f"node {node} reclaimed (grace {self.grace:g} s)")
        if wait:
            self._wait_agent(node, p, (grace if grace is not None else self.grace) + 10)

    def kill_agent(self, node: str) -> None:
        """kill -9 of a node's agent (its rank dies with it): a node failure."""
        with self._lock:
            p = self._agents.get(node)
        if p is not None and p.poll() is None:
            p.kill(timeout=10)
            self._note(f"node {node} agent killed (kill -9)")

    def live_nodes(self) -> List[str]:
        with self._lock:
            return [n for n, p in self._agents.items() if p.poll() is None]

    def _wait_agent(self, node: str, p: Any, timeout: float) -> None:
        try:
            p.wait(timeout=timeout)
        except MalleTimeoutError:
            p.kill(timeout=10)
            self._note(f"node {node} agent did not exit in {timeout:g} s: killed")

    # --- trace --------------------------------------------------------------------------
    def follow_trace(self, events: Sequence[TraceEvent]) -> None:
        """Applies ``events`` (from :func:`load_idle_trace`) in the background: idle -> node_up,
        busy -> node_down. Nodes named in the trace must be cluster nodes."""
        unknown = sorted({e.node for e in events} - set(self.nodes))
        if unknown:
            raise MalleValueError(f"trace: nodes {unknown} are not cluster nodes {self.nodes}")
        if self._trace_thread is not None:
            raise MalleValueError("follow_trace: a trace is already being followed")
        start = time.monotonic()

        def run() -> None:
            for e in events:
                delay = start + e.t - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    return
                with self._lock:
                    self._trace_idle[e.node] = e.idle
                    deferred = self._in_outage
                if deferred:  # applied when the outage ends
                    continue
                if e.idle:
                    try:
                        self.node_up(e.node)
                    except MalleValueError:  # closing
                        return
                else:
                    self.node_down(e.node)

        self._trace_thread = threading.Thread(target=run, name="malle-trace", daemon=True)
        self._trace_thread.start()

    def outage(self, seconds: float) -> None:
        """The main scheduler takes every node back for ``seconds`` (a maintenance window, a
        partition-wide preemption): every agent is reclaimed with the cluster's grace -- a job's
        last member parks its state (its park store is ``<park_dir>/<job>``) -- and when the
        window has passed and every agent has exited, the nodes come back: those a followed
        trace says are idle by then, otherwise those that were up. Trace events inside the
        window are deferred to its end. Runs in the background; returns at once."""
        if seconds < 0:
            raise MalleValueError(f"outage: seconds must be >= 0, got {seconds!r}")
        with self._lock:
            if self._in_outage:
                raise MalleValueError("outage: an outage is already under way")
            self._in_outage = True
            were_up = [n for n, p in self._agents.items() if p.poll() is None]
            procs = {n: self._agents[n] for n in were_up}
        self._note(f"outage: every node taken back for {seconds:g} s ({', '.join(were_up) or 'none up'})")
        end = time.monotonic() + seconds
        for n in were_up:
            self.node_down(n)

        def run() -> None:
            for n, p in procs.items():
                self._wait_agent(n, p, self.grace + 10)
            if self._stop.wait(max(0.0, end - time.monotonic())):
                return
            with self._lock:
                self._in_outage = False
                following = self._trace_thread is not None
                back = [n for n in self.nodes
                        if (self._trace_idle.get(n, False) if following else n in were_up)]
            self._note(f"outage over: {', '.join(back) or 'no node'} back")
            for n in back:
                try:
                    self.node_up(n)
                except MalleValueError:  # closing
                    return

        self._outage_thread = threading.Thread(target=run, name="malle-outage", daemon=True)
        self._outage_thread.start()

    # --- jobs ---------------------------------------------------------------------------
    def submit(self, job: str, command: Sequence[str], *, min_nodes: int = 1,
               max_nodes: Optional[int] = None, logical_workers: Optional[int] = None,
               env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
               weight: float = 1.0, priority: int = 0,
               total_steps: Optional[int] = None) -> None:
        """Submits a job: ``command`` runs on every node the allocator gives it (the node's
        slots ranks on each; ranks join at their first step). ``min_nodes``/``max_nodes`` count
        nodes; ``logical_workers`` caps the ranks (nodes x slots); ``total_steps``, the job's
        length in optimizer steps when known, tells the allocator the work it has left (rank
        weights). Invalid specs raise ValueError naming the field."""
        if max_nodes is None:
            max_nodes = logical_workers if logical_workers is not None else len(self.nodes)
        self.client.submit(job=job, command=list(command), env=dict(env or {}),
                           cwd=os.path.abspath(cwd) if cwd else os.getcwd(),
                           min_nodes=int(min_nodes), max_nodes=int(max_nodes),
                           logical_workers=logical_workers, weight=float(weight),
                           priority=int(priority),
                           total_steps=None if total_steps is None else int(total_steps))
        self._note(f"job {job} submitted ({min_nodes}..{max_nodes} nodes)")

    def cancel(self, job: str, reason: str = "cancelled by the user") -> None:
        self.client.cancel(job=job, reason=reason)

    def status(self) -> Dict[str, Any]:
        """The allocator's status document (nodes, jobs, last decision), as a dict."""
        if self._service is not None:
            text = self._service.status_json()
            if text:
                return json.loads(text)
        try:
            return json.loads(self.client.status_json())
        except MalleError as e:  # not published yet (a daemon that is starting)
            log.debug("no allocator status yet: %s", e)
            return {"nodes": [], "jobs": []}

    def jobs(self) -> Dict[str, Dict[str, Any]]:
        return {j["job"]: j for j in self.status().get("jobs", [])}

    def report(self, job: str) -> Optional[Dict[str, Any]]:
        """The job's latest advisor report (dict), or None."""
        text = self.client.report_json(job)
        return None if text is None else json.loads(text)

    def wait(self, jobs: Optional[Sequence[str]] = None, *, timeout: float = 600.0,
             poll: float = 0.5, on_poll=None) -> Dict[str, Dict[str, Any]]:
        """Waits until the given jobs (default: all submitted) have ended; returns their status.
        Raises MalleTimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            js = self.jobs()
            self._note_job_changes(js)
            names = list(jobs) if jobs is not None else list(js)
            if names and all(js.get(n, {}).get("phase") in _ENDED for n in names):
                return {n: js[n] for n in names}
            if on_poll is not None:
                on_poll(self)
            if time.monotonic() >= deadline:
                raise MalleTimeoutError(
                    f"jobs did not end within {timeout:g} s: "
                    + ", ".join(f"{n}={js.get(n, {}).get('phase', 'unknown')}" for n in names))
            time.sleep(poll)

    def _note_job_changes(self, js: Dict[str, Dict[str, Any]]) -> None:
        """Notes what changed in a job since the last poll: an incarnation started, the job
        parked (the step and what it cost), resumed from its parked state, ended."""
        for name, j in js.items():
            now = (j.get("phase"), j.get("runtime_id"), j.get("parks", 0))
            before = self._seen_jobs.get(name)
            self._seen_jobs[name] = now
            if before == now:
                continue
            phase, runtime, parks = now
            park = j.get("park") or {}
            if before is not None and parks > before[2] and park:
                self._note(f"job {name} parked at step {park.get('step', 0)} "
                           f"({park.get('bytes', 0) / 1e6:.2f} MB in {park.get('park_s', 0):.2f} s"
                           f" to {self.park_dir / name})")
            if phase == "running" and runtime and (before is None or runtime != before[1]):
                if parks and park:
                    self._note(f"job {name} resumed from its parked state at step "
                               f"{park.get('step', 0)} as {runtime}")
                elif before is not None and before[1]:
                    self._note(f"job {name} started again as {runtime}")
            if phase in _ENDED and (before is None or before[0] != phase):
                self._note(f"job {name} {phase} at step {j.get('step', 0)}"
                           + (f" ({j['message']})" if phase != "succeeded" and j.get("message") else ""))

    # --- end ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stops the trace, every agent (SIGINT, then SIGKILL after 15 s; ranks die with their
        agent) and the allocator."""
        if self.closed:
            return
        self.closed = True
        with self._lock:  # node_up refuses from here on: no agent is started after this list
            self._stop.set()
            agents = dict(self._agents)
        if self._trace_thread is not None:
            self._trace_thread.join(timeout=5)
        for p in agents.values():
            if p.poll() is None:
                try:
                    p.signal(signal.SIGINT)
                except MalleError:  # exited meanwhile
                    pass
        deadline = time.monotonic() + 15
        for node, p in agents.items():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except MalleTimeoutError:
                p.kill(timeout=10)
        if self._outage_thread is not None:  # its waits end with the agents
            self._outage_thread.join(timeout=5)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        try:
            self.stop_allocator()
        finally:
            if self._store_proc is not None and self._store_proc.poll() is None:
                self._store_proc.kill(timeout=10)
            if self._own_dir and not self._keep_logs:
                import shutil
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:7.1f}s  {what}")


def format_status(status: Dict[str, Any]) -> str:
    """The status document as the table ``malletrain status`` prints."""
    lines = []
    nodes = status.get("nodes", [])
    lines.append(f"{'node':<10} {'phase':<11} {'planned':<16} {'running':<18} {'seen':>6}")
    for n in nodes:
        lines.append(f"{n['node']:<10} {n['phase']:<11} {str(n.get('planned') or '-'):<16} "
                     f"{str(n.get('running') or '-'):<18} {n.get('last_seen_s_ago', 0):5.1f}s")
    lines.append("")
    lines.append(f"{'job':<16} {'phase':<10} {'nodes':>5} {'running':>7} {'samples/s':>10} "
                 f"{'step':>6} {'saved state':>16} {'productive':>11} {'held idle':>10}  message")
    parks = []
    for j in status.get("jobs", []):
        held = j.get("held") or {}
        lines.append(f"{j['job']:<16} {j['phase']:<10} {len(j.get('nodes', [])):>5} "
                     f"{j.get('running_nodes', 0):>7} {j.get('samples_per_s', 0):>10.1f} "
                     f"{j.get('step', 0):>6} {saved_state(j):>16} "
                     f"{held.get('productive_node_s', 0):>10.1f}s "
                     f"{held.get('held_idle_node_s', 0):>9.1f}s  {j.get('message', '')}")
        if j.get("park"):
            parks.append(park_summary(j))
    if parks:
        lines.append("")
        lines.extend(parks)
    total = status.get("held")
    if total:
        lines.append("")
        lines.append(held_summary(total))
    d = status.get("last_decision")
    if d:
        lines.append("")
        lines.append(f"last decision: plan {d['plan']} by {d['policy']}: {d['reason']}")
    a = status.get("allocator")
    if a:
        lines.append(f"allocator: epoch {a['epoch']}, {a['accepted']} messages accepted, "
                     f"{a['rejected']} rejected"
                     + (f" (last: {a['last_rejection']})" if a.get("last_rejection") else ""))
    return "\n".join(lines)


def saved_state(job: Dict[str, Any]) -> str:
    """The job's newest state in its park store and its age: "park@40 3s ago", "snap@20 1s ago"
    or "-" (none reported)."""
    saved = job.get("saved")
    if not saved:
        return "-"
    kind = "park" if saved.get("kind") == "park" else "snap"
    return f"{kind}@{saved.get('step', 0)} {saved.get('age_s', 0):.0f}s ago"


def park_summary(job: Dict[str, Any]) -> str:
    """One line on a job's parks: how many, the last one's step, size and measured cost."""
    p = job["park"]
    unpark = f"{p.get('unpark_s', 0):.2f} s" + ("" if p.get("unpark_measured") else " (est.)")
    return (f"{job['job']}: parked {job.get('parks', 0)}x, last at step {p.get('step', 0)} "
            f"({p.get('bytes', 0) / 1e6:.1f} MB in {p.get('park_s', 0):.2f} s), unpark {unpark}")


def held_summary(held: Dict[str, Any]) -> str:
    """One line on node time: productive vs held without training (docs/operations.md)."""
    return (f"node time held: {held.get('held_node_s', 0):.1f} node-s, productive "
            f"{held.get('productive_node_s', 0):.1f}, held without training "
            f"{held.get('held_idle_node_s', 0):.1f} ({held.get('held_idle_pct', 0):.1f} %: starting "
            f"{held.get('starting_node_s', 0):.1f}, warming {held.get('warming_node_s', 0):.1f}, "
            f"draining {held.get('draining_node_s', 0):.1f})")


def live_table(cluster: LocalCluster) -> str:
    """One compact line per job and node, for a terminal that follows a run."""
    st = cluster.status()
    t = time.monotonic() - cluster.t0
    up = cluster.live_nodes()
    jobs = "  ".join(f"{j['job']}:{j['phase'] if j['phase'] == 'parked' else j['phase'][:3]}"
                     f"@{len(j.get('nodes', []))}(step {j.get('step', 0)}"
                     + (f", {saved_state(j)}" if j.get("saved") else "") + ")"
                     for j in st.get("jobs", []))
    plan = (st.get("last_decision") or {}).get("plan", 0)
    return f"[{t:6.1f}s] nodes up {len(up)} {sorted(up)}  plan {plan}  {jobs}"


def run_local_cli(args: Any) -> int:
    """``malletrain local --nodes N --idle-trace FILE -- COMMAND``: one job under the embedded
    allocator on N local nodes that follow the trace. Exit codes: 0 the job succeeded, 1 it
    failed or was cancelled, 2 bad input, 124 timeout."""
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("malletrain local: give the program to run after --, e.g. -- python train.py",
              file=sys.stderr)
        return 2
    try:
        events = load_idle_trace(args.idle_trace, time_scale=args.time_scale)
        nodes = [f"n{i}" for i in range(args.nodes)]
        slots = 1 if getattr(args, "slots", None) is None else args.slots
        with LocalCluster(nodes, policy=args.policy, grace=args.grace,
                          workdir=args.log_dir, keep_logs=args.log_dir is not None,
                          park_dir=args.park_dir, slots=slots,
                          zygote=not getattr(args, "cold", False)) as cluster:
            cluster.follow_trace(events)
            lw = args.logical_workers
            cluster.submit(args.job_id, command, min_nodes=1,
                           max_nodes=min(args.nodes, max(1, lw // slots)) if lw else args.nodes,
                           logical_workers=lw)
            last = [0.0]

            def show(c: LocalCluster) -> None:
                if time.monotonic() - last[0] >= 2:
                    last[0] = time.monotonic()
                    print(live_table(c), flush=True)

            try:
                final = cluster.wait([args.job_id], timeout=args.timeout, on_poll=show)
            except MalleTimeoutError as e:
                print(f"malletrain local: {e}", file=sys.stderr)
                return 124
            print(format_status(cluster.status()))
            print("\n".join(cluster.events))
            print(f"logs: {cluster.log_dir}" if args.log_dir else "")
            return 0 if final[args.job_id]["phase"] == "succeeded" else 1
    except (MalleValueError, OSError) as e:
        print(f"malletrain local: {e}", file=sys.stderr)
        return 2
