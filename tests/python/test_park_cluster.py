"""The shared allocator knows parked jobs (issue 22): cluster-level park and resume.

Real processes on loopback (LocalCluster: ephemeral ports, agents and ranks stopped by pid,
every wait bounded). The training script is the tests' own exact_job.py; the job's park store
is the one LocalCluster gives every job (<park_dir>/<job>, the agents' --park_dir).

- Every node is reclaimed (with grace) while the job trains: its last member parks, the
  allocator shows the job "parked" at that step with the park's size and time (status,
  format_status, Prometheus); when nodes come back a new incarnation resumes at exactly that
  step and the job succeeds with the fixed-size run's final state.
- Every rank is SIGTERMed by something other than its agent (a preemption): the last member
  parks and exits 0 on a node the plan still gives the job. That exit must not count as the
  job's success: the job is parked, then resumed, and ends with the fixed-size result.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
import urllib.request

import pytest
import torch

from malletrain import launcher
from malletrain.cluster import LocalCluster, format_status, live_table

from state_compare import assert_same_state

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "exact_job.py"
STEPS = 40
ARGS = ["--logical-workers", "2", "--snapshot-every", "5"]


def job_cmd(out: pathlib.Path, *extra: str):
    return [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(out), *ARGS, *extra]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """The fixed-size run (2 ranks, no fault) the parked-and-resumed runs must equal."""
    tmp = tmp_path_factory.mktemp("fixed")
    out = tmp / "ref"
    r = launcher.run_local(job_cmd(out), nodes=2, job_id="ref", timeout=240,
                           log_dir=str(tmp / "ref-logs"), quiet=True)
    assert r.ok, r
    return torch.load(out / "final.pt")


def wait_for(what, cond, timeout=120.0, poll=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def progress(cluster, runtime_id: str) -> int:
    v = cluster.store.try_get(launcher.progress_key(runtime_id))
    return int(v) if v else 0


def dump_logs(cluster) -> str:
    parts = []
    for p in sorted(cluster.log_dir.glob("*")):
        if p.is_file():
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}")
    return "\n".join(parts)


def results(out: pathlib.Path):
    return {f.stem[len("result-"):]: json.loads(f.read_text())
            for f in sorted(out.glob("result-*.json"))}


def scrape(url: str):
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        key = tuple(sorted(tuple(kv.split("=", 1)) for kv in labels.rstrip("}").split(",") if kv))
        values[(name, tuple((k, v.strip('"')) for k, v in key))] = float(value)
    return values


def check_resumed(out: pathlib.Path, park_step: int, fixed_state):
    """A member of the first incarnation parked at park_step; a member of a later one resumed
    there from the park store; the job ended with the fixed-size run's state."""
    res = results(out)
    parked = [r for r in res.values() if r["parked"]]
    assert len(parked) == 1, res
    assert parked[0]["steps"] == park_step, (park_step, res)
    resumed = [r for r in res.values() if r["resumed_from"]]
    assert resumed, res
    assert min(r["resumed_at"] for r in resumed) == park_step, (park_step, res)
    final = torch.load(out / "final.pt")
    assert final["steps"] == STEPS
    assert_same_state(final, fixed_state)


def test_a_job_that_loses_every_node_parks_shows_parked_and_resumes_exactly(tmp_path, fixed):
    out = tmp_path / "job"
    seen = []  # (job view) while nodes were down
    with LocalCluster(["n0", "n1"], policy="dp", grace=20.0, heartbeat_timeout=5.0,
                      metrics=True, workdir=tmp_path / "cluster") as c:
        try:
            c.node_up("n0")
            c.node_up("n1")
            c.submit("p", job_cmd(out, "--step-sleep", "0.25"), max_nodes=2, logical_workers=2)
            wait_for("p training at step 8", lambda: progress(c, "p.i1") >= 8, timeout=180)
            # The main scheduler takes both nodes back, one after the other: the job shrinks,
            # then its last member is asked to leave and parks.
            c.node_down("n1", wait=True)
            c.node_down("n0", wait=True)
            view = wait_for("p parked", lambda: (c.jobs().get("p", {}).get("phase") == "parked"
                                                 and c.jobs()["p"]), timeout=30)
            seen.append(view)
            status = c.status()
            table = format_status(status)
            line = live_table(c)
            metrics = scrape(c.allocator_metrics_url())
            # Nodes come back: a new incarnation resumes from the park store.
            c.node_up("n0")
            c.node_up("n1")
            final = c.wait(["p"], timeout=240)
            end_status = c.status()
        except BaseException:
            print(dump_logs(c))
            raise
    assert final["p"]["phase"] == "succeeded", end_status
    park = view["park"]
    assert view["nodes"] == [] and view["parks"] == 1, view
    assert park["step"] == view["step"] >= 8, view
    assert park["bytes"] > 0 and park["park_s"] >= 0, view
    assert view["saved"]["kind"] == "park" and view["saved"]["step"] == park["step"], view
    assert f"park@{park['step']}" in table and "parked 1x" in table, table
    assert "p:parked@0" in line, line
    assert metrics[("malle_allocator_parks_total", ())] == 1, metrics
    assert metrics[("malle_allocator_jobs", (("phase", "parked"),))] == 1, metrics
    # The resumed incarnation is the second; the unpark was measured on its first member.
    p_end = next(j for j in end_status["jobs"] if j["job"] == "p")
    assert p_end["runtime_id"] == "p.i2", p_end
    assert p_end["park"]["unpark_measured"] is True, p_end
    check_resumed(out, park["step"], fixed)


def test_a_rank_exiting_zero_after_parking_is_not_the_jobs_success(tmp_path, fixed):
    """Every rank is SIGTERMed at step 12 by something other than its agent: all leave, the
    last parks and exits 0 while the plan still gives the job its nodes (the agent reports
    the exit as the program ending by itself). The job must resume, not end there."""
    out = tmp_path / "job"
    phases = []
    with LocalCluster(["n0", "n1"], policy="dp", grace=20.0, heartbeat_timeout=5.0,
                      workdir=tmp_path / "cluster") as c:
        try:
            c.node_up("n0")
            c.node_up("n1")
            c.submit("t", job_cmd(out, "--term-all", "12", "--step-sleep", "0.1"), max_nodes=2,
                     logical_workers=2)

            def watch(cluster):
                j = cluster.jobs().get("t", {})
                if not phases or phases[-1] != (j.get("phase"), j.get("runtime_id")):
                    phases.append((j.get("phase"), j.get("runtime_id")))

            final = c.wait(["t"], timeout=300, poll=0.2, on_poll=watch)
            status = c.status()
        except BaseException:
            print(dump_logs(c))
            raise
    t = next(j for j in status["jobs"] if j["job"] == "t")
    assert final["t"]["phase"] == "succeeded", (phases, t)
    # It did not end with the first incarnation: it parked and a second one finished it
    # (the parked phase itself may be too short for the poll to see: its ranks exit at once).
    assert t["runtime_id"] == "t.i2" and t["parks"] == 1, (phases, t)
    check_resumed(out, t["park"]["step"], fixed)
