"""examples/train_digits_cpp.cc: the C++ digits job under the local launcher.

A LibTorch C++ loop on ElasticTrainer, run through grows, a planned leave and a kill -9, must
end with the fixed-size run's whole state, parameters and optimizer state (bitwise in
deterministic mode, relative difference < 1e-5 per tensor otherwise), and bad data must be refused with a message naming the file and line. The binary
comes from the CMake build the suite made (tests/run_all.sh: build/ci).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import sklearn

from malletrain import launcher

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = ROOT / "build" / "ci" / "examples" / "train_digits_cpp"
DATA = pathlib.Path(sklearn.__file__).parent / "datasets" / "data" / "digits.csv.gz"
SCHEDULE = "step=15 join 2, step=30 leave 2, step=40 join 1, step=45 kill 1"

pytestmark = pytest.mark.skipif(not BINARY.exists(),
                                reason=f"{BINARY} not built (run tests/run_all.sh)")


def run(tmp: pathlib.Path, nodes: int, schedule: str = "", *extra: str, park_dir=None):
    out = tmp / "out"
    out.mkdir(parents=True)
    res = launcher.run_local([str(BINARY), f"--data={DATA}", f"--out={out}", *extra], nodes,
                             schedule, timeout=240, log_dir=str(tmp / "logs"), quiet=True,
                             park_dir=str(park_dir) if park_dir else None)
    logs = "\n".join(p.read_text() for p in sorted((tmp / "logs").glob("*.log")))
    assert res.ok, logs
    # A joiner still waiting when the job ended means the schedule's later events hit a
    # smaller job than the test meant (once, the kill took the only member left).
    assert not res.unadmitted, f"never admitted: {res.unadmitted}\n{logs}"
    result = json.loads((out / "result.json").read_text())
    params = np.fromfile(out / "params.bin", dtype=np.float32)
    return result, params, logs, res


@pytest.mark.parametrize("deterministic", [False, True])
def test_resizes_and_a_kill_end_with_the_fixed_size_model(tmp_path, deterministic):
    flags = ["--deterministic"] if deterministic else []
    fixed, p_fixed, _, _ = run(tmp_path / "fixed", 4, "", *flags)
    # 0.1 s per step: the joiners (LibTorch loads in 1-3 s on a loaded 2-core machine) are in
    # before the leave at step 30 and the kill at step 45.
    elastic, p_elastic, logs, res = run(tmp_path / "elastic", 2, SCHEDULE, *flags,
                                        "--step_sleep=100ms")
    assert fixed["steps"] == elastic["steps"] == 60
    assert len(res.killed) == 1
    kinds = [h["kind"] for h in elastic["history"]]
    assert "recovered" in kinds and "planned" in kinds, kinds
    # Which sizes rank 0 sees depends on when the joiners are ready (two joining at one step
    # may arrive at different boundaries): it grew past 2 and changed size more than once.
    sizes = {h["size"] for h in elastic["history"]}
    assert len(sizes) >= 2 and max(sizes) >= 3, elastic["history"]
    # The whole state, tensor by tensor: parameters and the optimizer's moments.
    assert fixed["tensors"] == elastic["tensors"]
    names = [name for name, _ in fixed["tensors"]]
    assert any(n.startswith("optimizer/") for n in names), names
    assert p_fixed.size == p_elastic.size == sum(n for _, n in fixed["tensors"]) > 0
    if deterministic:
        assert fixed["digest"] == elastic["digest"]
        assert np.array_equal(p_fixed, p_elastic)
    offset = 0
    for name, n in fixed["tensors"]:
        a, b = p_fixed[offset:offset + n], p_elastic[offset:offset + n]
        offset += n
        rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))
        assert rel < 1e-5, (name, rel)
    assert elastic["accuracy"] > 0.85, elastic["accuracy"]
    assert "test accuracy" in logs


def test_a_cpp_job_that_loses_every_rank_parks_and_resumes_at_its_step(tmp_path):
    """The C++ rank's engine comes from its environment (elastic::CreateRankEngine), as a Python
    rank's does: MALLE_PARK_DIR gives it the park store. SIGTERM to both members at step 20
    (what a reclaim with a grace period does; the example turns it into a leave): the last
    one parks the job state and exits; a new incarnation resumes at that step and ends with
    the fixed-size run's whole state, bit for bit (deterministic mode)."""
    fixed, p_fixed, _, _ = run(tmp_path / "fixed", 2, "", "--deterministic")
    park = tmp_path / "park"
    out = tmp_path / "parked" / "out"
    out.mkdir(parents=True)
    res = launcher.run_local([str(BINARY), f"--data={DATA}", f"--out={out}", "--deterministic",
                              "--step_sleep=50ms"], 2, "step=20 term 2", timeout=240,
                             log_dir=str(tmp_path / "parked" / "logs"), quiet=True,
                             park_dir=str(park))
    logs = "\n".join(p.read_text() for p in sorted((tmp_path / "parked" / "logs").glob("*.log")))
    assert res.ok, logs
    assert not (out / "result.json").exists(), "the job trained to its end instead of parking"
    parked = re.findall(r"left at step (\d+), the job's last member: parked its state", logs)
    assert len(parked) == 1, logs
    at = int(parked[0])
    assert 20 <= at < 60
    # The newest state is the parked one (an earlier adaptive snapshot may be kept beside it).
    assert [f.name[:len("state-") + 12] for f in sorted(park.glob("state-*"))][-1] == \
        f"state-{at:012d}", list(park.iterdir())

    resumed, p_resumed, logs2, _ = run(tmp_path / "resumed", 2, "", "--deterministic",
                                       park_dir=park)
    assert re.search(rf"resumed from \S*{park.name}\S* at step {at}\b", logs2), logs2
    assert resumed["steps"] == fixed["steps"] == 60
    assert resumed["digest"] == fixed["digest"]
    assert np.array_equal(p_resumed, p_fixed)


