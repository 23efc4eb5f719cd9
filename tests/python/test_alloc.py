"""malletrain.alloc and `malletrain alloc`: the allocator from Python."""

from __future__ import annotations

import copy
import datetime
import io
import json
import pathlib

import pytest

import malletrain
from malletrain import alloc, cli, errors

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "alloc" / "problem_small.json"
POLICIES = ("milp", "dp", "greedy", "equal_share", "static")

# 6 nodes; "a" holds n0 and gains most per node; "b" needs exactly 2.
# The optimum (every policy's answer too) is a: 4 nodes, b: 2 nodes.
PROBLEM = {
    "version": 1,
    "node_count": 6,
    "jobs": [
        {
            "id": "a",
            "min_nodes": 1,
            "max_nodes": 4,
            "throughput": [[1, 100], [4, 400]],
            "nodes": ["n0"],
        },
        {"id": "b", "min_nodes": 2, "max_nodes": 2, "throughput": [[2, 150]]},
    ],
}


def _problem(**changes) -> dict:
    p = copy.deepcopy(PROBLEM)
    p.update(changes)
    return p


def _check_decision_shape(d: dict, policy: str) -> None:
    assert d["version"] == 1
    assert d["policy"] == policy
    assert isinstance(d["reason"], str) and d["reason"]
    assert d["fell_back"] is False and d["answered_by"] == policy  # each policy answers itself
    assert set(d["solver"]) == {"rows", "columns", "branch_nodes", "best_bound"}
    assert [j["id"] for j in d["jobs"]] == ["a", "b"]
    held = []
    for job in d["jobs"]:
        assert job["count"] == len(job["nodes"])
        assert job["change"] in {"grow", "shrink", "start", "stop", "same"}
        assert "batch_option" not in job  # no job here has batch options
        held += job["nodes"]
    assert sorted(held + d["idle_nodes"]) == [f"n{i}" for i in range(6)]
    assert len(set(held)) == len(held)  # no node given twice


# --- solve ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_solve_each_policy(policy):
    d = alloc.solve(PROBLEM, policy=policy, time_limit=2.0)
    _check_decision_shape(d, policy)
    a = d["jobs"][0]
    assert "n0" in a["nodes"]  # a job that keeps running keeps its node
    assert a["previous_count"] == 1


@pytest.mark.parametrize("policy", ["milp", "dp"])
def test_exact_policies_find_the_optimum(policy):
    d = alloc.solve(PROBLEM, policy=policy, time_limit=datetime.timedelta(seconds=2))
    a, b = d["jobs"]
    assert (a["count"], a["change"]) == (4, "grow")
    assert (b["count"], b["change"]) == (2, "start")
    assert d["idle_nodes"] == []
    assert d["objective"] > d["current_objective"]
    assert a["samples_per_s"] == pytest.approx(400.0)
    assert b["samples_per_s"] == pytest.approx(150.0)


def test_milp_in_process():
    d = alloc.solve(PROBLEM, policy="milp", isolation="in_process")
    assert [j["count"] for j in d["jobs"]] == [4, 2]


def test_static_keeps_rigid_jobs_as_they_are():
    p = _problem()
    p["jobs"][0]["nodes"] = ["n0", "n2", "n4", "n5"]  # "a" runs at its max_nodes
    d = alloc.solve(p, policy="static")
    a, b = d["jobs"]
    assert (a["nodes"], a["change"]) == (["n0", "n2", "n4", "n5"], "same")
    assert (sorted(b["nodes"]), b["change"]) == (["n1", "n3"], "start")


def test_problem_as_dict_str_and_path(tmp_path):
    text = json.dumps(PROBLEM)
    path = tmp_path / "problem.json"
    path.write_text(text)
    answers = [
        alloc.solve(p, policy="dp")
        for p in (PROBLEM, text, "  \n" + text, path, str(path))
    ]
    for d in answers[1:]:
        assert d["jobs"] == answers[0]["jobs"]
        assert d["idle_nodes"] == answers[0]["idle_nodes"]


def test_batch_option_is_named():
    p = _problem(
        jobs=[
            {
                "id": "a",
                "max_nodes": 6,
                "batch_options": [
                    {"name": "bs256", "throughput": [[1, 100], [6, 500]]},
                    {"name": "bs1024", "throughput": [[1, 90], [6, 560]]},
                ],
            }
        ]
    )
    d = alloc.solve(p, policy="dp")
    assert d["jobs"][0]["batch_option"] == "bs1024"
    assert d["jobs"][0]["count"] == 6


def test_example_problem_solves():
    d = alloc.solve(EXAMPLE, policy="milp", time_limit=2.0)
    example = json.loads(EXAMPLE.read_text())
    assert [j["id"] for j in d["jobs"]] == [j["id"] for j in example["jobs"]]
    held = [n for j in d["jobs"] for n in j["nodes"]]
    assert sorted(held + d["idle_nodes"]) == sorted(n["id"] for n in example["nodes"])


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (
            _problem(jobs=[{"id": "a", "max_nodes": 2, "throughput": [[1, 10], [2.5, 20]]}]),
            "jobs[0].throughput[1][0]: expected an integer node count, got 2.5",
        ),
        (_problem(version=2), "version: unsupported version 2"),
        (_problem(nodecount=3), "nodecount: unknown key"),
        (_problem(forward_window_s=-1), "forward_window_s: a duration must be >= 0 seconds"),
        (_problem(objective="fastest"), 'objective: expected one of "throughput"'),
        (_problem(nodes=[{"id": "x"}]), 'node_count: give either "nodes" or "node_count"'),
        ('{"version": 1, ', "malformed JSON: parse error at line 1"),
        (_problem(forward_window_s=float("nan")), "problem: Out of range float values"),
    ],
)
def test_bad_problem_raises_value_error_naming_the_field(problem, message):
    with pytest.raises(ValueError) as info:
        alloc.solve(problem, policy="dp")
    assert message in str(info.value)
    assert isinstance(info.value, errors.MalleValueError)
    with pytest.raises(errors.MalleValueError) as info:
        alloc.validate(problem)
    assert message in str(info.value)


