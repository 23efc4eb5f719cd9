"""tests/python/committed_history.py: accounting samples across incarnations (the chaos bench's).

Synthetic traces of a job of 2 logical workers, 2 samples each per step, on a data set of 8
(one epoch = 2 steps); the sampler is a pure function of (epoch, step, worker) as in
malletrain, and the state after step s has digest "d<s>" ("d-1": the initial state).
"""

from __future__ import annotations

import random

import pytest

from committed_history import committed_history, differs_from, lost_and_repeated

N, WORKERS, STEPS = 8, 2, 10


def indices(step: int, worker: int):
    perm = list(range(N))
    random.Random(step // 2).shuffle(perm)  # one permutation per epoch
    base = (step % 2) * 4 + worker * 2
    return perm[base:base + 2]


def run(first: int, last: int, *, begin_digest=None, sampler=indices, snapshots=()):
    """Rows of one incarnation that begins at `first` and commits steps first..last-1."""
    rows = [{"type": "begin", "step": first, "digest": begin_digest or f"d{first - 1}"}]
    for s in range(first, last):
        for k in range(WORKERS):
            rows.append({"type": "micro", "step": s, "worker": k, "indices": sampler(s, k)})
        rows.append({"type": "commit", "step": s, "digest": f"d{s}"})
    return rows


def account(rows_by_inc, final="i_last"):
    h = committed_history(rows_by_inc, final, STEPS, WORKERS)
    return h, lost_and_repeated(h, STEPS, WORKERS, N)


def per_incarnation(rows):
    """What the bench counted before: the samples of the completing incarnation alone."""
    stream = [i for s in range(STEPS) for k in range(WORKERS)
              for i in next((r["indices"] for r in rows if r["type"] == "micro"
                             and r["step"] == s and r["worker"] == k), [])]
    lost = sum(N - len(set(stream[e * N:(e + 1) * N])) for e in range(STEPS // 2))
    return lost


def test_one_incarnation():
    h, (lost, repeated) = account({"i_last": run(0, STEPS)})
    assert h.complete, h.problems
    assert h.segments == [("i_last", 0, STEPS)]
    assert (lost, repeated) == (0, 0)


def test_a_resume_from_a_park_continues_the_history():
    rows = {"i0": run(0, 6), "i_last": run(6, STEPS)}  # parked after step 5
    h, (lost, repeated) = account(rows)
    assert h.complete, h.problems
    assert h.segments == [("i0", 0, 6), ("i_last", 6, STEPS)]
    assert (lost, repeated) == (0, 0)
    assert per_incarnation(rows["i_last"]) > 0  # the old accounting called this a loss


def test_steps_redone_after_a_snapshot_are_not_repeats():
    # i0 committed up to step 7, but its last snapshot holds the state after step 3: i_last
    # begins at step 4 and trains 4..7 again; i0's attempts of them are not in the result.
    rows = {"i0": run(0, 8), "i_last": run(4, STEPS)}
    h, (lost, repeated) = account(rows)
    assert h.complete, h.problems
    assert h.segments == [("i0", 0, 4), ("i_last", 4, STEPS)]
    assert (lost, repeated) == (0, 0)


def test_the_chain_skips_an_incarnation_that_left_no_state():
    # i1 resumed from i0's snapshot at 3, committed 3 and 4 and died without a snapshot;
    # i_last resumed from the same snapshot.
    rows = {"i0": run(0, 6), "i1": run(3, 5), "i_last": run(3, STEPS)}
    h, (lost, repeated) = account(rows)
    assert h.complete, h.problems
    assert h.segments == [("i0", 0, 3), ("i_last", 3, STEPS)]
    assert (lost, repeated) == (0, 0)


def test_a_state_nobody_committed_breaks_the_chain():
    rows = {"i0": run(0, 6), "i_last": run(6, STEPS, begin_digest="d-unknown")}
    h, _ = account(rows)
    assert not h.complete
    assert any("chain is broken" in p for p in h.problems), h.problems


def test_a_resume_at_the_wrong_data_position_is_caught():
    # The state is linked correctly, but the resumed sampler starts its epoch over.
    wrong = lambda s, k: indices(s - 1 if s % 2 else s, k)  # noqa: E731
    rows = {"i0": run(0, 5), "i_last": run(5, STEPS, sampler=wrong)}
    h, (lost, repeated) = account(rows)
    assert h.complete, h.problems
    assert lost > 0 and repeated > 0
    reference = committed_history({"fixed": run(0, STEPS)}, "fixed", STEPS, WORKERS)
    assert differs_from(h, reference)


def test_an_uncommitted_step_of_the_final_incarnation_is_reported():
    rows = run(0, STEPS)
    rows = [r for r in rows if not (r["type"] == "commit" and r["step"] == 7)]
    h, _ = account({"i_last": rows})
    assert any("did not commit step 7" in p for p in h.problems), h.problems


@pytest.mark.parametrize("missing", [(3, 1)])
def test_a_missing_micro_batch_is_reported(missing):
    rows = [r for r in run(0, STEPS) if not (r["type"] == "micro"
                                             and (r["step"], r["worker"]) == missing)]
    h, _ = account({"i_last": rows})
    assert any("no trace of step 3, worker 1" in p for p in h.problems), h.problems


def test_a_commit_of_a_rank_lost_right_after_it_is_not_the_history():
    # Two ranks; at step 4 rank b commits (its digest "x4") and is killed before a commits:
    # a redoes step 4 alone ("d4") and trains on. b's commit is not part of the history.
    rows = [dict(r, member="a") for r in run(0, STEPS)]
    rows += [dict(r, member="b") for r in run(0, 4)]
    rows += [{"type": "micro", "step": 4, "worker": k, "indices": indices(4, k), "member": "b"}
             for k in range(WORKERS)]
    rows.append({"type": "commit", "step": 4, "digest": "x4", "member": "b"})
    h, (lost, repeated) = account({"i_last": rows})
    assert h.complete, h.problems
    assert h.lost_commits == 1 and (lost, repeated) == (0, 0)
    # But two ranks that both trained on after disagreeing: a divergence, reported.
    rows.append({"type": "micro", "step": 5, "worker": 0, "indices": indices(5, 0), "member": "b"})
    h, _ = account({"i_last": rows})
    assert any("trained on disagree on the state after step 4" in p for p in h.problems), h.problems
