"""Prints what a process sees of its start (tests/python/test_zygote.py runs it cold and warm)."""
import json
import os
import random
import signal
import sys

threads_at_start = len(os.listdir("/proc/self/task"))
torch_preimported = "torch" in sys.modules
import malletrain  # noqa: E402,F401  (its import sets variables: compare after it, both ways)
import numpy  # noqa: E402
import torch  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "raise":
    def inner():
        raise RuntimeError("the probe failed on purpose")
    inner()
if mode == "sleep":
    import subprocess
    child = subprocess.Popen(["sleep", "60"])
    print(json.dumps({"child": child.pid}), flush=True)
    signal.pause()
if mode == "exit-effects":
    # What the interpreter's exit does, observable in files of the working directory.
    import atexit
    import ctypes
    import tempfile
    import threading
    import time

    atexit.register(lambda: open("atexit.txt", "w").write("atexit ran"))

    def late():
        time.sleep(0.3)
        open("thread.txt", "w").write("non-daemon thread finished")

    threading.Thread(target=late).start()
    held = open("unclosed.txt", "w")
    held.write("buffered in __main__, never flushed")

    class Finalized:
        def __del__(self, open=open):  # globals may be gone at exit: what it needs, bound now
            open("del.txt", "w").write("__del__ ran")

    finalized = Finalized()
    temp = tempfile.NamedTemporaryFile(dir=".", delete=True)
    open("temp-name.txt", "w").write(temp.name)
    sys.path.insert(0, os.getcwd())
    import exit_helper  # noqa: F401  (holds an unclosed file of its own)
    ctypes.CDLL(None).printf(b"c stdio, no newline")
    sys.exit("a message to stderr, exit 1")
main = sys.modules["__main__"]
print("to stderr", file=sys.stderr)
print(json.dumps({
    "pid": os.getpid(), "pgid": os.getpgid(0), "cwd": os.getcwd(), "argv": sys.argv,
    "orig_argv": sys.orig_argv, "path": sys.path, "env": dict(os.environ),
    "executable": sys.executable, "name": __name__, "file": __file__,
    "main_file": getattr(main, "__file__", None),
    "spec": None if __spec__ is None else [__spec__.name, __spec__.origin],
    "threads_at_start": threads_at_start, "torch_preimported": torch_preimported,
    "torch_threads": torch.get_num_threads(), "random": random.random(),
    "numpy_random": float(numpy.random.random()), "line_buffering": sys.stdout.line_buffering,
    "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "handlers": {name: repr(signal.getsignal(getattr(signal, name)))
                 for name in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE", "SIGUSR1")},
    "flags": repr(sys.flags), "globals": sorted(globals()),
}))
sys.exit(int(mode) if mode.isdigit() else 0)
