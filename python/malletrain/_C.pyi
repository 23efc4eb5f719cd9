"""Type stub of malletrain._C, the private C++ extension (python/src/bind_*.cc).

Use the public ``malletrain`` package instead; this module's API may change
between releases. Every function that fails raises a class of
``malletrain.errors`` (never a bare ``RuntimeError`` from C++).
"""

from collections.abc import Callable
from typing import Any, Optional

import torch

def version() -> str:
    """malletrain version this extension was built as (CMake's PROJECT_VERSION)."""

def torch_version() -> str:
    """``torch.__version__`` of the torch this extension was compiled against."""

def set_log_level(level: str) -> None:
    """Sets the threshold of libmalle's log, written to stderr.

    Args:
        level: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"`` (any case).

    Raises:
        malletrain.errors.MalleValueError: ``level`` is none of these.
    """

def get_log_level() -> str:
    """Current threshold of libmalle's log: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``."""

def _raise_status(code: int, message: str, error_class: str | None = None) -> None:
    """Test hook: throws a C++ StatusError with ``code`` and ``message``.

    The binding's translator turns it into ``malletrain.errors._from_status(code, message,
    error_class)``; ``error_class`` is sent as the status payload ``malletrain/error_class``.

    Raises:
        malletrain.errors.MalleError: always (the subclass depends on ``code``);
            ``MalleValueError`` if ``code`` is not in [1, 16].
    """

def _status_code_names() -> dict[int, str]:
    """Abseil's name of every status code, e.g. ``{4: "DEADLINE_EXCEEDED", ...}``."""

def alloc_solve(problem_json: str, options_json: str) -> str:
    """Decides an allocation (``malletrain.alloc.solve`` is the public API).

    Args:
        problem_json: a problem, JSON version 1 (``docs/allocator-json.md``).
        options_json: ``{"policy", "time_limit_s", "isolation", "relative_gap",
            "horizon_buckets"}``, every key optional; ``""`` means all defaults.

    Returns:
        The decision as compact JSON. Releases the GIL; blocks for up to the MILP
        time limit plus its kill grace.

    Raises:
        malletrain.errors.MalleValueError: invalid problem or options; the message
            starts with the JSON path of the field.
        malletrain.errors.MalleError: the allocator failed otherwise.
    """

def alloc_validate(problem_json: str) -> str:
    """Checks a problem; returns ``"ok: N jobs, M nodes, K pools"``. Releases the GIL.

    Raises:
        malletrain.errors.MalleValueError: the problem is invalid (JSON path first).
    """

