"""Warm process starts (libmalle/cluster/zygote.h, python/malletrain/_zygote.py).

A process forked from the zygote must see what the same process started cold (a new
interpreter through execve) sees: environment, working directory, argv, sys.path, __main__,
output files, signals, exit codes, tracebacks, its own pid and process group. Each test runs
the probe (tests/python/zygote_probe.py) both ways and compares. Every process is stopped by
pid (LocalProcess kills and reaps at the latest when its object goes away).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from malletrain import _C
from malletrain.errors import MalleError

HERE = Path(__file__).resolve().parent
PROBE = HERE / "zygote_probe.py"


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    log = tmp_path_factory.mktemp("zygote") / "zygote.log"
    # numpy.random too: a zygote that imported it must give every fork a new seed.
    z = _C.Zygote.start(sys.executable, preload=["torch", "malletrain", "numpy.random"],
                        log=str(log))
    z.wait_ready(timeout=180)
    yield z
    del z


def run(tmp: Path, tag: str, argv, *, zygote=None, env=None, cwd=None, timeout=120.0, **kw):
    out, err = tmp / f"{tag}.out", tmp / f"{tag}.err"
    rank = _C.RankEnv()
    rank.store = "127.0.0.1:29999"
    rank.job_id = "probe.i0"
    rank.member_id = f"m-{tag}"
    p = _C.LocalProcess.spawn(list(argv), env=env or {"PROBE_VAR": "x y=z"}, rank_env=rank,
                              stdout=str(out), stderr=str(err), truncate=True,
                              cwd=str(cwd or tmp), new_process_group=True, zygote=zygote, **kw)
    code = p.wait(timeout=timeout)
    return p, code, out.read_text(), err.read_text()


def probe(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_a_warm_process_sees_what_a_cold_one_sees(zygote, tmp_path):
    argv = [sys.executable, os.path.relpath(PROBE, tmp_path), "7"]
    cold, cold_code, cold_out, cold_err = run(tmp_path, "cold", argv)
    warm, warm_code, warm_out, warm_err = run(tmp_path, "warm", argv, zygote=zygote)
    assert not cold.warm and cold.cold_reason == ""
    assert warm.warm, warm.cold_reason
    assert (cold_code, warm_code) == (7, 7)
    c, w = probe(cold_out), probe(warm_out)
    assert not c["torch_preimported"] and w["torch_preimported"]  # warm: forked after the imports
    assert w["pid"] == warm.pid and c["pid"] == cold.pid  # its own pid, which LocalProcess signals
    assert w["pgid"] == warm.pid and c["pgid"] == cold.pid  # its own process group
    # Two forks of one zygote draw different random numbers, as two new interpreters do.
    w2 = probe(run(tmp_path, "warm2", argv, zygote=zygote)[2])
    assert w["random"] != w2["random"] and w["numpy_random"] != w2["numpy_random"]
    for k in ("pid", "pgid", "random", "numpy_random", "torch_preimported"):
        del c[k], w[k]
    # The member id is the only difference the spec makes between the two runs.
    assert c["env"].pop("MALLE_MEMBER_ID") == "m-cold" and w["env"].pop("MALLE_MEMBER_ID") == "m-warm"
    assert w == c  # env, cwd, argv, sys.path, __file__, signals, mask, torch's threads, ...
    assert c["threads_at_start"] == 1 and c["env"]["PROBE_VAR"] == "x y=z"
    assert cold_err == warm_err == "to stderr\n"


def test_a_failing_script_fails_the_same_way(zygote, tmp_path):
    argv = [sys.executable, str(PROBE), "raise"]
    _, cold_code, _, cold_err = run(tmp_path, "cold", argv)
    warm, warm_code, _, warm_err = run(tmp_path, "warm", argv, zygote=zygote)
    assert warm.warm
    assert cold_code == warm_code == 1
    assert "RuntimeError: the probe failed on purpose" in warm_err
    assert "_zygote" not in warm_err  # the zygote's own frames are not the user's traceback
    assert warm_err == cold_err


def test_a_warm_process_exits_like_the_interpreter(zygote, tmp_path):
    """atexit handlers, non-daemon threads, unclosed files (of __main__ and of a module the
    script imported), __del__, a NamedTemporaryFile, C stdio and sys.exit(str): the same
    effects warm (which ends without tearing down the zygote's preloaded modules) as cold."""
    results = {}
    for mode in ("cold", "warm"):
        d = tmp_path / mode
        d.mkdir()
        (d / "exit_helper.py").write_text(
            "held = open('helper.txt', 'w')\nheld.write('buffered in a module')\n")
        p, code, out, err = run(d, mode, [sys.executable, str(PROBE), "exit-effects"],
                                zygote=zygote if mode == "warm" else None, cwd=d)
        assert p.warm == (mode == "warm"), p.cold_reason
        temp = (d / "temp-name.txt").read_text()
        files = {f.name: f.read_text() for f in d.iterdir()
                 if f.suffix == ".txt" and f.name != "temp-name.txt"}
        results[mode] = (code, out, err, files, os.path.exists(temp))
    assert results["warm"] == results["cold"]
    code, out, err, files, temp_left = results["warm"]
    assert code == 1 and err == "a message to stderr, exit 1\n" and out == "c stdio, no newline"
    assert files == {"atexit.txt": "atexit ran", "thread.txt": "non-daemon thread finished",
                     "unclosed.txt": "buffered in __main__, never flushed",
                     "del.txt": "__del__ ran", "helper.txt": "buffered in a module"}, files
    assert not temp_left


def test_a_module_runs_warm_like_python_dash_m(zygote, tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(PROBE.read_text())
    argv = [sys.executable, "-m", "pkg.mod", "3"]
    _, cold_code, cold_out, _ = run(tmp_path, "cold", argv)
    warm, warm_code, warm_out, _ = run(tmp_path, "warm", argv, zygote=zygote)
    assert warm.warm, warm.cold_reason
    assert cold_code == warm_code == 3
    c, w = probe(cold_out), probe(warm_out)
    for k in ("argv", "orig_argv", "path", "file", "main_file", "name", "spec", "cwd", "globals"):
        assert w[k] == c[k], k


@pytest.mark.parametrize("change, reason", [
    ({"env": {"PYTHONHASHSEED": "1"}}, "PYTHONHASHSEED"),
    ({"env": {"OMP_NUM_THREADS": "3"}}, "OMP_NUM_THREADS"),
    # malletrain's import sets it (set-default): the rank's own value could not win.
    ({"env": {"TORCH_FR_BUFFER_SIZE": "5"}}, "TORCH_FR_BUFFER_SIZE"),
    ({"argv": ["/usr/bin/env", "python3", str(PROBE)]}, "is not the zygote's interpreter"),
    ({"argv": [sys.executable, "-u", str(PROBE)]}, "interpreter option '-u'"),
    ({"argv": [sys.executable, "no_such_script.py"]}, "is not a regular file"),
])
def test_what_the_zygote_cannot_start_exactly_starts_cold(zygote, tmp_path, change, reason):
    argv = change.get("argv", [sys.executable, str(PROBE)])
    env = {"PROBE_VAR": "1", **change.get("env", {})}
    p, code, out, err = run(tmp_path, "x", argv, zygote=zygote, env=env)
    assert not p.warm
    assert reason in p.cold_reason, p.cold_reason
    if "no_such_script" in argv[-1]:
        assert code == 2 and "can't open file" in err  # the interpreter's own message
    elif argv[0] == sys.executable and "-u" not in argv:
        assert code == 0 and not probe(out)["torch_preimported"]


def test_signals_reach_the_warm_process_and_its_group(zygote, tmp_path):
    out = tmp_path / "sleep.out"
    p = _C.LocalProcess.spawn([sys.executable, str(PROBE), "sleep"], stdout=str(out),
                              new_process_group=True, zygote=zygote)
    assert p.warm
    deadline = time.monotonic() + 60
    while not out.exists() or not out.read_text().strip():
        assert time.monotonic() < deadline, "the probe did not start its child"
        assert p.poll() is None
        time.sleep(0.05)
    child = json.loads(out.read_text())["child"]
    assert os.getpgid(child) == p.pid
    p.signal(signal.SIGTERM)  # to the group: the probe and its sleep
    assert p.wait(timeout=30) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the group's other process survived SIGTERM"
        time.sleep(0.05)
    with pytest.raises(MalleError):
        p.signal(signal.SIGTERM)  # it has exited: refused, never sent to a reused pid
    _wait_gone(p.pid)  # reaped by the zygote once the status was read: no zombie left


def test_a_dead_zygote_takes_its_processes_and_then_starts_nothing(tmp_path):
    z = _C.Zygote.start(sys.executable, preload=["malletrain"], log=str(tmp_path / "z.log"))
    z.wait_ready(timeout=180)
    out = tmp_path / "sleep.out"
    p = _C.LocalProcess.spawn([sys.executable, str(PROBE), "sleep"], stdout=str(out),
                              new_process_group=True, zygote=z)
    assert p.warm
    deadline = time.monotonic() + 60
    while not out.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = json.loads(out.read_text())["child"]
    os.kill(z.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL  # PR_SET_PDEATHSIG: it dies with the zygote
    deadline = time.monotonic() + 10
    while _alive(child):  # and what it started in its group is killed too
        assert time.monotonic() < deadline, "the warm process's group survived the zygote"
        time.sleep(0.05)
    assert not z.ready and "exited" in z.failure
    q, code, _, _ = run(tmp_path, "after", [sys.executable, str(PROBE)], zygote=z)
    assert not q.warm and "unusable" in q.cold_reason and code == 0


def test_a_zygote_that_cannot_fork_safely_refuses(tmp_path):
    # A preloaded module that starts a thread: a fork could leave a lock held in the child.
    helper = tmp_path / "starts_a_thread.py"
    helper.write_text("import threading, time\n"
                      "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    z = _C.Zygote.start(sys.executable, preload=["starts_a_thread"], env=env,
                        log=str(tmp_path / "z.log"))
    z.wait_ready(timeout=120)
    p, code, out, _ = run(tmp_path, "t", [sys.executable, str(PROBE)], zygote=z,
                          env={"PROBE_VAR": "1", **env})
    assert not p.warm and "threads lived through the fork" in p.cold_reason, p.cold_reason
    assert code == 0 and not probe(out)["torch_preimported"]


def test_a_zygote_whose_import_fails_says_so(tmp_path):
    z = _C.Zygote.start(sys.executable, preload=["no_such_module_xyz"], log=str(tmp_path / "z.log"))
    with pytest.raises(MalleError, match="no_such_module_xyz"):
        z.wait_ready(timeout=120)
    with pytest.raises(ValueError, match="not a module name"):
        _C.Zygote.start(sys.executable, preload=["bad name"])
    with pytest.raises(MalleError, match="not in PATH"):
        _C.Zygote.start("no-such-python-xyz")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, f"pid {pid} still exists (a zombie nobody reaps?)"
        time.sleep(0.05)