def test_semantic_error_names_the_job():
    p = _problem()
    p["jobs"][1]["nodes"] = ["n0"]  # already held by "a"
    with pytest.raises(malletrain.MalleValueError, match=r'jobs\[1\] \("b"\)'):
        alloc.validate(p)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"policy": "best"}, ValueError, 'policy: unknown policy "best"'),
        ({"isolation": "thread"}, ValueError, "isolation: expected one of"),
        ({"time_limit": 0}, ValueError, "time_limit: must be a finite duration > 0"),
        ({"time_limit": datetime.timedelta(0)}, ValueError, "time_limit"),
        ({"time_limit": float("inf")}, ValueError, "time_limit"),
        ({"time_limit": "1s"}, TypeError, "time_limit must be seconds"),
    ],
)
def test_bad_options(kwargs, error, message):
    with pytest.raises(error) as info:
        alloc.solve(PROBLEM, **kwargs)
    assert message in str(info.value)


def test_objective_terms_from_python():
    # Rank weights (docs/allocator-json.md): the job closer to done weighs 2, the other 1, so
    # both nodes go to it (2 x 1.8 beats 2 x 1 + 1 x 1); without them, one node each.
    problem = {
        "version": 1, "node_count": 2, "objective": "speedup", "forward_window_s": 30,
        "jobs": [{"id": name, "min_nodes": 1, "max_nodes": 2, "throughput": [[1, 10], [2, 18]],
                  "remaining_samples": work} for name, work in (("long", 4000), ("short", 1000))],
    }
    sizes = lambda d: {j["id"]: len(j["nodes"]) for j in d["jobs"]}  # noqa: E731
    assert sizes(alloc.solve(problem, policy="dp")) == {"long": 1, "short": 1}
    ranked = dict(problem, rank_weight_exponent=1, resize_hysteresis=2, reclaim_rate=1e-6)
    assert sizes(alloc.solve(ranked, policy="dp")) == {"long": 0, "short": 2}
    assert sizes(alloc.solve(ranked, policy="milp")) == {"long": 0, "short": 2}
    with pytest.raises(malletrain.MalleValueError,
                       match=r'jobs\[0\] \("long"\).remaining_samples: must be > 0'):
        alloc.solve(dict(problem, objective="completion",
                         jobs=[dict(problem["jobs"][0], remaining_samples=0)]))


def test_bad_problem_types():
    with pytest.raises(TypeError, match="problem must be a dict"):
        alloc.solve(42)
    with pytest.raises(FileNotFoundError):
        alloc.solve("/nonexistent/problem.json")


def test_validate_returns_none_for_a_good_problem():
    assert alloc.validate(PROBLEM) is None
    assert alloc.validate(EXAMPLE) is None


# --- CLI ------------------------------------------------------------------------------------------


@pytest.fixture
def problem_file(tmp_path) -> pathlib.Path:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(PROBLEM))
    return path


def test_cli_solve(problem_file, capsys):
    assert cli.main(["alloc", "solve", str(problem_file), "--policy", "dp"]) == 0
    out = capsys.readouterr().out
    d = json.loads(out)
    assert [j["count"] for j in d["jobs"]] == [4, 2]
    assert "\n  " in out  # indented by default


def test_cli_solve_compact_with_time_limit(problem_file, capsys):
    argv = ["alloc", "solve", str(problem_file), "--time-limit", "0.5", "--compact"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out)["policy"] == "milp"


def test_cli_reads_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(PROBLEM)))
    assert cli.main(["alloc", "validate", "-"]) == 0
    assert capsys.readouterr().out.strip() == "ok: 2 jobs, 6 nodes, 1 pools"


def test_cli_validate(problem_file, capsys):
    assert cli.main(["alloc", "validate", str(problem_file)]) == 0
    assert capsys.readouterr().out.strip() == "ok: 2 jobs, 6 nodes, 1 pools"


def test_cli_bad_problem_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_problem(node_count=2.5)))
    for command in ("solve", "validate"):
        assert cli.main(["alloc", command, str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "node_count: expected an integer node count, got 2.5" in captured.err


def test_cli_missing_file_exits_2(tmp_path, capsys):
    assert cli.main(["alloc", "solve", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_cli_bad_policy_exits_2(problem_file, capsys):
    assert cli.main(["alloc", "solve", str(problem_file), "--policy", "best"]) == 2
    assert 'unknown policy "best"' in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf"])
def test_cli_bad_time_limit_is_a_usage_error(problem_file, value, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["alloc", "solve", str(problem_file), f"--time-limit={value}"])
    assert info.value.code == 2
    assert "--time-limit" in capsys.readouterr().err
