"""malletrain.sim: the trace-driven simulator from Python, and `malletrain simulate`."""

from __future__ import annotations

import csv
import gzip
import os

import pytest

from malletrain import MalleValueError, sim
from malletrain.cli import main

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")

# Two nodes: n0 idle from t=0, n1 idle from t=100; the replay ends at t=1000
# (the last row only repeats n0's state, which fixes the trace's end).
TRACE = """# tiny trace
time,node,idle
0,n0,1
0,n1,0
100,n1,1
1000,n0,1
"""

MIX_HEADER = (
    "name,submit_time,min_nodes,max_nodes,work_samples,rescale_up_s,rescale_down_s,nodes,"
    "throughput\n"
)


@pytest.fixture
def tiny(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    mix = tmp_path / "mix.csv"
    # 10 samples/s per node, never finishes, 10 s to grow, 5 s to shrink.
    mix.write_text(MIX_HEADER + "job,0,1,2,1000000000,10,5,0;1;2,0;10;20\n")
    return trace, mix


def test_hand_checked_accounting(tiny):
    trace, mix = tiny
    r = sim.simulate(trace, mix, policy="dp", record_events=True)
    s = r.summary
    # Starts on n0 at t=0 (free: the old rate is 0), grows to 2 nodes at t=100
    # paying the old rate x the up pause (10/s x 10 s = 100 samples), runs to t=1000:
    # 10 x 100 + 20 x 900 - 100.
    assert s["samples_trained"] == pytest.approx(18900)
    assert s["efficiency"] == pytest.approx(18900 / 19000)
    assert s["idle_node_hours"] == pytest.approx(1900 / 3600)
    assert s["used_node_hours"] == pytest.approx(1900 / 3600)
    assert s["resizes"] == 2  # the start and the grow
    assert r.jobs[0]["samples_done"] == pytest.approx(18900)
    kinds = [e["kind"] for e in r.events]
    assert "resize" in kinds


def test_same_inputs_same_output(tiny):
    trace, mix = tiny
    a = sim.simulate(trace, mix, policy="greedy", record_events=True)
    b = sim.simulate(trace, mix, policy="greedy", record_events=True)
    strip = lambda ev: [{k: v for k, v in e.items() if k != "decision_ms"} for e in ev]  # noqa: E731
    assert strip(a.events) == strip(b.events)
    assert a.jobs == b.jobs


def test_every_policy_runs_and_compare_loads_once(tiny):
    trace, mix = tiny
    results = sim.compare(trace, mix)
    assert [r.summary["policy"] for r in results] == list(sim.POLICIES)
    table = sim.summary_table(results)
    for p in sim.POLICIES:
        assert p in table


def test_bad_options_and_inputs_name_the_problem(tiny, tmp_path):
    trace, mix = tiny
    with pytest.raises(ValueError, match="policy"):
        sim.simulate(trace, mix, policy="simplex")
    with pytest.raises(ValueError, match="curves"):
        sim.simulate(trace, mix, curves="psychic")
    with pytest.raises(TypeError, match="forward_window"):
        sim.simulate(trace, mix, forward_window="2 minutes")
    bad = tmp_path / "bad.csv"
    bad.write_text("time,node,idle\n0,n0,1\nabc,n1,1\n")
    loaded = sim.load_trace(bad)
    assert len(loaded.rejected) == 1
    file, line, message = loaded.rejected[0]
    assert file.endswith("bad.csv") and line == 3 and "time" in message
    with pytest.raises(MalleValueError, match="bad.csv:3"):
        sim.load_trace(bad, strict=True)


def test_gzip_trace_reads_like_plain(tiny, tmp_path):
    trace, mix = tiny
    gz = tmp_path / "trace.csv.gz"
    with gzip.open(gz, "wt") as f:
        f.write(TRACE)
    a = sim.simulate(trace, mix).summary
    b = sim.simulate(gz, mix).summary
    assert a["samples_trained"] == b["samples_trained"]


def test_cli_writes_tables_and_plots(tiny, tmp_path, capsys):
    trace, mix = tiny
    out = tmp_path / "out"
    rc = main(["simulate", "--trace", str(trace), "--jobs", str(mix), "--policy", "dp,greedy",
               "--out", str(out), "--quiet", "--events"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "dp" in printed and "greedy" in printed
    for policy in ("dp", "greedy"):
        for name in ("summary.csv", "jobs.csv", "timeline.csv", "events.csv", "utilisation.png",
                     "gantt.png"):
            assert (out / policy / name).stat().st_size > 0, name
    assert (out / "policies.png").stat().st_size > 0
    with open(out / "dp" / "summary.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["samples_trained"]) == pytest.approx(18900)


def test_cli_bad_input_exits_2(tiny, tmp_path, capsys):
    trace, mix = tiny
    assert main(["simulate", "--trace", str(tmp_path / "none.csv"), "--jobs", str(mix),
                 "--quiet"]) == 2
    assert "none.csv" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace), "--jobs", str(mix), "--policy", "nope",
                 "--quiet"]) == 2
    assert "policy" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "jobs-hpo-shufflenet-10.csv")),
                    reason="../shared/data is not present")
def test_real_hpo_mix_on_a_day_of_summit():
    trace = sim.load_trace(os.path.join(DATA, "summit-idle-2021-02.csv.gz"))
    assert trace.num_nodes == 4734 and not trace.rejected
    mix = sim.load_job_mix(os.path.join(DATA, "jobs-hpo-shufflenet-10.csv"))
    r = sim.simulate(trace, mix, policy="dp", skip_snapshots=999)
    s = r.summary
    assert s["jobs_submitted"] == 10
    assert 0 < s["efficiency"] <= 1
    assert s["samples_trained"] > 0
