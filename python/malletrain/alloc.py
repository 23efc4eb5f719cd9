"""Allocate idle nodes to elastic jobs: the allocator of libmalle, from Python.

A *problem* lists the idle nodes (optionally grouped in classes with a speed,
a locality group and an expected idle window) and the elastic jobs with their
throughput curves and the nodes they hold now. :func:`solve` decides which
nodes each job should hold next; :func:`validate` only checks the problem.
The JSON format of the problem and of the decision is documented in
``docs/allocator-json.md``.

Example::

    from malletrain import alloc

    problem = {
        "version": 1,
        "node_count": 8,
        "jobs": [
            {"id": "resnet", "min_nodes": 1, "max_nodes": 8,
             "throughput": [[1, 5218.8], [2, 10582.5], [4, 20436], [8, 39584]],
             "nodes": ["n0", "n1"]},
            {"id": "vgg", "min_nodes": 2, "max_nodes": 4,
             "throughput": [[2, 2389.2], [4, 4691.7]]},
        ],
    }
    decision = alloc.solve(problem, policy="milp", time_limit=0.5)
    for job in decision["jobs"]:
        print(job["id"], job["change"], job["nodes"])

Invalid input raises :class:`malletrain.MalleValueError` (a ``ValueError``)
whose message starts with the JSON path of the offending field, e.g.
``jobs[0].throughput[1][0]: expected an integer node count, got 2.5``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import Any, Union

from malletrain import _C
from malletrain.errors import MalleValueError

__all__ = ["POLICIES", "ISOLATIONS", "solve", "validate"]

#: Names accepted by ``solve(policy=...)``.
POLICIES = ("milp", "dp", "greedy", "equal_share", "static")
#: Names accepted by ``solve(isolation=...)``.
ISOLATIONS = ("fork", "in_process")

ProblemLike = Union[dict, str, "os.PathLike[str]"]


def _problem_json(problem: ProblemLike) -> str:
    """The problem as JSON text: a dict is serialised, a str holding a JSON
    object is taken as is, any other str or an ``os.PathLike`` is read as a file."""
    if isinstance(problem, dict):
        try:
            # allow_nan=False: NaN and inf are not JSON; say so here rather than
            # let the C++ parser report a malformed document.
            return json.dumps(problem, allow_nan=False)
        except ValueError as e:
            raise MalleValueError(f"problem: {e}") from e
        except TypeError as e:
            raise MalleValueError(f"problem: {e}") from e
    if isinstance(problem, str) and problem.lstrip().startswith("{"):
        return problem
    if isinstance(problem, (str, os.PathLike)):
        with open(problem, encoding="utf-8") as f:
            return f.read()
    raise TypeError(
        f"problem must be a dict, a JSON string or a path to a JSON file, "
        f"not {type(problem).__name__}"
    )


def _seconds(time_limit: float | datetime.timedelta) -> float:
    if isinstance(time_limit, datetime.timedelta):
        seconds = time_limit.total_seconds()
    elif isinstance(time_limit, (int, float)) and not isinstance(time_limit, bool):
        seconds = float(time_limit)
    else:
        raise TypeError(
            f"time_limit must be seconds (a number) or a datetime.timedelta, "
            f"not {type(time_limit).__name__}"
        )
    if not (math.isfinite(seconds) and seconds > 0):
        raise MalleValueError(f"time_limit: must be a finite duration > 0, got {time_limit!r}")
    return seconds


def solve(
    problem: ProblemLike,
    *,
    policy: str = "milp",
    time_limit: float | datetime.timedelta = 1.0,
    isolation: str = "fork",
) -> dict[str, Any]:
    """Decides which nodes each job should hold.

    Args:
        problem: the problem as a dict, as a JSON string, or as the path
            (``str`` or ``os.PathLike``) of a JSON file.
        policy: ``"milp"`` (optimal, CBC; the default), ``"dp"`` (exact dynamic
            programming), ``"greedy"``, ``"equal_share"`` or ``"static"``
            (baselines).
        time_limit: wall-clock limit of a decision with the MILP, in seconds
            or as a ``timedelta``: compiling the problem counts against it,
            and the MILP solve gets the rest. When it is reached the best
            allocation found so far is returned (``decision["optimal"]`` is
            then ``False``).
        isolation: ``"fork"`` runs CBC in a child process, so that a crash or
            a hang of the solver cannot take the caller down;
            ``"in_process"`` is cheaper.

    Returns:
        The decision as a dict (``docs/allocator-json.md``): ``jobs`` (one
        entry per job, in the problem's order, with ``nodes``, ``count``,
        ``previous_count``, ``change``...), ``idle_nodes``, ``objective``,
        ``reason`` and solver details.

    Blocks for at most about ``time_limit`` (plus a short grace period) and
    releases the GIL meanwhile.

    Raises:
        malletrain.MalleValueError: the problem or an option is invalid; the
            message names the field (JSON path first).
        OSError: ``problem`` is a path that cannot be read.
        TypeError: an argument has the wrong type.
        malletrain.MalleError: the allocator failed for another reason.

    Example::

        >>> d = alloc.solve({"version": 1, "node_count": 2,
        ...                  "jobs": [{"id": "a", "max_nodes": 2,
        ...                           "throughput": [[1, 10], [2, 19]]}]}, policy="dp")
        >>> d["jobs"][0]["nodes"], d["jobs"][0]["change"]
        (['n0', 'n1'], 'start')
    """
    options = {
        "policy": policy,
        "time_limit_s": _seconds(time_limit),
        "isolation": isolation,
    }
    return json.loads(_C.alloc_solve(_problem_json(problem), json.dumps(options)))


def validate(problem: ProblemLike) -> None:
    """Checks a problem without solving it.

    Args:
        problem: as for :func:`solve`.

    Raises:
        malletrain.MalleValueError: the problem is invalid; the message names
            the field, e.g. ``jobs[1] ("vgg"): min_nodes = 5 > max_nodes = 4``.
        OSError: ``problem`` is a path that cannot be read.

    Example::

        >>> alloc.validate({"version": 1, "node_count": 4, "jobs": []})
    """
    _summary(problem)


def _summary(problem: ProblemLike) -> str:
    """Validates ``problem``; returns ``"ok: N jobs, M nodes, K pools"`` (the CLI prints it)."""
    return _C.alloc_validate(_problem_json(problem))
