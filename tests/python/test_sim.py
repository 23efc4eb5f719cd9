"""malletrain.sim: the trace-driven simulator from Python, and `malletrain simulate`."""

from __future__ import annotations

import csv
import datetime
import gzip
import math
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


def test_curve_modes_agree_on_a_linear_job(tiny):
    # The tiny job scales linearly, so no curve mode can mislead the policy.
    trace, mix = tiny
    for curves in ("oracle", "learned", "linear"):
        s = sim.simulate(trace, mix, curves=curves).summary
        assert s["samples_trained"] == pytest.approx(18900), curves


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


TINY_SWF = os.path.join(os.path.dirname(__file__), "..", "data", "tiny.swf")


def test_swf_log_becomes_an_idle_trace():
    trace = sim.load_swf(TINY_SWF)
    # 4 nodes; every node idle at the log's start, then the state changes worked out in
    # tests/cpp/sim/swf_test.cc (LoadsTheTinyLogPlainAndGzipped).
    assert trace.num_nodes == 4 and trace.num_events == 18
    assert trace.start == 1600000000 and trace.end == 1600000260
    (file, line, message), = trace.rejected
    assert file.endswith("tiny.swf") and line == 16 and "got 17" in message
    r = trace.swf_report
    assert r["nodes"] == 4 and r["procs_per_node"] == 2
    assert (r["jobs_replayed"], r["jobs_zero_length"], r["jobs_unknown_times"]) == (4, 1, 1)
    assert r["oversized_jobs"] == 1 and r["oversubscribed_jobs"] == 1
    assert r["oversubscribed_node_seconds"] == 90 and r["asked_node_seconds"] == 800
    assert r["busy_node_seconds"] == 710 and r["peak_asked_nodes"] == 7
    assert sim.load_swf(TINY_SWF, nodes=8).num_nodes == 8
    with pytest.raises(MalleValueError, match=r"tiny.swf:16: expected 18"):
        sim.load_swf(TINY_SWF, strict=True)
    with pytest.raises(ValueError, match="nodes"):
        sim.load_swf(TINY_SWF, nodes=0)
    with pytest.raises(ValueError, match="procs_per_node"):
        sim.load_swf(TINY_SWF, procs_per_node=-2)


def test_swf_trace_drives_the_simulator(tmp_path):
    # Two nodes: job 1 holds n0 for 0..100, job 2 holds n0 for 200..1000; n1 is never used.
    log = tmp_path / "two.swf"
    log.write_text(
        "; MaxNodes: 2\n"
        "1 0 0 100 1 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n"
        "2 150 50 800 1 -1 -1 1 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n")
    mix = tmp_path / "mix.csv"
    mix.write_text(MIX_HEADER + "job,0,1,2,1000000000,10,5,0;1;2,0;10;20\n")
    # Starts on n1 at 0, grows onto n0 at 100 (10/s x 10 s), shrinks when job 2 takes n0 at
    # 200 (20/s x 5 s): 10 x 100 + 20 x 100 + 10 x 800 - 100 - 100.
    s = sim.simulate(log, mix, policy="dp").summary  # a .swf path is read as a log
    assert s["samples_trained"] == pytest.approx(10800)
    assert s["reclaims"] == 1


def test_job_completion_time_and_makespan(tiny, tmp_path):
    trace, _ = tiny
    mix = tmp_path / "short.csv"
    # Runs on n0 alone from 0 and has trained its 1,000 samples at t = 100.
    mix.write_text(MIX_HEADER + "short,0,1,2,1000,10,5,0;1;2,0;10;20\n")
    s = sim.simulate(trace, mix).summary
    assert s["jobs_finished"] == 1
    assert s["jct_mean_s"] == pytest.approx(100)
    assert s["jct_median_s"] == pytest.approx(100)
    assert s["makespan_s"] == pytest.approx(100)
    _, never = tiny
    s = sim.simulate(trace, never).summary
    assert s["jobs_finished"] == 0
    assert math.isnan(s["jct_mean_s"]) and math.isnan(s["makespan_s"])


