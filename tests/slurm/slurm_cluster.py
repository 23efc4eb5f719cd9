"""A private, single-host Slurm for tests: munged, slurmctld and slurmd with a generated config.

Everything lives in one scratch directory (config, munge key, state, spool, logs, pid files;
the munge socket has a small directory of its own in /tmp); nothing under /etc is read or
written (``SLURM_CONF`` points the commands at the generated config, ``AuthInfo=socket=``
points Slurm at the private munged, and munged is given its own ``--key-file``, ``--socket``,
``--pid-file``, ``--seed-file`` and ``--log-file``). The daemons run in the foreground as
children of this process (and die with it) and are stopped by their pids; the ports are free
ones picked at start. It needs root (slurmd starts jobs as their users, munged
authenticates them) and the Debian packages ``slurmctld slurmd slurm-client munge``, which
:func:`ensure_installed` installs with apt-get when they are missing.

Partitions (``PreemptType=preempt/partition_prio``):

- ``scavenger``: ``PriorityTier=1``, ``PreemptMode=CANCEL``, ``GraceTime`` as given; where
  harvested node agents run.
- ``main`` (the default): ``PriorityTier=10``, ``PreemptMode=OFF``; the cluster's real work,
  which preempts scavenger jobs.

Why CANCEL rather than REQUEUE: the harvester resubmits an agent whose job ended anyway (it must,
for jobs that end for any other reason), and a fresh submission gets a fresh forecast
(``--idle_until``) and a fresh node id, so the allocator never sees a reclaimed node come back
under the same name. REQUEUE would also work (the batch script names the node after the job id
and its restart count), but adds Slurm's requeue delay before the job may start again.

``SlurmctldParameters=preempt_send_user_signal`` makes Slurm deliver the preemption notice as the
job's own ``--signal`` (``B:TERM``: to the batch shell only, which the agent replaced with
``exec``). Without it (checked with Slurm 22.05), the grace-time SIGTERM goes to the job's steps
only, so a batch script without steps hears nothing until the grace time is over, when every
process of the job, ranks included, gets SIGTERM and then SIGKILL; with ``srun`` steps every
process of the step gets it at once. Either way a rank dies instead of leaving at a step
boundary. (Slurm 22.05 reads the flag from SlurmctldParameters only; newer versions also accept
``PreemptParameters=send_user_signal``.) docs/slurm.md explains this.

The node declares more CPUs than the machine has (``SlurmdParameters=config_overrides``): one
single-CPU scavenger slot per harvested "node", on a 2-core machine.

Command line (for trying things by hand)::

    python tests/slurm/slurm_cluster.py --dir /tmp/myslurm      # starts, prints the env, waits
    # in another shell: export SLURM_CONF=/tmp/myslurm/slurm.conf; sinfo; sbatch ...
    # Ctrl-C: cancels every job, then stops slurmd, slurmctld and munged by pid.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
PROGRAMS = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
            "squeue": "slurm-client", "scancel": "slurm-client", "sinfo": "slurm-client",
            "scontrol": "slurm-client", "munged": "munge", "mungekey": "munge"}
SBIN = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]


class SlurmSetupError(RuntimeError):
    """The private Slurm could not be installed or started (the message says which step)."""


def find_program(name: str) -> Optional[str]:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN:
        p = Path(d) / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def missing_programs() -> List[str]:
    return [p for p in PROGRAMS if find_program(p) is None]


def can_install() -> Optional[str]:
    """None if :func:`ensure_installed` can work here, else why not (for a skip reason)."""
    if not missing_programs():
        return None if os.geteuid() == 0 else "not root: slurmd and munged must run as root"
    if os.geteuid() != 0:
        return f"not root (needed to apt-get install {' '.join(PACKAGES)} and run slurmd)"
    if find_program("apt-get") is None:
        return f"no apt-get to install {' '.join(PACKAGES)} (missing: {missing_programs()})"
    return None


def ensure_installed(timeout: float = 900.0) -> None:
    """apt-get installs the Slurm and munge packages if a program is missing. Blocks; raises
    SlurmSetupError with apt's output on failure."""
    missing = missing_programs()
    if not missing:
        return
    why = can_install()
    if why:
        raise SlurmSetupError(why)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SlurmSetupError(f"{' '.join(cmd)}: no result within {timeout:g} s") from None
        if r.returncode != 0:
            raise SlurmSetupError(f"{' '.join(cmd)} failed (exit {r.returncode}): "
                                  f"{(r.stderr or r.stdout)[-2000:]}")
    still = missing_programs()
    if still:
        raise SlurmSetupError(f"after apt-get install {' '.join(PACKAGES)}, still missing: {still}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateSlurm:
    """munged + slurmctld + slurmd in ``workdir`` (see the module doc).

    Args:
        workdir: scratch directory (created; default a new temporary one, removed at stop).
        cpus: CPUs the node declares (scavenger slots when each agent takes one).
        grace_time: the scavenger partition's GraceTime, seconds.
        preempt_mode: ``CANCEL`` or ``REQUEUE`` for the scavenger partition.
        send_user_signal: ``SlurmctldParameters=preempt_send_user_signal``.
        kill_wait: KillWait, seconds between the final SIGTERM and SIGKILL.
    """

    def __init__(self, workdir: Optional[str | os.PathLike] = None, *, cpus: int = 3,
                 grace_time: int = 15, preempt_mode: str = "CANCEL",
                 send_user_signal: bool = True, kill_wait: int = 5) -> None:
        if preempt_mode not in ("CANCEL", "REQUEUE"):
            raise ValueError(f"preempt_mode: CANCEL or REQUEUE, got {preempt_mode!r}")
        self._own_dir = workdir is None
        self.dir = Path(tempfile.mkdtemp(prefix="malle-slurm-") if workdir is None else workdir)
        self.cpus = int(cpus)
        self.grace_time = int(grace_time)
        self.preempt_mode = preempt_mode
        self.send_user_signal = send_user_signal
        self.kill_wait = int(kill_wait)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self._socket_dir: Optional[Path] = None
        self.procs: Dict[str, subprocess.Popen] = {}
        self._logs: List = []
        self.started = False

    # --- paths and environment ----------------------------------------------------------
    @property
    def munge_socket(self) -> Path:
        assert self._socket_dir is not None, "start() first"
        return self._socket_dir / "munge.socket"

    @property
    def env(self) -> Dict[str, str]:
        """The environment the Slurm commands need (this process's plus SLURM_CONF)."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def log_text(self, name: str, tail: int = 4000) -> str:
        p = self.dir / "log" / f"{name}.log"
        return p.read_text(errors="replace")[-tail:] if p.exists() else f"({p} missing)"

    # --- start ---------------------------------------------------------------------------
    def _write_config(self) -> None:
        d = self.dir
        for sub, mode in (("", 0o755), ("run", 0o755), ("key", 0o700), ("state", 0o700),
                          ("spool", 0o755), ("log", 0o755), ("jobs", 0o755)):
            (d / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(d / sub, mode)
        # munged refuses a socket under a directory that is not searchable by all (pytest's
        # tmp_path is 0700): the socket gets a directory of its own in /tmp, removed at stop.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="malle-munge-"))
        os.chmod(self._socket_dir, 0o755)
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_port()
        sched = ["bf_interval=2", "bf_continue"]
        lines = [
            "# Generated by tests/slurm/slurm_cluster.py: a private one-host Slurm for tests.",
            "ClusterName=malletest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups (the test machine may not delegate them): processes are tracked by
            # parentage, tasks are not bound.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=" + ",".join(sched),
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            *(["SlurmctldParameters=preempt_send_user_signal"] if self.send_user_signal else []),
            f"KillWait={self.kill_wait}",
            "MinJobAge=60",
            "ReturnToService=2",
            "SlurmdTimeout=60",
            "SlurmctldTimeout=30",
            "MessageTimeout=10",
            "SlurmdParameters=config_overrides",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=2000 "
            "State=UNKNOWN",
            f"PartitionName=main Nodes={self.node} Default=YES PriorityTier=10 PreemptMode=OFF "
            "MaxTime=INFINITE State=UP",
            f"PartitionName=scavenger Nodes={self.node} PriorityTier=1 "
            f"PreemptMode={self.preempt_mode} GraceTime={self.grace_time} MaxTime=INFINITE "
            "State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, args: List[str]) -> subprocess.Popen:
        log = open(self.dir / "log" / f"{name}.stdout", "ab")
        self._logs.append(log)
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env, cwd=self.dir, preexec_fn=_die_with_parent)
        self.procs[name] = p
        return p

    def _run(self, args: List[str], timeout: float = 20.0) -> subprocess.CompletedProcess:
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, timeout: float = 90.0) -> "PrivateSlurm":
        """Writes the config and starts munged, slurmctld and slurmd; returns when the node is
        idle. Blocks; raises SlurmSetupError (with the daemons' logs) after ``timeout``."""
        ensure_installed()
        self.started = True  # from here on, stop() undoes what was done
        try:
            self._write_config()
            key = self.dir / "key" / "munge.key"
            r = subprocess.run([find_program("mungekey"), "--create", "--force",
                                f"--keyfile={key}"], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise SlurmSetupError(f"mungekey --create failed: {r.stderr.strip()}")
            self._spawn("munged", [
                find_program("munged"), "--foreground", f"--key-file={key}",
                f"--socket={self.munge_socket}", f"--pid-file={self.dir / 'run' / 'munged.pid'}",
                f"--seed-file={self.dir / 'key' / 'munged.seed'}",
                f"--log-file={self.dir / 'log' / 'munged.log'}"])
            self._wait("munged's socket", lambda: self.munge_socket.exists(), 20)
            # -c: a clean start (no saved state); -i: ignore a stale state instead of failing.
            self._spawn("slurmctld", [find_program("slurmctld"), "-D", "-c", "-i", "-f",
                                      str(self.conf)])
            self._wait("slurmctld to answer", lambda: self._run(
                [find_program("scontrol"), "ping"], timeout=10).stdout.find("UP") >= 0, 40)
            self._spawn("slurmd", [find_program("slurmd"), "-D", "-f", str(self.conf),
                                   "-N", self.node])
            deadline = time.monotonic() + timeout

            def node_idle() -> bool:
                r = self._run([find_program("sinfo"), "-h", "-n", self.node, "-o", "%T"], 10)
                return r.returncode == 0 and r.stdout.strip().startswith("idle")

            self._wait("the node to be idle", node_idle, max(5.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, what: str, cond, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SlurmSetupError(f"{name} exited with {p.returncode} while waiting for "
                                          f"{what}:\n{self.logs()}")
            try:
                if cond():
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.3)
        raise SlurmSetupError(f"timed out after {timeout:g} s waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            parts.append(f"--- {name}.log\n{self.log_text(name, 2500)}")
            out = self.dir / "log" / f"{name}.stdout"
            if out.exists() and out.stat().st_size:
                parts.append(f"--- {name}.stdout\n{out.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    # --- stop ----------------------------------------------------------------------------
    def cancel_all_jobs(self, timeout: float = 60.0) -> None:
        """scancel of every job, then waits until slurmd runs none (no step daemon left).
        Blocks at most ``timeout`` seconds; never raises."""
        if "slurmctld" not in self.procs or self.procs["slurmctld"].poll() is not None:
            return
        try:
            self._run([find_program("scancel"), "--full", "--user=root"], timeout=20)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r = self._run([find_program("squeue"), "-h", "-o", "%i %T"], timeout=10)
                if r.returncode == 0 and not r.stdout.strip() and not self._stepd_sockets():
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)

    def _stepd_sockets(self) -> List[Path]:
        return [p for p in (self.dir / "spool").glob(f"{self.node}_*") if p.is_socket()]

    def stop(self) -> None:
        """Cancels every job, then stops slurmd, slurmctld and munged by pid (SIGTERM, then
        SIGKILL after 15 s each), then, as a last resort, kills by pid any process still
        carrying this Slurm's SLURM_CONF in its environment (a job that outlived its
        slurmstepd). Never raises; removes the scratch directory if it made it."""
        if not self.started:
            return
        self.started = False
        self.cancel_all_jobs()
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for pid in leftover_pids(str(self.conf)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for log in self._logs:
            log.close()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "PrivateSlurm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies, so a test run
    that is killed -9 (no finally) leaves no daemon behind."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def leftover_pids(slurm_conf: str) -> List[int]:
    """Pids of processes (other than this one) whose environment says SLURM_CONF=slurm_conf:
    what was started through this private Slurm (jobs inherit the submitter's environment)."""
    marker = f"SLURM_CONF={slurm_conf}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in env.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Runs a private one-host Slurm until Ctrl-C.")
    p.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--cpus", type=int, default=3)
    p.add_argument("--grace-time", type=int, default=15)
    p.add_argument("--preempt-mode", default="CANCEL", choices=["CANCEL", "REQUEUE"])
    args = p.parse_args(argv)
    if can_install():
        print(f"slurm_cluster: {can_install()}", file=sys.stderr)
        return 2
    slurm = PrivateSlurm(args.dir, cpus=args.cpus, grace_time=args.grace_time,
                         preempt_mode=args.preempt_mode)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        slurm.start()
        print(f"export SLURM_CONF={slurm.conf}", flush=True)
        print(f"pids: " + ", ".join(f"{n}={p.pid}" for n, p in slurm.procs.items()), flush=True)
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except SlurmSetupError as e:
        print(f"slurm_cluster: {e}", file=sys.stderr)
        return 1
    finally:
        slurm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