def test_bad_data_names_the_file_and_line(tmp_path):
    bad = tmp_path / "digits.csv"
    bad.write_text("0," * 64 + "3\n" + "0,1,2\n")
    r = subprocess.run([str(BINARY), f"--data={bad}"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "MALLE_STORE": "127.0.0.1:1"})
    assert r.returncode == 2, r.stderr
    assert f"{bad} line 2: 3 values, expected 65" in r.stderr
    r = subprocess.run([str(BINARY)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--data is required" in r.stderr


# --- the same binary under torchrun and srun (issue 23; docs/elastic.md) ------------------------

FOREIGN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _foreign_free_env() -> dict:
    return {k: v for k, v in os.environ.items()
            if k not in FOREIGN and not k.startswith(("MALLE_", "SLURM_", "TORCHELASTIC_"))}


def _wait(procs, log_paths, timeout=240):
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("timed out\n" + "\n".join(p.read_text()[-3000:] for p in log_paths))
    finally:
        for p in procs:  # torchrun stops its workers on SIGTERM
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)


@pytest.mark.parametrize("how", ["torchrun", "srun"])
def test_the_cpp_example_runs_unchanged_under_torchrun_and_srun(tmp_path, monkeypatch, how):
    """cluster::ReadLaunchEnv in C++: `torchrun --no-python` (its agent's store) and two tasks
    with srun's variables (task 0 hosts the store on loopback) end with the 2-rank malletrain
    run's state, bit for bit (deterministic mode)."""
    # Deterministic mode needs the same thread count everywhere; torchrun sets
    # OMP_NUM_THREADS=1 for its workers unless it is set.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    fixed, p_fixed, _, _ = run(tmp_path / "fixed", 2, "", "--deterministic")
    out = tmp_path / "out"
    out.mkdir()
    cmd = [str(BINARY), f"--data={DATA}", f"--out={out}", "--deterministic"]
    procs, logs = [], []
    if how == "torchrun":
        logs.append(tmp_path / "torchrun.log")
        with open(logs[0], "wb") as f:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", "--no-python", *cmd],
                env=_foreign_free_env(), stdout=f, stderr=subprocess.STDOUT))
    else:
        from malletrain import _C
        job, port = 4242 + os.getpid() % 1000, _free_port()
        for procid in range(2):
            logs.append(tmp_path / f"task{procid}.log")
            env = {**_foreign_free_env(), "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0",
                   "SLURM_PROCID": str(procid), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(procid),
                   "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "localhost",
                   "MASTER_PORT": str(port)}
            assert _C.read_launch_env(env).launcher == "srun"
            with open(logs[-1], "wb") as f:
                procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT))
    codes = _wait(procs, logs)
    assert codes == [0] * len(procs), "\n".join(p.read_text()[-3000:] for p in logs)
    got = json.loads((out / "result.json").read_text())
    assert got["steps"] == fixed["steps"] == 60 and got["redone"] == 0
    assert [h["kind"] for h in got["history"]] == ["bootstrap"] and got["size"] == 2
    assert got["digest"] == fixed["digest"]
    assert np.array_equal(np.fromfile(out / "params.bin", dtype=np.float32), p_fixed)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
