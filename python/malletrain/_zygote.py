"""The zygote: a Python interpreter that has imported torch and malletrain once and forks
rank processes from that state on request (libmalle/cluster/zygote.h is its client).

A node agent starts one while its node sits idle in the pool; when the allocator then gives
the node to a job, the job's rank is a fork of this warm process instead of a new
interpreter that imports torch: process start and imports are off the node's clock.

    python -m malletrain._zygote --fd 3 [--preload torch,torch._dynamo,malletrain,...]

It is private to libmalle's LocalProcess (run it through ``cluster::Zygote``): the protocol
is a SOCK_SEQPACKET socket inherited as ``--fd``, each message a list of NUL-separated
fields (documented in libmalle/cluster/zygote.h). One request at a time; the zygote itself
never runs a torch operation, so no torch thread pool exists when it forks, and it checks
that it is single-threaded at each fork (numpy's OpenBLAS joins its workers in its own
pthread_atfork handler; a thread that survived a fork makes the fork refused, and the
client starts that rank cold).

What the forked rank gets is what ``execve`` of ``python SCRIPT ARGS`` (or ``python -m MOD``)
with the rank's environment would give it: its exact environment (``os.environ`` and the C
environment), working directory, ``sys.argv``/``sys.orig_argv``, ``sys.path`` (the script's
real directory, or the working directory for ``-m``, ahead of the interpreter's own path), a
fresh ``__main__``, stdout and stderr on the descriptors the client passed, signals at their
defaults, ``PR_SET_PDEATHSIG`` (it dies with the zygote, which dies with its agent), its own
process group if asked, fresh random seeds (Python's ``random`` through its at-fork hook,
numpy's global generator here). It ends with the interpreter's exit codes (``sys.exit``, an
uncaught exception prints its traceback and exits 1) and its exit's effects, except tearing
down the preloaded modules (_finish). What differs, and why it is safe, is in
docs/operations.md ("Warm rank starts").
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import os
import select
import signal
import socket
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_MAX_MESSAGE = 1 << 20


def _fields(data: bytes) -> list:
    return data.split(b"\0")


def _message(*fields) -> bytes:
    return b"\0".join(f if isinstance(f, bytes) else str(f).encode() for f in fields)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # pragma: no cover - no /proc: cannot check, so never fork
        return -1


class _Spawn:
    """One spawn request: ``spawn cwd flags argc argv... envc env...`` + [stdout, stderr] fds."""

    def __init__(self, fields: list, fds: list) -> None:
        it = iter(fields[1:])
        self.cwd = next(it).decode()
        self.flags = next(it).decode()
        argc = int(next(it))
        self.argv = [next(it) for _ in range(argc)]
        envc = int(next(it))
        self.env = [next(it) for _ in range(envc)]
        if len(fds) != 2:
            raise ValueError(f"spawn: expected 2 descriptors (stdout, stderr), got {len(fds)}")
        self.stdout, self.stderr = fds


class Zygote:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: dict = {}   # pid -> None (running) or (code, signal) reported, unreaped
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.import_env: dict = {}

    # --- the server's loop --------------------------------------------------------------
    def serve(self):
        """Serves requests until the client goes away (returns None: the zygote exits) or a
        fork happened (returns the request, in the child)."""
        while True:
            self._report_exits()
            try:
                ready, _, _ = select.select([self.sock, self.wake_r], [], [], 1.0)
            except InterruptedError:  # pragma: no cover - PEP 475 retries select itself
                continue
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            if self.sock not in ready:
                continue
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(64))
            except ConnectionResetError:
                return None
            if not data:
                return None  # the client closed its end: nothing more to serve
            fds: list = []
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    n = len(payload) // 4
                    fds += list(memoryview(payload)[:n * 4].cast("i"))
            fields = _fields(data)
            what = fields[0]
            if what == b"spawn":
                try:
                    req = _Spawn(fields, fds)
                except (ValueError, StopIteration, UnicodeDecodeError) as e:
                    for fd in fds:
                        os.close(fd)
                    self.sock.send(_message(b"error", f"bad spawn request: {e}"))
                    continue
                child = self._fork(req)
                if child is not None:
                    return child
            elif what == b"reap" and len(fields) == 2:
                pid = int(fields[1])
                if self.children.get(pid) is not None:
                    os.waitpid(pid, 0)
                    del self.children[pid]
            else:
                for fd in fds:
                    os.close(fd)
                self.sock.send(_message(b"error", f"unknown request {what[:32]!r}"))

    def _report_exits(self) -> None:
        # WNOWAIT: the child stays a zombie until the client has recorded its exit and says
        # "reap", so its pid cannot be reused while the client may still signal it.
        for pid, done in list(self.children.items()):
            if done is not None:
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # pragma: no cover - reaped behind our back
                info = None
                self.children[pid] = (0, signal.SIGKILL)
                self.sock.send(_message(b"exit", pid, 0, int(signal.SIGKILL)))
                continue
            if info is None or info.si_pid == 0:
                continue
            if info.si_code == os.CLD_EXITED:
                code, sig = info.si_status, 0
            else:
                code, sig = 0, info.si_status
            self.children[pid] = (code, sig)
            self.sock.send(_message(b"exit", pid, code, sig))

    def _fork(self, req: _Spawn):
        go_r, go_w = os.pipe()
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):  # pragma: no cover
                pass
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            return self._child(req, go_r)
        os.close(go_r)
        for fd in (req.stdout, req.stderr):
            os.close(fd)
        if "g" in req.flags:
            try:
                os.setpgid(pid, pid)  # also here: a signal to the group right after the reply
            except OSError:  # the child did it first, or already exec'd into its own code
                pass
        # Numpy's OpenBLAS joins its workers before fork (pthread_atfork) and starts them
        # again on its next call; no other thread may have lived through the fork.
        after = _threads()
        if after != 1:
            os.write(go_w, b"n")
            os.close(go_w)
            os.waitpid(pid, 0)
            self.sock.send(_message(b"error", f"{after} threads lived through the fork: the "
                                    "child was not started"))
            return None
        os.write(go_w, b"g")
        os.close(go_w)
        self.children[pid] = None
        self.sock.send(_message(b"pid", pid))
        return None

    # --- in the child ---------------------------------------------------------------------
    def _child(self, req: _Spawn, go_r: int) -> _Spawn:
        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # pragma: no cover - the zygote died before prctl
            os._exit(127)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if "g" in req.flags:
            os.setpgid(0, 0)
        try:
            go = os.read(go_r, 1)
        except OSError:
            go = b""
        os.close(go_r)
        if go != b"g":
            os._exit(127)
        self.sock.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        os.dup2(req.stdout, 1)
        os.dup2(req.stderr, 2)
        for fd in {req.stdout, req.stderr} - {1, 2}:
            os.close(fd)
        return req


def _become(req: _Spawn, import_env: dict, base_path: list) -> None:
    """Turns this forked child into ``python SCRIPT ARGS`` (or ``-m MOD``), runs it and ends
    the process the way the interpreter would (_finish); never returns."""
    import builtins
    import importlib.machinery
    import types

    argv = [a.decode(errors="surrogateescape") for a in req.argv]
    preloaded = set(sys.modules)
    try:
        os.chdir(req.cwd)
    except OSError as e:
        print(f"malletrain zygote: cannot enter {req.cwd!r}: {e}", file=sys.stderr, flush=True)
        os._exit(127)
    # The rank's environment, exactly, plus what the zygote's imports set in theirs (an
    # import in a fresh process would have set it too; the client refuses a rank whose own
    # environment names one of them, so this is a set-default).
    env = {}
    for e in req.env:
        k, _, v = e.partition(b"=")
        env[k] = v
    os.environ.clear()
    for k, v in env.items():
        os.environb[k] = v
    for k, v in import_env.items():
        os.environ.setdefault(k, v)
    # stdout: line-buffered on a terminal, block-buffered otherwise, as at startup.
    for f, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            f.reconfigure(line_buffering=(fd == 2) or os.isatty(fd))
        except (AttributeError, OSError, ValueError):  # pragma: no cover
            pass
    if "numpy.random" in sys.modules:  # fresh processes seed numpy's global generator anew
        sys.modules["numpy.random"].seed()
    sys.orig_argv = list(argv)
    if argv[1] == "-m":
        import runpy

        sys.argv = ["-m"] + argv[3:]
        sys.path[:] = [os.getcwd()] + base_path
        _name(argv[2])
        # runpy runs the module in __main__'s namespace: a fresh one, as at startup (this
        # process's own __main__ is the zygote).
        fresh = types.ModuleType("__main__")
        fresh.__dict__.update(__builtins__=builtins, __annotations__={})
        sys.modules["__main__"] = fresh
        run = lambda: runpy._run_module_as_main(argv[2], alter_argv=True)  # what -m calls
    else:
        script = argv[1]
        sys.argv = argv[1:]
        sys.path[:] = [os.path.dirname(os.path.realpath(script))] + base_path
        file = script if os.path.isabs(script) else os.getcwd() + os.sep + script
        try:
            with open(script, "rb") as f:
                source = f.read()
        except OSError as e:
            print(f"{sys.executable}: can't open file {file!r}: [Errno {e.errno}] {e.strerror}",
                  file=sys.stderr, flush=True)
            os._exit(2)
        _name(script)
        main = types.ModuleType("__main__")
        main.__dict__.update(__file__=file, __cached__=None, __builtins__=builtins,
                             __spec__=None, __package__=None, __annotations__={},
                             __loader__=importlib.machinery.SourceFileLoader("__main__", file))
        sys.modules["__main__"] = main
        compiled = compile(source, file, "exec", dont_inherit=True)
        run = lambda: exec(compiled, main.__dict__)
    code, interrupted = 0, False
    try:
        run()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: BLE001 - printed as the interpreter prints it
        # The traceback as the interpreter prints it: without the zygote's own frames.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        code, interrupted = 1, isinstance(e, KeyboardInterrupt)
    _finish(code, interrupted, preloaded)


def _exit_code(e: SystemExit) -> int:
    """The exit status of sys.exit(e.code), as the interpreter computes it."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    try:
        print(e.code, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _clear_module(d: dict) -> None:
    # As the interpreter clears a module at exit: names with one leading underscore first,
    # then the rest (so that __del__ methods still find their module's public names).
    for first in (True, False):
        for k in list(d):
            if k == "__builtins__" or not isinstance(k, str):
                continue
            if first and not (k.startswith("_") and not k.startswith("__")):
                continue
            try:
                d[k] = None
            except Exception:  # noqa: BLE001
                pass


def _finish(code: int, interrupted: bool, preloaded: set) -> None:
    """The interpreter's exit, without tearing down what the zygote had imported.

    Like Py_FinalizeEx: non-daemon threads are joined, atexit handlers run (the preloaded
    modules' too), the script's own objects are finalized (its __main__ and every module it
    imported itself are cleared, then cycles collected: files are flushed and closed, __del__
    methods and weakref finalizers run), Python's and the C library's output is flushed. What
    it skips is tearing down the preloaded modules (torch, ...): in a fork that would
    deallocate, and copy on write, the zygote's whole heap, seconds of a node's time at every
    rank exit (what multiprocessing's forked workers skip too); their memory, descriptors and
    devices go back to the system when the process ends. C++ static destructors of the
    preloaded libraries do not run either."""
    import atexit

    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException as e:  # noqa: BLE001 - the interpreter reports and goes on
            sys.unraisablehook(_unraisable(e, "threading._shutdown"))
    atexit._run_exitfuncs()
    for name in reversed(list(sys.modules)):
        if name in preloaded and name != "__main__":
            continue
        mod = sys.modules.get(name)
        d = getattr(mod, "__dict__", None)
        if isinstance(d, dict):
            _clear_module(d)
    gc.collect()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio (printf from extensions)
    except (OSError, AttributeError):  # pragma: no cover
        pass
    if interrupted:  # as the interpreter ends after a KeyboardInterrupt: by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _unraisable(e: BaseException, where: str):
    class _U:
        exc_type, exc_value, exc_traceback = type(e), e, e.__traceback__
        err_msg, object = f"Exception ignored in {where}", None
    return _U()


def _name(what: str) -> None:
    """The process's name (comm, what ps -c and top show): the script's, not the zygote's."""
    try:
        name = os.path.basename(what).encode()[:15]
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover
        pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="malletrain's zygote (private to LocalProcess)")
    p.add_argument("--fd", type=int, required=True, help="the client's SOCK_SEQPACKET socket")
    p.add_argument("--preload", default="torch,torch._dynamo,malletrain",
                   help="comma-separated modules imported before serving")
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    os.set_inheritable(args.fd, False)
    before = dict(os.environ)
    for name in [m for m in args.preload.split(",") if m]:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - said to the client, which starts cold
            sock.send(_message(b"failed", f"import {name}: {type(e).__name__}: {e}"))
            return 1
    import_env = {k: v for k, v in os.environ.items() if before.get(k) != v}
    base_path = sys.path[1:]  # without the zygote's own sys.path[0]
    gc.collect()
    gc.freeze()  # what the children inherit stays shared (no copy on write by the collector)
    z = Zygote(sock)
    threads = _threads()
    sock.send(_message(b"ready", os.getpid(), threads, len(import_env),
                       *[f"{k}={v}" for k, v in import_env.items()]))
    req = z.serve()
    if req is None:
        return 0
    del z
    # The frozen heap stays frozen: the collector never walks (and copies) the zygote's objects.
    _become(req, import_env, base_path)
    return 0  # pragma: no cover - _become ends the process


if __name__ == "__main__":
    sys.exit(main())
