"""Exactly-once data order for elastic jobs: the engine's sampler (``libmalle/elastic/sampler.h``).

The order in which samples are trained is a pure function of ``(seed, epoch, step, logical
worker)``: nothing about it depends on how many processes exist, so a resize or a failure can
neither skip nor repeat a sample. The samples form one stream: epoch ``e`` is a permutation of
``range(N)`` seeded by ``(seed, e)``, then epoch ``e + 1``, ... Step ``s`` takes the global
batch ``stream[s*G : (s+1)*G]`` (``G = L * B``) and logical worker ``k`` gets its ``k``-th slice
of ``B``. Every sample appears exactly once per epoch; a step may straddle two epochs.
"""

from __future__ import annotations

from typing import List

from malletrain import _C

__all__ = ["ElasticSampler", "assign_workers", "mix_seed"]

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 over the parts, taken modulo 2**64)."""
    return _C.mix_seed([((int(p) & _MASK64) ^ (1 << 63)) - (1 << 63) for p in parts])


def assign_workers(logical_workers: int, world_size: int, rank: int) -> List[int]:
    """The logical workers rank ``rank`` of ``world_size`` runs: a contiguous block, the
    first ``L mod n`` ranks one more, so rank 0 always runs worker 0."""
    return _C.assign_workers(logical_workers, world_size, rank)


class ElasticSampler:
    """Which dataset indices logical worker ``k`` trains on at step ``s``.

    Raises :class:`~malletrain.errors.MalleValueError` if ``N < L * B`` or an argument is not
    positive.
    """

    def __init__(self, num_samples: int, logical_workers: int, batch_size: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        self._s = _C.ElasticSampler(num_samples, logical_workers, batch_size,
                                    int(seed) & _MASK64, shuffle)
        self.num_samples, self.logical_workers = num_samples, logical_workers
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.global_batch = logical_workers * batch_size

    def steps_for_epochs(self, epochs: float) -> int:
        """Whole steps that fit in ``epochs`` epochs: ``floor(epochs * N / (L * B))``."""
        return self._s.steps_for_epochs(float(epochs))

    def epoch_of(self, step: int) -> int:
        """The epoch of the first sample of ``step``."""
        return self._s.epoch_of(step)

    def indices(self, step: int, worker: int) -> List[int]:
        """Dataset indices of logical worker ``worker`` at ``step`` (``B`` of them)."""
        return self._s.indices(step, worker)

    def stream(self, position: int, count: int) -> List[int]:
        """Dataset indices at stream positions ``[position, position + count)``."""
        return self._s.stream(position, count)

    def sample_epochs(self, step: int, worker: int) -> List[int]:
        """The epoch of each index :meth:`indices` returns."""
        return self._s.sample_epochs(step, worker)
