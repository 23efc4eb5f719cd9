"""State transfer to joiners that share a node (issue 23): the state crosses into a node once,
to its first joiner, which copies it to the others there; and the joiners end up with
exactly the others' state (parameters, BatchNorm statistics and counter, a module's own
buffers, AdamW's state, a tracked scheduler: the job state's digest).

Real processes (tests/python/node_job.py) started with their own MALLE_NODE, a loopback store
on an ephemeral port, every process stopped by pid (node_job.run_grow).
"""

from __future__ import annotations

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from node_job import run_grow  # noqa: E402


def grow_event(result: dict) -> dict:
    """The membership change that admitted the joiners (size 2 -> 4)."""
    events = [e for e in result["history"] if e["size"] == 4 and e["kind"] in ("planned", "joined")]
    assert len(events) == 1, result["history"]
    return events[0]


def check_exact(results: dict) -> None:
    """Every rank holds the same whole state at the first step after the join, and at the end."""
    first = min(int(s) for s, _ in results["j0"]["digests"].items())
    at_join = {m: r["digests"][str(first)] for m, r in results.items()}
    assert len(set(at_join.values())) == 1, (first, at_join)
    final = {m: r["final_digest"] for m, r in results.items()}
    assert len(set(final.values())) == 1, final
    assert all(r["steps"] == 12 for r in results.values())


@pytest.mark.parametrize("joiner_nodes", [("c", "c"), ("c", "d")], ids=["one-node", "two-nodes"])
def test_joiners_on_one_node_take_the_state_across_the_network_once(tmp_path, joiner_nodes):
    """Founders on nodes a and b; two joiners on one node c (or on c and d, the reference).
    Bytes across node boundaries: one state for node c, two for c and d."""
    results = run_grow(tmp_path / "run", "nodexfer", founders=("a", "b"), joiners=joiner_nodes)
    check_exact(results)
    events = {m: grow_event(r) for m, r in results.items()}
    state = events["j0"]["state_bytes"]
    assert state > 100_000, events  # the whole state moved: parameters and AdamW's moments
    assert all(events[j]["state_bytes"] == state for j in ("j0", "j1")), events
    on_wire = sum(e["received_remote"] for e in events.values())
    if joiner_nodes[0] == joiner_nodes[1]:
        assert on_wire == state, events
        # The node's first rank (the joiner admitted first) got it from the source and
        # copied it to the other locally.
        relay, peer = sorted(("j0", "j1"), key=lambda j: events[j]["rank"])
        assert events[relay]["received_remote"] == state, events
        assert events[relay]["sent_local"] == state, events
        assert events[peer]["received_remote"] == 0, events
        assert sum(e["sent_remote"] for e in events.values()) == state, events
    else:
        assert on_wire == 2 * state, events
        assert all(events[j]["received_remote"] == state for j in ("j0", "j1")), events
        assert sum(e["sent_local"] for e in events.values()) == 0, events
