"""The environments users already have (issue 23): one script, unchanged, under malletrain's
own launcher, under ``torchrun --nproc-per-node 2``, and under srun (the SLURM_* variables of
two local tasks, then a real ``srun -n 2`` in a private Slurm), ends with the same whole state
(parameters, buffers, optimizer and scheduler state) and the same samples and random streams
per logical worker; bad input gets an error naming the variable.

The script is tests/python/exact_job.py (real data: scikit-learn's digits). Every process is
started by this test and stopped by it, by pid (torchrun by SIGTERM, which stops its workers);
stores listen on 127.0.0.1 only (torchrun --standalone: localhost; the srun runs'
SLURM_STEP_NODELIST / MASTER_ADDR are loopback); every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch

import malletrain
from malletrain import _C, launcher
from malletrain.errors import MalleValueError, StoreError

from state_compare import assert_same_state

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = HERE / "exact_job.py"
STEPS = 12
TIMEOUT = 240.0
# What other launchers set; a test's child gets only the launcher it is about.
FOREIGN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
           "GROUP_RANK", "ROLE_RANK", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE")


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if k not in FOREIGN and not k.startswith(("MALLE_", "SLURM_", "TORCHELASTIC_"))}


def script(out: pathlib.Path) -> list:
    return [str(SCRIPT), "--steps", str(STEPS), "--out", str(out)]


def final(out: pathlib.Path) -> dict:
    return torch.load(out / "final.pt")


def batches(out: pathlib.Path) -> dict:
    """(step, logical worker) -> what it saw: sample indices, first input, model RNG draw."""
    rows = {}
    for f in sorted(out.glob("trace-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            rows[(r["step"], r["worker"])] = (r["indices"], r["x0"], r["draw"])
    return rows


def check_same_job(out: pathlib.Path, ref: pathlib.Path, members: list) -> None:
    assert sorted(p.stem[len("result-"):] for p in out.glob("result-*.json")) == members
    for m in members:
        r = json.loads((out / f"result-{m}.json").read_text())
        assert r["steps"] == STEPS and r["redone_steps"] == 0 and r["history"] == ["bootstrap"], r
    got, want = batches(out), batches(ref)
    assert len(want) == STEPS * 4 and got == want  # exactly once, same streams per worker
    assert_same_state(final(out), final(ref), bitwise=True)


def wait_all(procs: list, logs: list, timeout: float = TIMEOUT) -> list:
    """Exit codes; on timeout every process still running is killed (by pid) and the test
    fails with the logs."""
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {timeout} s\n" + "\n".join(
            f"--- {log}\n{pathlib.Path(log).read_text()[-3000:]}" for log in logs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return codes


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The script under malletrain's own launcher: 2 ranks."""
    tmp = tmp_path_factory.mktemp("launch-ref")
    out = tmp / "out"
    res = launcher.run_local([sys.executable, *script(out)], nodes=2, job_id="ref",
                             timeout=TIMEOUT, log_dir=str(tmp / "logs"), quiet=True,
                             env=clean_env())
    assert res.ok, "\n".join(p.read_text()[-3000:] for p in (tmp / "logs").glob("*.log"))
    assert (out / "final.pt").exists()
    return out


def test_torchrun_runs_the_script_unchanged(tmp_path, reference):
    out, log = tmp_path / "out", tmp_path / "torchrun.log"
    # --standalone: torchrun's agent hosts its store on localhost, on a free port it picks
    # and passes in MASTER_PORT; malletrain's ranks use that store.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", *script(out)]
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, env=clean_env(), stdout=f, stderr=subprocess.STDOUT)
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
        try:
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        pytest.fail(f"torchrun timed out\n{log.read_text()[-4000:]}")
    assert rc == 0, log.read_text()[-4000:]
    check_same_job(out, reference, ["rank0", "rank1"])


def slurm_vars(job_id: int, procid: int, ntasks: int = 2) -> dict:
    return {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid),
            "SLURM_NTASKS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
            "SLURM_LOCALID": str(procid), "SLURM_NODEID": "0",
            "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_NODELIST": "localhost"}


