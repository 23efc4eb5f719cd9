"""Several "hosts" on this machine: Linux network namespaces joined by a bridge.

A :class:`Hosts` builds, for one test, a switch namespace holding a bridge and ``n`` host
namespaces, each with one veth ``eth0`` plugged into the bridge and its own address in a
private 10.x.y.0/24 subnet. Nothing is created in the machine's own network namespace: both
ends of every veth are created directly inside the test's namespaces, so the test's traffic
never leaves them. Names carry this process's pid and a random tag (unique per run).

Every process started through :meth:`Hosts.spawn` runs inside its host's namespace (``ip
netns exec``; the pid is the program's own) and is stopped by pid at :meth:`Hosts.close`
(SIGINT, SIGKILL after a timeout). ``close`` then deletes the namespaces, which removes the
bridge and every veth with them; it runs even when the test failed (use ``with``)::

    with Hosts(3) as hosts:
        p = hosts.spawn(0, ["python", "-m", "http.server", "8000", "--bind", hosts.addr(0)])
        hosts.partition(2)      # host 2's link goes down: nothing reaches it or leaves it
        hosts.heal(2)
        with hosts.inside(0):   # this thread's sockets opened here belong to host 0
            ...

:func:`unavailable` says why namespaces cannot be used here (not root, no ``ip``, no
permission), for ``pytest.skip``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

PREFIX = "mlt"            # every namespace of these tests: mlt<pid>-<tag>-<role>
_NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000


def _ip(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def unavailable() -> Optional[str]:
    """Why this machine cannot host the namespaces (None: it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2) on PATH"
    probe = f"{PREFIX}{os.getpid()}-probe{random.randrange(1 << 16):04x}"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return f"cannot create a network namespace: {e}"
    try:
        _ip("netns", "delete", probe)
    except (RuntimeError, OSError, subprocess.SubprocessError):
        pass
    return None


def remove_stale() -> List[str]:
    """Deletes namespaces of this module left by a test process that no longer exists (a
    run killed before its cleanup); namespaces of live processes are left alone."""
    removed = []
    if not _NETNS_DIR.is_dir():
        return removed
    for p in _NETNS_DIR.iterdir():
        name = p.name
        if not name.startswith(PREFIX):
            continue
        pid_text = name[len(PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or Path(f"/proc/{pid_text}").exists():
            continue
        try:
            _ip("netns", "delete", name)
            removed.append(name)
        except RuntimeError:
            pass
    return removed


class Hosts:
    """``n`` hosts (network namespaces) on one bridge; see the module doc."""

    def __init__(self, n: int, *, log_dir: Optional[Path] = None) -> None:
        if n < 1:
            raise ValueError(f"n: need at least one host, got {n}")
        tag = f"{random.randrange(1 << 16):04x}"
        self.base = f"{PREFIX}{os.getpid()}-{tag}"
        self.switch = f"{self.base}-sw"
        self.names = [f"{self.base}-h{i}" for i in range(n)]
        # A /24 inside 10.0.0.0/8 that differs between runs (only these namespaces see it).
        r = random.randrange(1 << 16)
        self.subnet = f"10.{100 + r % 100}.{(r >> 7) % 256}"
        self.log_dir = log_dir
        self._procs: List[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._created: List[str] = []
        self.closed = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for name in [self.switch, *self.names]:
            _ip("netns", "add", name)
            self._created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            # Both ends are created inside the test's namespaces, never in the machine's.
            _ip("link", "add", "eth0", "netns", name, "type", "veth",
                "peer", "name", f"v{i}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"v{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"v{i}", "up")
            _ip("-n", name, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")

    def addr(self, i: int) -> str:
        """Host i's address (on its eth0)."""
        return f"{self.subnet}.{i + 1}"

    def __len__(self) -> int:
        return len(self.names)

    # --- processes ----------------------------------------------------------------------
    def spawn(self, i: int, argv: Sequence[str], *, log: Optional[Path] = None,
              env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> subprocess.Popen:
        """Starts ``argv`` in host i's namespace; stdout and stderr go to ``log``. The
        process is stopped by pid at close() if it is still running then."""
        out = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            p = subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=dict(env) if env is not None else None, cwd=cwd)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        with self._lock:
            self._procs.append(p)
        return p

    @staticmethod
    def stop(p: subprocess.Popen, *, sig: int = signal.SIGINT, timeout: float = 15.0) -> Optional[int]:
        """Stops one process by pid: ``sig``, then SIGKILL after ``timeout``; its exit code."""
        if p.poll() is not None:
            return p.returncode
        try:
            p.send_signal(sig)
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait(timeout=10)

    # --- the network --------------------------------------------------------------------
    def partition(self, i: int) -> None:
        """Cuts host i off: its port on the bridge goes down (no packet in or out; its
        processes keep running and see no error, only silence)."""
        _ip("-n", self.switch, "link", "set", f"v{i}", "down")

    def heal(self, i: int) -> None:
        _ip("-n", self.switch, "link", "set", f"v{i}", "up")

    @contextlib.contextmanager
    def inside(self, i: int) -> Iterator[None]:
        """Runs the body with this thread in host i's network namespace: sockets opened in
        it stay there (a store client opened inside keeps talking from host i)."""
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        target = os.open(str(_NETNS_DIR / self.names[i]), os.O_RDONLY)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.names[i]}")
            try:
                yield
            finally:
                if libc.setns(own, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the test's namespace")
        finally:
            os.close(target)
            os.close(own)

    # --- end ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stops every process still running (by pid), then deletes every namespace (the
        bridge and the veths go with them). Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        with self._lock:
            procs = list(self._procs)
        errors = []
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGINT)
                except OSError:
                    pass
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    errors.append(f"pid {p.pid} did not exit after SIGKILL")
        for name in reversed(self._created):
            try:
                _ip("netns", "delete", name)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                errors.append(str(e))
        self._created.clear()
        if errors:
            raise RuntimeError("netns cleanup: " + "; ".join(errors))

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def exists(self) -> Dict[str, bool]:
        """Which of this run's namespaces still exist (for the cleanup check)."""
        return {n: (_NETNS_DIR / n).exists() for n in [self.switch, *self.names]}
