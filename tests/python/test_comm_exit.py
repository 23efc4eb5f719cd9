"""A rank may exit while a collective's tensors are still held by c10d's threads.

A collective that failed (a peer stopped or died, the op timed out) returns to its caller but
its Gloo work stays in flight until Gloo gives up on it, holding the tensors it was given. In
torch 2.x, dropping a reference to a tensor that has a Python object takes the GIL; if a Gloo
worker (or the reaper joining it) does that while the interpreter is finalizing, CPython ends
that thread with pthread_exit, whose unwinding stops at a noexcept frame: "terminate called
without an active exception" and SIGABRT, after the rank's program had exited 0. The binding
hands libmalle aliases without a Python object, so nothing of Python is left to those threads.

The race is made deterministic here: the subject's last exit handler holds the GIL (a PyDLL
call does not release it) while its peer closes its sockets, so the Gloo worker ends the work
during that window and, if it still needed the GIL, waits for it until the interpreter is
finalizing. Real processes, loopback store, every wait bounded, every process stopped by pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from malletrain import _C

MEMBER = textwrap.dedent("""
    import atexit, ctypes, os, sys
    role = sys.argv[1]
    if role == "a":
        # Registered before anything else, so it runs last, right before the interpreter
        # starts finalizing: 3 s in C with the GIL held.
        atexit.register(ctypes.PyDLL(None).sleep, 3)
    import time
    import torch
    from malletrain import _C
    host, port = os.environ["MALLE_STORE"].rsplit(":", 1)
    store = _C.ControlStore.connect(host, int(port))
    g = _C.ElasticGroup.join(store, "exit", member_id=role, bootstrap_size=2,
                             heartbeat_timeout=30, recovery_grace=30)
    r = g.rank
    # Results land in the caller's tensors.
    x = torch.full((2,), float(r + 1))
    g.allreduce([x])
    y = torch.full((1,), float(r + 1))
    g.allreduce_async([y], "max").wait()
    z = torch.full((1,), float(r))
    g.broadcast([z], root=1)
    w = torch.full((1,), 7.0) if r == 0 else torch.zeros(1)
    g.send(w, peer=1, tag=0) if r == 0 else g.recv(w, peer=0, tag=0)
    print("results", x.tolist(), y.tolist(), z.tolist(), w.tolist(), flush=True)
    if role == "b":
        deadline = time.monotonic() + 60
        while store.try_get("b-exit") is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.5)  # a is in its last exit handler by now
        os._exit(0)  # its sockets close: a's Gloo worker fails the work and drops its tensors
    t = torch.ones(1)
    pending = g.allreduce_async([t])  # b never takes part: the Gloo work stays in flight
    del pending  # given up on, as after a failed generation
    store.set("b-exit", b"1")
    class Tail:
        def __del__(self):  # Python run while finalizing: the main thread hands the GIL over
            sum(i for i in range(1000))
    tail = Tail()
    print("a exits", flush=True)
    sys.exit(0)
""")


def test_exit_while_a_failed_collective_holds_a_python_tensor(tmp_path):
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    store = _C.ControlStore.serve("127.0.0.1", 0)
    env = dict(os.environ, MALLE_STORE=f"127.0.0.1:{store.port}")
    procs = {role: subprocess.Popen([sys.executable, str(script), role], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for role in ("a", "b")}
    out = {}
    try:
        for role, p in procs.items():
            out[role], _ = p.communicate(timeout=90)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for role in ("a", "b"):
        assert "results [3.0, 3.0] [2.0] [1.0] [7.0]" in out[role], out[role]
    assert "a exits" in out["a"], out["a"]
    assert procs["b"].returncode == 0, out["b"]
    assert "terminate called" not in out["a"], out["a"]
    assert procs["a"].returncode == 0, out["a"]