def port_is_free(port: int) -> bool:
    """Nothing listens there (connections in TIME_WAIT do not count: the store's server sets
    SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def job_id_with_a_free_store_port() -> tuple:
    """A Slurm job id whose derived store port (libmalle's rule, read back through the
    binding) is free on loopback now."""
    for _ in range(200):
        job = random.randrange(100000, 10_000_000)
        port = _C.read_launch_env(slurm_vars(job, 1)).rank.store_port
        if port_is_free(port):
            return job, port
    raise AssertionError("no free derived store port in 200 tries")


def test_srun_variables_run_the_script_unchanged(tmp_path, reference):
    """Two tasks with what srun sets and no MASTER_ADDR/PORT: the store is on the first host
    of SLURM_STEP_NODELIST (here localhost), at the port derived from the job id, hosted by
    task 0."""
    job, port = job_id_with_a_free_store_port()
    out = tmp_path / "out"
    procs, logs = [], []
    try:
        for procid in range(2):
            log = tmp_path / f"task{procid}.log"
            logs.append(log)
            with open(log, "wb") as f:
                procs.append(subprocess.Popen([sys.executable, *script(out)],
                                              env={**clean_env(), **slurm_vars(job, procid)},
                                              stdout=f, stderr=subprocess.STDOUT))
        codes = wait_all(procs, logs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    check_same_job(out, reference, ["task0", "task1"])
    assert port_is_free(port)  # task 0's store closed with it


@pytest.mark.parametrize("env, error", [
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500"},
     "WORLD_SIZE=2 is set but MASTER_ADDR is not"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"},
     "MASTER_PORT: must be an integer in [1, 65535], got '0'"),
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "RANK is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
      "MALLE_BOOTSTRAP_SIZE": "4"},
     "MALLE_BOOTSTRAP_SIZE=4 contradicts the torchrun job's world size 2"),
    ({**slurm_vars(77, 2)}, "SLURM_PROCID=2 is not below SLURM_STEP_NUM_TASKS=2"),
    ({**slurm_vars(77, 0), "SLURM_NODEID": "1"},
     "SLURM_PROCID=0 runs on SLURM_NODEID=1, not on the first node of SLURM_STEP_NODELIST"),
    ({**slurm_vars(77, 1), "SLURM_STEP_NODELIST": "n[1-"},
     "SLURM_STEP_NODELIST: hostlist 'n[1-'"),
    ({}, "no control store given; .*or start it with torchrun"),
])
def test_bad_launch_variables_get_an_error_naming_them(monkeypatch, env, error):
    for k in list(os.environ):
        if k in FOREIGN or k.startswith(("MALLE_", "SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(MalleValueError, match=error if ".*" in error else re.escape(error)):
        malletrain.init(logical_workers=2)


def test_srun_store_port_in_use_says_how_to_choose_another(monkeypatch):
    job, port = job_id_with_a_free_store_port()
    for k in list(os.environ):
        if k in FOREIGN or k.startswith(("MALLE_", "SLURM_", "TORCHELASTIC_")):
            monkeypatch.delenv(k)
    for k, v in slurm_vars(job, 0).items():
        monkeypatch.setenv(k, v)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        with pytest.raises(StoreError, match=rf"127.0.0.1:{port}.*set MASTER_PORT"):
            malletrain.init(logical_workers=2)


# --- a real srun -----------------------------------------------------------------------------

sys.path.insert(0, str(ROOT / "tests" / "slurm"))
import slurm_cluster  # noqa: E402


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = slurm_cluster.can_install()
    if why:
        pytest.skip(f"cannot run a private Slurm here: {why}")
    slurm_cluster.ensure_installed()
    s = slurm_cluster.PrivateSlurm(tmp_path_factory.mktemp("slurm"), cpus=2)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        left = slurm_cluster.leftover_pids(str(s.conf))
        assert not left, f"processes of the private Slurm still alive: {left}"


def test_real_srun_runs_the_script_unchanged(slurm, tmp_path, reference):
    """``srun -n 2`` in a private Slurm: the tasks read what srun really sets. MASTER_ADDR is
    loopback (the node's name may resolve to another interface), MASTER_PORT a free port."""
    out, log = tmp_path / "out", tmp_path / "srun.log"
    port = slurm_cluster.free_port()
    env = {**clean_env(), "SLURM_CONF": str(slurm.conf), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    cmd = ["srun", "--partition=main", "--nodes=1", "--ntasks=2", "--cpus-per-task=1",
           "--kill-on-bad-exit=1", "--time=10", sys.executable, *script(out)]
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path)
    codes = wait_all([p], [log])
    assert codes == [0], log.read_text()[-4000:]
    check_same_job(out, reference, ["task0", "task1"])  # member ids: the srun path was taken