class IdleTrace:
    """A loaded idle-node trace (opaque; see malletrain.sim.load_trace)."""

    @property
    def num_nodes(self) -> int: ...
    @property
    def num_events(self) -> int: ...
    @property
    def rows(self) -> int: ...
    @property
    def redundant_rows(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def rejected(self) -> list[tuple[str, int, str]]: ...
    @property
    def swf_report(self) -> dict[str, Any] | None:
        """What the SWF replay did (sim_load_swf), or None for a CSV trace."""

class JobMix:
    """A loaded job mix (opaque; see malletrain.sim.load_job_mix)."""

    @property
    def num_jobs(self) -> int: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def rejected(self) -> list[tuple[str, int, str]]: ...
    def to_csv(self) -> str:
        """The mix in the job-mix CSV format."""

class SyntheticMixOptions:
    """Ranges of a synthetic job mix; defaults from C++ (malletrain.sim.synthetic_job_mix)."""

    first_submit: float
    mean_interarrival_s: float
    min_nodes_lo: int
    min_nodes_hi: int
    max_nodes_lo: int
    max_nodes_hi: int
    rate_lo: float
    rate_hi: float
    serial_lo: float
    serial_hi: float
    work_hours_lo: float
    work_hours_hi: float
    rescale_up_s_lo: float
    rescale_up_s_hi: float
    rescale_down_s_lo: float
    rescale_down_s_hi: float
    def __init__(self) -> None: ...

class SimOptions:
    """Options of one replay; field meanings in malletrain.sim.simulate."""

    policy: str
    objective: str
    resize_cost: str
    accounting: str
    preemption_cost: str
    state_bytes: float
    write_bytes_per_s: float
    read_bytes_per_s: float
    copy_bytes_per_s: float
    park_fixed_s: float
    unpark_fixed_s: float
    snapshot_interval_s: float
    snapshot_budget: float
    curves: str
    forecast: str
    node_classes: str
    cross_locality_factor: float
    reclaim_hazard: bool
    resize_hysteresis: float
    rank_weight_exponent: float
    forward_window_s: float
    debounce_s: float
    max_waiting: int
    learned_warmup_s: float
    time_limit_s: float
    skip_snapshots: int
    start: float
    end: float
    align_submit_times: bool
    seed: int
    record_events: bool
    timeline_step_s: float
    def __init__(self) -> None: ...

def sim_load_trace(path: str, strict: bool = False) -> IdleTrace:
    """Loads an idle-node trace (.csv or .csv.gz). Raises MalleValueError for bad rows
    (strict) or a bad header, MalleError(NOT_FOUND) for a missing file."""

def sim_load_swf(
    path: str,
    strict: bool = False,
    nodes: int = 0,
    procs_per_node: int = 0,
    unknown_wait_is_zero: bool = False,
) -> IdleTrace:
    """Loads an SWF log (.swf or .swf.gz) and derives its idle-node trace (0: sizes from the
    header). Raises MalleValueError for a bad line (strict) or an unknown machine size,
    MalleError(NOT_FOUND) for a missing file."""

def sim_load_job_mix(path: str, strict: bool = False) -> JobMix:
    """Loads a job-mix CSV file."""

def sim_repeat_mix(mix: JobMix, copies: int, period_s: float) -> JobMix:
    """copies of the mix, copy k submitted k x period_s later. Raises MalleValueError for
    copies outside [1, 1000] or a negative period."""

def sim_synthetic_job_mix(n: int, seed: int, options: SyntheticMixOptions) -> JobMix:
    """Draws n jobs from seed (deterministic). Raises MalleValueError naming a bad option."""

def sim_run(
    trace: IdleTrace,
    mix: JobMix,
    options: SimOptions,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Replays `trace` with `mix`; returns {"summary": dict, "jobs": [dict], "timeline":
    [tuple], "events": [tuple]}. Releases the GIL for the replay."""

def sim_worse_user_figures(ours: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """The figures users feel ('samples/nh', 'JCT mean', 'JCT p95', 'eff') where the summary
    `ours` is worse than `base`."""

def sim_dominated_on_user_figures(ours: dict[str, Any], base: dict[str, Any]) -> bool:
    """`base` at least as good as `ours` on all four figures users feel, better on one."""

# --- comm (bind_comm.cc): the store and the elastic group; used by launchers, tools, tests ---

class ControlStore:
    """A client of the deployment's key-value store (a c10d TCPStore)."""

    @staticmethod
    def serve(host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> ControlStore:
        """Starts a store server (port 0: ephemeral) and returns a client; the server lives
        as long as this handle."""
    @staticmethod
    def connect(host: str, port: int, timeout: float = 30.0) -> ControlStore:
        """Connects to a running server, retrying until ``timeout`` seconds."""
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    def set(self, key: str, value: bytes) -> None: ...
    def try_get(self, key: str) -> bytes | None:
        """The value of ``key``, or None if it does not exist (does not wait)."""
    def add(self, key: str, delta: int) -> int: ...

class Transition:
    """What happened at a step boundary (or at join)."""

    kind: str  # none, bootstrap, joined, planned, recovered, left, excluded
    generation: int
    rank: int
    size: int
    members: list[str]
    joined: list[str]
    removed: list[str]
    resume_step: int
    state_source_rank: int
    committed_by_rank: list[int]
    reason: str
    phases: dict[str, float]  # seconds: detect, wait, agree, build, sync, total
    changed: bool
    active: bool

class PendingCollective:
    def wait(self) -> None:
        """Blocks until done; raises RankFailureError if the generation failed."""
    def done(self) -> bool: ...

class ElasticGroup:
    """Membership of one job as a sequence of generations (libmalle/comm/elastic_group.h)."""

    @staticmethod
    def join(
        store: ControlStore,
        job_id: str,
        member_id: str = "",
        bootstrap_size: int = 0,
        max_size: int = 1024,
        rendezvous_timeout: float = 60.0,
        op_timeout: float = 60.0,
        heartbeat_interval: float = 0.1,
        heartbeat_timeout: float = 2.0,
        recovery_grace: float = 0.5,
        max_recoveries_without_commit: int = 16,
        data_backend: str = "gloo",
    ) -> ElasticGroup:
        """Registers in the job and blocks until this process is a member of a built
        generation. data_backend: 'gloo' (CPU tensors), 'gloo-cuda' (also CUDA tensors,
        through host memory) or 'nccl' (CUDA tensors, one GPU per rank). Raises
        MalleValueError, MalleTimeoutError, StoreError, ..."""
    rank: int
    size: int
    generation: int
    members: list[str]
    member_id: str
    job_id: str
    active: bool
    last_transition: Transition
    committed_step: int
    comm_failed: bool
    def commit(self, step: int) -> None: ...
    def at_step_boundary(self) -> Transition: ...
    def begin_step_boundary(self) -> None:
        """Starts the next boundary's vote without waiting for it (call it once the step's
        gradients are reduced; at_step_boundary() completes it)."""
    def request_leave(self) -> None: ...
    def finish(self) -> None:
        """Done with the job together with the others: closing will not fail the generation."""
    def allreduce(self, tensors: list[torch.Tensor], op: str = "sum") -> None: ...
    def allreduce_async(self, tensors: list[torch.Tensor], op: str = "sum") -> PendingCollective: ...
    def broadcast(self, tensors: list[torch.Tensor], root: int) -> None: ...
    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None: ...
    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None: ...
    def barrier(self) -> None: ...

def request_leave(store: ControlStore, job_id: str, member_id: str) -> None:
    """Queues a planned leave of ``member_id`` at the job's next step boundary."""

def latest_generation(store: ControlStore, job_id: str) -> dict[str, Any] | None:
    """The newest generation of a job as {generation, members, nodes, reason}, or None."""

def report_dead(store: ControlStore, job_id: str, member_id: str) -> None:
    """Reports that the process of ``member_id`` exited (its owner saw it), so a recovery
    stops waiting for its check-in."""

# --- elastic (bind_elastic.cc): the engine under malletrain.elastic (libmalle/elastic/engine.h) ---

class WorkerPlan:
    worker: int
    rng_seed: int     # the model stream: seeded when the loader hands the micro-batch over
    data_seed: int    # the data stream: seeded before the micro-batch is fetched
    indices: list[int]

class StepPlan:
    step: int
    generation: int
    rank: int
    size: int
    workers: list[WorkerPlan]
    lr_rescale: float  # follow mode: multiply every learning rate by this before the step

class ResizeEvent:
    kind: str
    generation: int
    size: int
    rank: int
    resume_step: int
    joined: list[str]
    removed: list[str]
    state_bytes: int
    state_in_place: int
    state_landed: int
    state_received_remote: int  # from a rank on another node (MALLE_NODE)
    state_sent_remote: int      # to ranks on other nodes
    state_sent_local: int       # to ranks on this rank's node (a relay's copies)
    reason: str
    @property
    def phases(self) -> dict[str, float]: ...

class Engine:
    """One process's membership in an elastic job and the engine that trains it. Checks its
    options (MalleValueError naming the field) before it dials the store. Callbacks of parts
    run on the calling thread; a Python exception inside one is re-raised as it is."""
    def __init__(self, env: RankEnv, rendezvous_timeout: float, op_timeout: float,
                 heartbeat_interval: float, heartbeat_timeout: float, recovery_grace: float,
                 max_recoveries_without_commit: int, backend: str, logical_workers: int,
                 lr_scaling: str, seed: int, deterministic: bool, bucket_bytes: int,
                 snapshot_every: int = 0, resume_from: str = "") -> None:
        """The engine of this rank, set up from its environment (rank_engine.h); backend "":
        the environment's, else gloo."""
    def set_model(self, parameters: list[tuple[str, Any]], buffers: list[tuple[str, Any]]) -> None:
        """Flattens them (same tensor objects, new storage) and builds the Reducer."""
    def add_part(self, name: str, save: Any, load: Any, checkpoint: Any = None,
                 restore: Any = None) -> None:
        """save() -> (tensors, bytes); load(tensors, bytes); checkpoint/restore: what a step
        that does not commit must undo."""
    def set_data(self, num_samples: int, batch_size: int, steps: int | None,
                 epochs: float | None, shuffle: bool, drop_last: bool = True) -> None: ...
    def prepare_landing(self) -> None: ...
    def join(self) -> None: ...
    def next_step(self) -> StepPlan | None:
        """Rolls back a failed step, runs the step boundary (blocks), returns the plan."""
    def begin_micro_batch(self, index: int) -> None: ...
    def end_micro_batch(self) -> None: ...
    def add_data_wait(self, seconds: float) -> None: ...
    def synchronize(self) -> bool:
        """Reduces gradients and buffers (blocks); False: the step failed and will be redone."""
    def commit(self) -> None: ...
    def request_leave(self) -> None: ...
    def finish(self) -> None: ...
    def close(self) -> None: ...
    def state_digest(self) -> str: ...
    def report_json(self) -> str: ...
    def report_table(self) -> str: ...
    def keys_from(self, plan: StepPlan) -> BatchKeys:
        """This rank's micro-batches from ``plan`` on, for a loader that prefetches."""
    def data_seed(self, step: int, worker: int) -> int: ...
    def set_advisor_enabled(self, on: bool) -> None: ...
    def history(self, index: int) -> ResizeEvent: ...
    rank: int
    size: int
    generation: int
    member_id: str
    step: int
    total_steps: int
    micro_batch: int
    in_step: bool
    left: bool
    redone_steps: int
    workers: list[int]
    position: int
    landing_bytes: int
    advisor_seconds: float
    history_size: int
    group: ElasticGroup | None
    snapshot_step: int
    snapshot_interval: int
    snapshot_copy_seconds: float
    snapshot_write_seconds: float
    snapshot_write_cpu_seconds: float

class LaunchSession:
    """torchrun/srun: task 0 hosts the control store; members count themselves closed."""
    @staticmethod
    def open(launch: LaunchEnv, timeout: float) -> LaunchSession: ...
    hosting: bool
    def close(self, size: int, timeout: float) -> None: ...

class BatchKeys:
    """Iterates (data seed, dataset indices) of this rank's micro-batches, step after step."""
    def __iter__(self) -> BatchKeys: ...
    def __next__(self) -> tuple[int, list[int]]: ...
    def follows(self, plan: StepPlan, position: int) -> bool:
        """``plan`` is the next step under the same membership: the keys fetched still hold."""

class ElasticSampler:
    def __init__(self, num_samples: int, logical_workers: int, batch_size: int, seed: int,
                 shuffle: bool) -> None: ...
    num_samples: int
    logical_workers: int
    batch_size: int
    global_batch: int
    def steps_for_epochs(self, epochs: float, drop_last: bool = True) -> int: ...
    def epoch_of(self, step: int) -> int: ...
    def indices(self, step: int, worker: int) -> list[int]: ...
    def stream(self, position: int, count: int) -> list[int]: ...
    def sample_epochs(self, step: int, worker: int) -> list[int]: ...

def mix_seed(parts: list[int]) -> int: ...
def assign_workers(logical_workers: int, world_size: int, rank: int) -> list[int]: ...
def progress_key(job_id: str) -> str: ...
def state_layout_key(job_id: str) -> str: ...
def flatten_tensors(tensors: list[Any]) -> bool: ...

# --- advisor (bind_advisor.cc) ----------------------------------------------------------------

class Advisor:
    """The job profiling advisor (docs/advisor.md); one per rank."""

    def __init__(
        self,
        job: str,
        min_nodes: int,
        max_nodes: int,
        skip_steps_after_resize: int = 3,
        min_samples_per_config: int = 10,
    ) -> None: ...
    def record(
        self,
        step: int,
        world_size: int,
        logical_workers: int,
        local_batch: int,
        global_batch: int,
        data_wait_s: float,
        compute_s: float,
        comm_s: float,
        optimizer_s: float,
        resize_pause_s: float,
        total_s: float,
        after_resize: bool,
        after_failure: bool,
        warmup: bool,
    ) -> None:
        """One step's sample. Raises MalleValueError naming an implausible field."""
    def report_json(self) -> str:
        """Fits the model (GIL released) and returns the report as JSON."""

def advisor_report_table(report_json: str) -> str: ...
def advisor_validate_report(report_json: str) -> None: ...

# --- control plane (bind_control.cc) -----------------------------------------------------------

class Secret:
    """A deployment's shared secret; never printed."""

def load_secret(path: str) -> Secret:
    """Raises MalleValueError if the file is missing, not 0600/0400, not ours, or too short."""

def write_new_secret(path: str) -> None: ...
def sign_control_message(
    secret: Secret, sender: str, seq: int, ts: float, type: str, body_json: str
) -> str:
    """The signed wire text of one control message (docs/protocol.md)."""

class AllocatorService:
    """The allocator loop on a thread of this process (malletrain.cluster.LocalCluster)."""

    def __init__(
        self,
        store: ControlStore,
        secret: Secret,
        policy: str,
        journal: str,
        forward_window_s: float,
        heartbeat_timeout_s: float,
        debounce_s: float,
        report_min_interval_s: float,
        default_samples_per_s: float,
        max_rank_failures: int,
        objective: str,
        resize_hysteresis: float = 1.0,
        rank_weight_exponent: float = 0.0,
        reclaim_hazard: bool = False,
    ) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def status_json(self) -> str: ...
    def metrics_text(self) -> str: ...
    def stats(self) -> dict[str, Any]: ...

class Agent:
    """A node agent; run() blocks until stop() or a completed reclaim."""

    def __init__(
        self,
        store: ControlStore,
        secret: Secret,
        node: str,
        store_address: str,
        secret_path: str,
        log_dir: str,
        group: str,
        speed: float,
        idle_until: float | None,
        leave_timeout_s: float,
        extra_env: list[tuple[str, str]],
    ) -> None: ...
    def run(self) -> None: ...
    def reclaim(self, grace_s: float, reason: str) -> None: ...
    def stop(self, reason: str = "stopped") -> None: ...
    @property
    def agent_id(self) -> str: ...
    @property
    def plan_seen(self) -> int: ...

class ControlClient:
    """Submits jobs and reads the allocator's published status and reports."""

    def __init__(self, store: ControlStore, secret: Secret) -> None: ...
    def submit(
        self,
        job: str,
        command: list[str],
        env: dict[str, str],
        cwd: str,
        min_nodes: int,
        max_nodes: int,
        logical_workers: int | None,
        weight: float,
        priority: int,
        total_steps: int | None = None,
    ) -> None: ...
    def cancel(self, job: str, reason: str) -> None: ...
    def status_json(self) -> str: ...
    def report_json(self, job: str) -> str | None: ...

class Outbox:
    """Signs and sends a job's messages to the allocator (advisor reports, completion)."""

    def __init__(self, store: ControlStore, secret: Secret, sender: str) -> None: ...
    def send_advisor_report(self, job: str, report_json: str) -> None: ...
    def send_job_complete(
        self, job: str, status: str, steps: int, samples: int, message: str
    ) -> None: ...

# --- cluster: the rank environment contract (libmalle/cluster/rank_env.h) ---
class RankEnv:
    """The variables a starter sets for a rank process and the rank reads (MALLE_STORE, ...)."""
    store: str
    job_id: str
    member_id: str
    bootstrap_size: int
    control_job: str
    control_secret: str
    node: str
    min_nodes: int
    max_nodes: int
    backend: str
    park_dir: str
    local_rank: int
    local_world_size: int
    def __init__(self) -> None: ...
    @property
    def store_host(self) -> str: ...
    @property
    def store_port(self) -> int: ...
    def validate(self) -> None:
        """Raises MalleValueError naming the variable that is wrong."""
    def vars(self) -> dict[str, str]:
        """The environment variables a starter sets for this rank."""

def read_rank_env(environ: dict[str, str]) -> RankEnv:
    """Reads and validates the contract from a mapping (e.g. ``dict(os.environ)``).
    Raises MalleValueError naming the variable."""
def rank_env_names() -> list[str]: ...
def rank_cuda_device(env: RankEnv, visible_devices: int) -> int:
    """The CUDA device of a rank on NCCL: its LOCAL_RANK of the devices it sees. Raises
    MalleValueError naming the problem when there is none for it."""

class LaunchEnv:
    """Who started this rank (libmalle/cluster/rank_env.h ReadLaunchEnv): malletrain's
    launchers, torchrun or srun, translated into the contract (``rank``)."""
    @property
    def launcher(self) -> str: ...  # "malletrain", "torchrun", "srun"
    @property
    def rank(self) -> RankEnv: ...
    @property
    def global_rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def host_store(self) -> bool: ...
    @property
    def store_bind(self) -> str: ...
    @property
    def store_from(self) -> str: ...

def read_launch_env(environ: dict[str, str]) -> LaunchEnv:
    """MALLE_* first, then torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, then srun's
    SLURM_*; raises MalleValueError naming the variable."""

def open_store(address: str, timeout: float = 30.0) -> ControlStore:
    """'host:port' (a TCPStore server) or 'etcd://h1:p1,h2:p2,...[/ns]' (an etcd cluster)."""
def store_address(store: ControlStore) -> str: ...

class Zygote:
    """A warm interpreter (libmalle/cluster/zygote.h) that has imported ``preload`` and
    forks Python processes from that state: LocalProcess.spawn(..., zygote=z) uses it when
    that gives exactly what a new interpreter would (else the process starts cold)."""
    @staticmethod
    def start(python: str, *, preload: list[str] = ..., env: dict[str, str] = ...,
              log: str = "", import_time_env: list[str] = ...) -> Zygote: ...
    @property
    def pid(self) -> int: ...
    @property
    def python(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def failure(self) -> str: ...
    @property
    def warmup_s(self) -> Optional[float]: ...
    def wait_ready(self, timeout: float) -> None: ...

def import_time_variable(name: str) -> bool: ...

class LocalProcess:
    """A child process owned by this object (libmalle/cluster/local_process.h): it gets
    PR_SET_PDEATHSIG(SIGKILL) and is killed (with its group) when the object goes away.
    Exit codes follow subprocess.Popen: the code, or -signal."""
    @staticmethod
    def spawn(argv: list[str], *, env: dict[str, str] = ..., clear_env: bool = False,
              rank_env: Optional[RankEnv] = None, stdout: str = "", stderr: str = "",
              stderr_to_stdout: bool = False, truncate: bool = False, cwd: str = "",
              new_process_group: bool = False, zygote: Optional[Zygote] = None) -> LocalProcess:
        """Starts argv[0] (a path, or a name looked up in PATH). ``env`` is added to this
        process's environment (or replaces it: ``clear_env``), ``rank_env``'s variables last.
        Log files are opened before the fork; MalleValueError / MalleError name what is wrong.
        With ``zygote``, forked from it when it can start the process exactly (``warm``)."""
    @property
    def pid(self) -> int: ...
    @property
    def warm(self) -> bool: ...
    @property
    def cold_reason(self) -> str: ...
    @property
    def leads_group(self) -> bool: ...
    def poll(self) -> Optional[int]: ...
    def wait(self, timeout: float) -> int:
        """Raises MalleTimeoutError if it still runs after ``timeout`` seconds."""
    def signal(self, signal: int) -> None: ...
    def kill(self, timeout: float = 10.0) -> int: ...
ENV_STORE: str
ENV_JOB_ID: str
ENV_MEMBER_ID: str
ENV_BOOTSTRAP_SIZE: str
ENV_CONTROL_JOB: str
ENV_CONTROL_SECRET: str
ENV_NODE: str
ENV_MIN_NODES: str
ENV_MAX_NODES: str
ENV_BACKEND: str
ENV_LOCAL_RANK: str
ENV_LOCAL_WORLD_SIZE: str
ENV_SECRET: str
ENV_LOG_LEVEL: str
ENV_BIN_DIR: str
def generated_member_id() -> str: ...
