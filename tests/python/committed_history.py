"""The committed history of a job that ran as several incarnations (tests and the chaos bench).

A job that loses every rank starts a new incarnation, which resumes from the state its
predecessor parked or snapshotted, at that state's step; steps the predecessor committed after
that state are trained again and the earlier attempts are not part of the result. So "was a
sample lost or trained twice" is a question about the *committed history*: the chain of
states from step 0 to the final one, each segment trained by one incarnation.

The traces of ``examples/train_digits.py --out`` give it: every rank writes a ``begin`` row
(the step and state digest it starts training from), a ``micro`` row per micro-batch (step,
logical worker, sample indices) and a ``commit`` row per committed step (step and the digest of
the state after it). The chain is followed backwards from the incarnation that completed:
its begin state (step r, digest d) is the state after step r-1 of the incarnation that
committed step r-1 with digest d (a park, or a snapshot); that one's own begin state links
further back, down to an incarnation that began at step 0. A begin state that no incarnation
committed breaks the chain (reported: the samples before it cannot be accounted for).

Within an incarnation the ranks agree on every committed state, with one exception the design
allows: a rank killed right after it committed a step, before the others did, takes its commit
with it (they redo the step without it: at most one step is lost). Its digest may differ (the
redo runs at another size: another summation order); the history follows the ranks that
trained on (rows carry their ``member``), and such commits are counted, not errors.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple


@dataclass
class Incarnation:
    name: str
    begins: Dict[int, set] = field(default_factory=lambda: collections.defaultdict(set))
    commits: Dict[int, set] = field(default_factory=lambda: collections.defaultdict(set))
    micro: Dict[Tuple[int, int], set] = field(default_factory=lambda: collections.defaultdict(set))
    # step -> digest -> members that wrote it; member -> the last step it started training
    committers: Dict[int, Dict[str, set]] = field(
        default_factory=lambda: collections.defaultdict(lambda: collections.defaultdict(set)))
    last_micro: Dict[str, int] = field(default_factory=dict)

    def add(self, row: dict) -> None:
        t = row.get("type")
        member = str(row.get("member", "?"))
        if t == "begin":
            self.begins[int(row["step"])].add(row["digest"])
        elif t == "commit":
            self.commits[int(row["step"])].add(row["digest"])
            self.committers[int(row["step"])][row["digest"]].add(member)
        elif t == "micro":
            self.micro[(int(row["step"]), int(row["worker"]))].add(tuple(row["indices"]))
            self.last_micro[member] = max(self.last_micro.get(member, -1), int(row["step"]))

    @property
    def start(self) -> Optional[int]:
        return min(self.begins) if self.begins else None

    def committed(self, step: int) -> Tuple[set, List[str]]:
        """The digests of the state after `step` that the incarnation went on from, and what
        is wrong with them. A rank lost right after its own commit (killed before the others
        committed the step: they redo it without it, at most one step lost) may have written a
        digest the survivors did not: that one is not part of the history. Ranks that
        trained on after the step must agree."""
        by_digest = self.committers.get(step, {})
        if len(by_digest) <= 1:
            return set(by_digest), []
        went_on = {d for d, members in by_digest.items()
                   if any(self.last_micro.get(m, -1) > step for m in members)}
        if len(went_on) > 1:
            return went_on, [f"{self.name}: ranks that trained on disagree on the state after "
                             f"step {step}"]
        if not went_on:  # the incarnation ended here: its successor's link decides
            return set(by_digest), []
        return went_on, []

    def lost_commits(self, first: int, end: int) -> int:
        """Steps in [first, end) some rank committed in a state the incarnation did not go on
        from."""
        return sum(1 for s in self.committers if first <= s < end
                   and len(self.committed(s)[0]) < len(self.committers[s]))


@dataclass
class History:
    segments: List[Tuple[str, int, int]]   # (incarnation, first step, end step), in step order
    samples: Dict[Tuple[int, int], tuple]  # (step, worker) -> the indices committed
    problems: List[str]
    lost_commits: int = 0  # a rank's own commit of a step its survivors redid (it was lost)

    @property
    def complete(self) -> bool:
        return not self.problems


def incarnations(rows_by_incarnation: Dict[str, Iterable[dict]]) -> Dict[str, Incarnation]:
    out = {}
    for name, rows in rows_by_incarnation.items():
        inc = Incarnation(name)
        for r in rows:
            inc.add(r)
        out[name] = inc
    return out


def committed_history(rows_by_incarnation: Dict[str, Iterable[dict]], final: str, steps: int,
                      workers: int) -> History:
    """The committed history of steps [0, steps) ending with incarnation ``final``."""
    incs = incarnations(rows_by_incarnation)
    problems: List[str] = []
    segments: List[Tuple[str, int, int]] = []
    if final not in incs or incs[final].start is None:
        return History([], {}, [f"the final incarnation {final} has no begin row"])
    end, cur = steps, incs[final]
    seen = set()
    while True:
        start = cur.start
        seen.add(cur.name)
        for s in range(start, end):
            d, wrong = cur.committed(s)
            if not d:
                problems.append(f"{cur.name} did not commit step {s}")
                break
            problems += wrong
            if len(d) > 1 and s == end - 1 and end == steps:
                problems.append(f"{cur.name}: ranks disagree on the final state (step {s})")
        segments.append((cur.name, start, end))
        if start == 0:
            break
        digests = cur.begins[start]
        if len(digests) != 1:
            problems.append(f"{cur.name}: ranks began step {start} from different states")
            break
        digest = next(iter(digests))
        # Who committed the state this incarnation began from? An earlier incarnation (never
        # one already in the chain) that committed step start-1 with that digest.
        source = [i for i in incs.values() if i.name not in seen
                  and digest in i.committed(start - 1)[0] and i.start is not None and i.start < start]
        if not source:
            problems.append(f"{cur.name} began at step {start} from a state no incarnation "
                            f"committed (digest {digest[:12]}): the chain is broken")
            break
        end, cur = start, source[0]
    segments.reverse()
    samples: Dict[Tuple[int, int], tuple] = {}
    for name, a, b in segments:
        inc = incs[name]
        for s in range(a, b):
            for k in range(workers):
                attempts = inc.micro.get((s, k))
                if not attempts:
                    problems.append(f"{name}: no trace of step {s}, worker {k}")
                    continue
                if len(attempts) > 1:
                    # The sampler is a pure function of (seed, epoch, step, worker): every
                    # attempt of a step (a redo after a failure) draws the same samples.
                    problems.append(f"{name}: attempts of step {s}, worker {k} drew different samples")
                samples[(s, k)] = next(iter(attempts))
    lost = sum(incs[name].lost_commits(a, b) for name, a, b in segments)
    return History(segments, samples, problems, lost)


def lost_and_repeated(history: History, steps: int, workers: int, dataset_size: int) -> Tuple[int, int]:
    """Samples of each complete epoch of the committed stream never trained (lost) and trained
    more than once (repeated); the stream is steps x workers in order."""
    stream = [i for s in range(steps) for k in range(workers)
              for i in history.samples.get((s, k), ())]
    lost = repeated = 0
    for e in range((len(stream) + dataset_size - 1) // dataset_size):
        chunk = stream[e * dataset_size:(e + 1) * dataset_size]
        counts = collections.Counter(chunk)
        repeated += sum(c - 1 for c in counts.values() if c > 1)
        if len(chunk) == dataset_size:
            lost += dataset_size - len(counts)
    return lost, repeated


def differs_from(history: History, reference: History) -> List[Tuple[int, int]]:
    """(step, worker) whose committed samples differ from the reference run's."""
    keys = set(history.samples) | set(reference.samples)
    return sorted(k for k in keys if history.samples.get(k) != reference.samples.get(k))