def test_synthetic_mix_is_a_function_of_the_seed():
    a = sim.synthetic_job_mix(30, seed=5)
    assert a.num_jobs == 30 and a.names[0] == "S00000"
    assert a.to_csv() == sim.synthetic_job_mix(30, seed=5).to_csv()
    assert a.to_csv() != sim.synthetic_job_mix(30, seed=6).to_csv()
    small = sim.synthetic_job_mix(10, seed=5, max_nodes_lo=2, max_nodes_hi=4)
    rows = list(csv.DictReader(small.to_csv().splitlines()))
    assert all(2 <= int(r["max_nodes"]) <= 4 for r in rows)
    with pytest.raises(ValueError, match="max_nodes_lo..max_nodes_hi"):
        sim.synthetic_job_mix(3, seed=1, max_nodes_lo=9, max_nodes_hi=8)
    with pytest.raises(ValueError, match="seed"):
        sim.synthetic_job_mix(3, seed=-1)
    with pytest.raises(TypeError, match="max_nodes"):
        sim.synthetic_job_mix(3, seed=1, max_nodes=8)


def test_cli_swf_and_synthetic(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["simulate", "--swf", TINY_SWF, "--synthetic", "5", "--seed", "3",
               "--policy", "greedy", "--out", str(out), "--quiet"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "greedy" in captured.out
    assert "tiny.swf:16" in captured.err  # the malformed line, with its line number
    assert "over-subscription: 0.0 node-hours" in captured.err  # 90 node-seconds
    assert "4 jobs replayed" in captured.err
    with open(out / "greedy" / "summary.csv") as f:
        row = next(csv.DictReader(f))
    assert {"jct_mean_s", "jct_median_s", "makespan_s"} <= set(row)
    # The synthetic mix is written, and reads back as the same mix.
    assert (out / "jobs.csv").read_text() == sim.synthetic_job_mix(5, seed=3).to_csv()
    assert sim.load_job_mix(out / "jobs.csv").num_jobs == 5
    # --trace and --swf (or --jobs and --synthetic) exclude each other; --seed needs --synthetic.
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--swf", TINY_SWF, "--trace", "t.csv", "--synthetic", "2"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        main(["simulate", "--swf", TINY_SWF, "--jobs", "j.csv", "--synthetic", "2"])
    assert main(["simulate", "--swf", TINY_SWF, "--jobs", "j.csv", "--seed", "2"]) == 2
    assert "--seed" in capsys.readouterr().err
    assert main(["simulate", "--swf", TINY_SWF, "--swf-nodes", "0", "--synthetic", "2",
                 "--quiet"]) == 2
    assert "nodes" in capsys.readouterr().err


FORECAST_SWF = os.path.join(os.path.dirname(__file__), "..", "data", "forecast.swf")


def test_absolute_time_log_replays_from_its_first_event(tmp_path, capsys):
    # Submit times are Unix seconds and there is no UnixStartTime header.
    trace = sim.load_swf(FORECAST_SWF)
    r = trace.swf_report
    assert r["absolute_times"] is True
    assert r["skipped_lead_s"] == pytest.approx(1600000000)
    assert r["span_s"] == pytest.approx(500)
    assert trace.start == pytest.approx(1600000000)
    mix = tmp_path / "mix.csv"
    mix.write_text(MIX_HEADER + "job,0,1,2,1000000000,10,5,0;1;2,0;10;20\n")
    s = sim.simulate(trace, mix, policy="dp").summary
    # n1 0..200, n0 100..200, both 300..400, n1 400..500: not fifty years of idle nodes.
    assert s["idle_node_hours"] == pytest.approx(600 / 3600)
    assert not any("cannot be right" in w for w in s["warnings"])
    # The CLI says so, loudly.
    assert main(["simulate", "--swf", FORECAST_SWF, "--jobs", str(mix), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: swf: the log gives absolute Unix submit times" in err
    assert "and no UnixStartTime header" in err
    assert "replayed from its first event, not from 1970" in err
    assert "replayed span 0.01 days" in err
    assert r["ignored_unix_start_time"] is None


def test_absolute_times_under_a_unix_start_time_header(tmp_path, capsys):
    # As ALCF's Theta log converted by one public project: "UnixStartTime: 0"
    # and absolute submit times. The warning must not claim there is no header.
    log = tmp_path / "theta-like.swf"
    with open(FORECAST_SWF) as f:
        log.write_text("; UnixStartTime: 0\n" + f.read())
    r = sim.load_swf(str(log)).swf_report
    assert r["absolute_times"] is True
    assert r["ignored_unix_start_time"] == 0
    assert r["span_s"] == pytest.approx(500)
    mix = tmp_path / "mix.csv"
    mix.write_text(MIX_HEADER + "job,0,1,2,1000000000,10,5,0;1;2,0;10;20\n")
    assert main(["simulate", "--swf", str(log), "--jobs", str(mix), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "and a UnixStartTime header of 0, not added" in err
    assert "no UnixStartTime header" not in err


def test_summary_table_has_units_and_warnings(tiny):
    trace, mix = tiny
    r = sim.simulate(trace, mix, policy="dp")
    table = sim.summary_table([r])
    header = table.splitlines()[0]
    for column in ("samples/node-h", "idle node-h", "util %", "eff %", "lost samples", "dec p99 ms",
                   "JCT mean h", "JCT p95 h", "JCT max h", "makespan h", "wall s"):
        assert column in header, column
    # The job could use 2 nodes; only n0 was idle until t = 100 (of 1,000 s).
    assert r.summary["contended_fraction"] == pytest.approx(0.1)
    assert "WARNING (dp): no job finished" in table
    assert "hardly competed" not in table
    s = r.summary
    assert s["samples_per_node_hour"] == pytest.approx(18900 / (1900 / 3600))
    assert s["lost_to_resizes"] == pytest.approx(100)
    assert s["lost_to_reclaims"] == pytest.approx(0)
    assert math.isnan(s["jct_p95_s"])


def two_nodes_two_jobs(tmp_path, work):
    """Two nodes idle from 0 to 1,000 s, and a job per entry of ``work`` (name: samples), each
    10 samples/s on one node and 18 on two, 10 s to grow, 5 s to shrink."""
    trace = tmp_path / "two.csv"
    trace.write_text("time,node,idle\n0,n0,1\n0,n1,1\n1000,n0,1\n")
    mix = tmp_path / "two_jobs.csv"
    mix.write_text(MIX_HEADER + "".join(f"{name},0,1,2,{samples},10,5,0;1;2,0;10;18\n"
                                        for name, samples in work.items()))
    return trace, mix


def test_dominance_on_the_figures_users_feel(tmp_path, capsys):
    # Two identical jobs (10 samples/s on one node, 18 on two; 1,000 samples) on two nodes idle
    # all along: equal share runs each on one node (both done at 100 s, the most samples per
    # node-hour there can be), static one after the other on both (55.6 s and 111.1 s). Each
    # is better on something: neither dominates the other (docs/simulator.md).
    trace, mix = two_nodes_two_jobs(tmp_path, {"a": 1000, "b": 1000})
    equal = sim.simulate(trace, mix, policy="equal_share")
    fixed = sim.simulate(trace, mix, policy="static")
    assert equal.summary["jct_mean_s"] == pytest.approx(100)
    assert equal.summary["samples_per_node_hour"] == pytest.approx(10 * 3600)
    assert fixed.summary["jct_mean_s"] == pytest.approx(1500 / 18)
    assert fixed.summary["samples_per_node_hour"] == pytest.approx(9 * 3600)
    assert sim.worse_figures(fixed, equal) == ["samples/nh", "JCT p95"]
    assert sim.worse_figures(equal, fixed) == ["JCT mean"]
    assert not sim.dominated(fixed, equal) and not sim.dominated(equal, fixed)
    worse = sim.SimulationResult(dict(equal.summary, jct_p95_s=101.0), [], [])
    assert sim.dominated(worse, equal) and not sim.dominated(equal, worse)
    table = sim.dominance_table([equal, fixed, worse])
    assert "equal_share no " in table
    assert "by equal_share" in table.splitlines()[3]
    with pytest.raises(ValueError, match="jct_p95_s"):
        sim.worse_figures(sim.SimulationResult({"samples_per_node_hour": 1.0, "jct_mean_s": 1.0,
                                                "efficiency": 1.0}, [], []), equal)

    assert main(["simulate", "--trace", str(trace), "--jobs", str(mix), "--policy",
                 "equal_share,static", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "dominated?" in printed
    assert "better than static: samples/nh, JCT p95" in printed


def test_rank_weights_and_terms_for(tmp_path, capsys):
    # Two jobs on two nodes (10 samples/s on one, 18 on two): 4,000 and 1,000 samples. With the
    # speedup objective alone each runs on one node and the short one is done at 100 s; with
    # rank weights it gets both nodes and is done at 1000 / 18 s (EngineTest's
    # RankWeightsFinishTheShortJobFirst, from Python).
    trace, mix = two_nodes_two_jobs(tmp_path, {"L": 4000, "S": 1000})
    plain = sim.simulate(trace, mix, policy="dp", objective="speedup", forward_window=30)
    ranked = sim.simulate(trace, mix, policy="dp", objective="speedup", forward_window=30,
                          rank_weights=1)
    short = lambda r: r.jobs[1]["finish"] - r.jobs[1]["submit"]  # noqa: E731
    assert short(plain) == pytest.approx(100)
    assert short(ranked) == pytest.approx(1000 / 18)
    assert ranked.summary["jct_mean_s"] < plain.summary["jct_mean_s"]
    with pytest.raises(ValueError, match="rank_weight_exponent: must be finite and >= 0"):
        sim.simulate(trace, mix, rank_weights=-1)
    with pytest.raises(TypeError, match="rank_weights"):
        sim.simulate(trace, mix, rank_weights="1")

    args = ["simulate", "--trace", str(trace), "--jobs", str(mix), "--quiet",
            "--forward-window", "30", "--objective", "speedup", "--rank-weights", "1"]
    assert main(args + ["--policy", "dp,greedy", "--terms-for", "dp"]) == 0
    assert "dominated?" in capsys.readouterr().out
    assert main(args + ["--policy", "dp", "--terms-for", "dpp"]) == 2
    assert "--terms-for: expected 'all' or policies" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse: a usage error
        main(args + ["--policy", "dp", "--rank-weights", "-1"])
    assert exit_info.value.code == 2
    assert "--rank-weights: must be a finite number >= 0" in capsys.readouterr().err


def test_rank_aging(tmp_path, capsys):
    # One node idle from 0 to 1,000 s; L (3,000 samples) and S1 (1,000) at 0, S2 (1,000) at
    # 90 s, 10 samples/s each on its one node; speedup objective, rank weights, 5-s window.
    # Without aging S2 runs before L (L done at 500 s); aged over 20 s, L ranks as 300 / 6 = 50
    # node-s at 100 s against S2's 100 / 1.5 = 66.7 and runs first, done at 400 s, S2 at 500
    # (EngineTest's AgingLetsTheLongJobThatWaitedGoFirst, from Python and the CLI).
    trace = tmp_path / "one.csv"
    trace.write_text("time,node,idle\n0,n0,1\n1000,n0,1\n")
    mix = tmp_path / "three.csv"
    mix.write_text(MIX_HEADER + "".join(f"{name},{submit},1,1,{samples},10,5,0;1,0;10\n"
                                        for name, submit, samples in
                                        (("L", 0, 3000), ("S1", 0, 1000), ("S2", 90, 1000))))
    terms = dict(policy="dp", objective="speedup", forward_window=5, rank_weights=1)
    finish = lambda r: {j["name"]: j["finish"] - r.jobs[0]["submit"] for j in r.jobs}  # noqa
    plain = sim.simulate(trace, mix, **terms)
    aged = sim.simulate(trace, mix, rank_aging=20, **terms)
    assert finish(plain) == pytest.approx({"L": 500, "S1": 100, "S2": 200})
    assert finish(aged) == pytest.approx({"L": 400, "S1": 100, "S2": 500})
    assert aged.summary["jct_max_s"] == pytest.approx(410)
    assert finish(sim.simulate(trace, mix, rank_aging=datetime.timedelta(seconds=20), **terms)) \
        == finish(aged)
    with pytest.raises(ValueError, match="rank_aging: must be > 0"):
        sim.simulate(trace, mix, rank_aging=0, **terms)
    with pytest.raises(ValueError, match="rank_aging: is 20s, but rank weights are off"):
        sim.simulate(trace, mix, policy="dp", rank_aging=20)
    with pytest.raises(TypeError, match="rank_aging"):
        sim.simulate(trace, mix, rank_aging="20", **terms)

    out = tmp_path / "out"
    args = ["simulate", "--trace", str(trace), "--jobs", str(mix), "--quiet", "--policy", "dp",
            "--forward-window", "5", "--objective", "speedup", "--rank-weights", "1",
            "--out", str(out)]
    assert main(args + ["--rank-aging", str(20 / 3600)]) == 0
    with open(out / "dp" / "summary.csv") as f:
        assert float(next(csv.DictReader(f))["jct_max_s"]) == pytest.approx(410)
    with pytest.raises(SystemExit) as exit_info:  # argparse: a usage error
        main(args + ["--rank-aging", "0"])
    assert exit_info.value.code == 2
    assert "--rank-aging: must be a finite number > 0" in capsys.readouterr().err


def test_node_classes(tmp_path, capsys):
    # Two nodes idle from 0 to 1,000 s, n0 at speed 1 and n1 at 0.75: on both the job trains
    # 20 x 0.75 = 15 samples/s, more than 10/s on n0 alone, so the DP runs it on both
    # (EngineTest.NodeClassesSetTheRate, from Python and the CLI).
    trace = tmp_path / "two.csv"
    trace.write_text("time,node,idle\n0,n0,1\n0,n1,1\n1000,n0,1\n")
    mix = tmp_path / "mix.csv"
    mix.write_text(MIX_HEADER + "job,0,1,2,1000000000,10,5,0;1;2,0;10;20\n")
    s = sim.simulate(trace, mix, policy="dp", node_classes="a:g:1:0.5,b:g:0.75:0.5").summary
    assert s["samples_trained"] == pytest.approx(15000)
    # Two locality groups: spanning them costs the factor, 20 x 0.8 = 16/s.
    s = sim.simulate(trace, mix, policy="dp", node_classes="a:g0:1:0.5,b:g1:1:0.5",
                     cross_locality_factor=0.8).summary
    assert s["samples_trained"] == pytest.approx(16000)
    with pytest.raises(ValueError, match="shares must sum to 1, they sum to 0.9"):
        sim.simulate(trace, mix, node_classes="a:g:1:0.5,b:g:0.75:0.4")
    with pytest.raises(ValueError, match="speed 'x' is not a number"):
        sim.simulate(trace, mix, node_classes="a:g:x:1")
    with pytest.raises(ValueError, match=r"cross_locality_factor: must be in \(0, 1\]"):
        sim.simulate(trace, mix, node_classes="a:g:1:1", cross_locality_factor=2)
    with pytest.raises(TypeError, match="cross_locality_factor"):
        sim.simulate(trace, mix, cross_locality_factor="0.9")

    out = tmp_path / "out"
    args = ["simulate", "--trace", str(trace), "--jobs", str(mix), "--quiet", "--policy", "dp",
            "--out", str(out)]
    assert main(args + ["--node-classes", "a:g:1:0.5,b:g:0.75:0.5"]) == 0
    with open(out / "dp" / "summary.csv") as f:
        assert float(next(csv.DictReader(f))["samples_trained"]) == pytest.approx(15000)
    assert main(args + ["--node-classes", "a:g:1"]) == 2
    assert "item 1 'a:g:1': expected id:locality:speed:share" in capsys.readouterr().err


def test_forecasts_objectives_and_a_saturated_mix(tiny, tmp_path):
    trace, mix = tiny
    for options in ({"forecast": "reservation"}, {"reclaim_hazard": True},
                    {"resize_hysteresis": 2.0}, {"objective": "completion"}):
        s = sim.simulate(trace, mix, policy="dp", **options).summary
        assert s["decisions"] > 0, options
        assert s["decisions_fell_back"] == 0, (options, s["warnings"])
    # Hysteresis 2 charges the grow at 100 s 2 x 10 s x 20 samples/s = 400 samples against
    # 900 s x 10 samples/s gained: still worth it.
    s = sim.simulate(trace, mix, policy="dp", resize_hysteresis=2.0).summary
    assert s["resizes"] == 2
    with pytest.raises(MalleValueError, match="resize_hysteresis: must be finite and >= 1"):
        sim.simulate(trace, mix, resize_hysteresis=0.5)
    with pytest.raises(MalleValueError, match="forecast"):
        sim.simulate(trace, mix, forecast="psychic")
    three = sim.repeat_mix(mix, 3, 3600)
    assert three.num_jobs == 3
    assert three.names == ["job", "job~1", "job~2"]
    with pytest.raises(MalleValueError, match="copies: must be in"):
        sim.repeat_mix(mix, 0, 3600)
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(trace), "--jobs", str(mix), "--repeat-mix", "2",
                 "--repeat-period", "0.01", "--reclaim-hazard", "--hysteresis", "1.5",
                 "--forecast", "reservation", "--quiet", "--out", str(out)]) == 0
    with open(out / "dp" / "summary.csv") as f:
        row = next(csv.DictReader(f))
    assert row["jobs_submitted"] == "2"
    assert "hardly competed" not in row["warnings"]  # two jobs want 4 nodes of 2


def test_preemption_cost_modes_by_hand(tmp_path, capsys):
    # Two nodes idle from 0; n1 reclaimed at 550 (the 2-node job stops: r(2) x 5 s for the
    # forced shrink), back at 700; end at 1000. r(2) = 20/s. Park 1 + 100/50 = 3 s, unpark
    # 0.5 + 100/200 = 1 s (tests/cpp/sim/engine_test.cc works out every mode).
    trace = tmp_path / "t.csv"
    trace.write_text("time,node,idle\n0,n0,1\n0,n1,1\n550,n1,0\n700,n1,1\n1000,n0,1\n")
    mix = tmp_path / "m.csv"
    mix.write_text(MIX_HEADER + "job,0,2,2,1000000000,10,5,0;1;2,0;10;20\n")
    costs = dict(state_bytes=100e6, write_bytes_per_s=50e6, read_bytes_per_s=200e6,
                 park_fixed=1.0, unpark_fixed=0.5)
    free = sim.simulate(trace, mix, preemption_cost="free", **costs).summary
    park = sim.simulate(trace, mix, **costs).summary  # the default
    restart = sim.simulate(trace, mix, preemption_cost="restart", **costs).summary
    assert free["samples_trained"] == pytest.approx(20 * 550 - 100 + 20 * 300)
    assert park["samples_trained"] == pytest.approx(free["samples_trained"] - 80)
    assert park["lost_to_preemptions"] == pytest.approx(80)
    assert park["preemption_cost"] == "park (100 MB state: park 3.00 s, unpark 1.00 s)"
    assert restart["samples_trained"] == pytest.approx(20 * 300)
    with pytest.raises(ValueError, match="preemption.state_bytes"):
        sim.simulate(trace, mix, state_bytes=-1.0)
    with pytest.raises(ValueError, match="free, park, snapshot, restart"):
        sim.simulate(trace, mix, preemption_cost="parked")
    # The CLI: the mode in the table; bad flags named.
    assert main(["simulate", "--trace", str(trace), "--jobs", str(mix), "--quiet",
                 "--preemption-cost", "restart"]) == 0
    assert "preemption cost: restart" in capsys.readouterr().out
    for flag, value in (("--preemption-cost", "parked"), ("--state-mb", "-1"),
                        ("--park-write-mb-s", "0"), ("--snapshot-budget", "1")):
        with pytest.raises(SystemExit):
            main(["simulate", "--trace", str(trace), "--jobs", str(mix), flag, value])
        assert flag in capsys.readouterr().err
