"""Exactly-once data order for elastic jobs.

The order in which samples are trained is a pure function of
``(seed, epoch, step, logical worker)``: nothing about it depends on how many
processes exist, so a resize or a failure can neither skip nor repeat a sample.

The samples form one stream: epoch ``e`` is a permutation of ``range(N)``
seeded by ``(seed, e)`` and the stream is epoch 0, then epoch 1, ... Step ``s``
takes the global batch ``stream[s*G : (s+1)*G]`` (``G = L * B`` for ``L``
logical workers of ``B`` samples each) and logical worker ``k`` gets the
``k``-th slice of ``B``. Every sample therefore appears exactly once per epoch;
a step may straddle two epochs (the global batch never shrinks, so every
logical worker always has ``B`` samples and the update is always the same
L-way average).
"""

from __future__ import annotations

import math
from typing import List

import torch

from malletrain.errors import MalleValueError

__all__ = ["ElasticSampler", "assign_workers", "mix_seed"]

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 over the parts); stable across runs."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h & ((1 << 63) - 1)


class ElasticSampler:
    """Which dataset indices logical worker ``k`` trains on at step ``s``.

    Args:
        num_samples: length of the (map-style) dataset, ``N``.
        logical_workers: ``L``, fixed for the whole job.
        batch_size: samples per logical worker per step, ``B``.
        seed: seeds every epoch's permutation.
        shuffle: False keeps the dataset order in every epoch.

    Raises:
        MalleValueError: if ``N < L * B`` (an epoch would be shorter than one
            global batch) or an argument is not positive.
    """

    def __init__(self, num_samples: int, logical_workers: int, batch_size: int, seed: int = 0,
                 shuffle: bool = True) -> None:
        for name, value in (("num_samples", num_samples), ("logical_workers", logical_workers),
                            ("batch_size", batch_size)):
            if not isinstance(value, int) or value <= 0:
                raise MalleValueError(f"{name}: must be a positive integer, got {value!r}")
        if num_samples < logical_workers * batch_size:
            raise MalleValueError(
                f"dataset: has {num_samples} samples, fewer than one global batch "
                f"(logical_workers {logical_workers} x batch_size {batch_size} = "
                f"{logical_workers * batch_size})")
        self.num_samples = num_samples
        self.logical_workers = logical_workers
        self.batch_size = batch_size
        self.seed = int(seed)
        self.shuffle = shuffle
        self._perms: dict = {}

    @property
    def global_batch(self) -> int:
        return self.logical_workers * self.batch_size

    @property
    def steps_per_epoch(self) -> float:
        """Steps per epoch; not an integer when ``N`` is not a multiple of ``G``."""
        return self.num_samples / self.global_batch

    def steps_for_epochs(self, epochs: float) -> int:
        """Whole steps that fit in ``epochs`` epochs (the tail of the last one is not used)."""
        return int(math.floor(epochs * self.num_samples / self.global_batch))

    def epoch_of(self, step: int) -> int:
        """The epoch of the first sample of ``step``."""
        return (step * self.global_batch) // self.num_samples

    def _perm(self, epoch: int) -> torch.Tensor:
        p = self._perms.get(epoch)
        if p is None:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(mix_seed(self.seed, epoch))
                p = torch.randperm(self.num_samples, generator=g)
            else:
                p = torch.arange(self.num_samples)
            if len(self._perms) >= 2:  # steps only move forward (or redo one): keep two
                self._perms.pop(min(self._perms))
            self._perms[epoch] = p
        return p

    def indices(self, step: int, worker: int) -> List[int]:
        """Dataset indices of logical worker ``worker`` at ``step`` (``B`` of them)."""
        if step < 0:
            raise MalleValueError(f"step: must be >= 0, got {step}")
        if not 0 <= worker < self.logical_workers:
            raise MalleValueError(
                f"worker: must be in [0, {self.logical_workers}), got {worker}")
        return self.stream(step * self.global_batch + worker * self.batch_size, self.batch_size)

    def stream(self, position: int, count: int) -> List[int]:
        """Dataset indices at stream positions ``[position, position + count)``."""
        if position < 0 or count < 0:
            raise MalleValueError(f"stream: position and count must be >= 0, got {position}, {count}")
        out: List[int] = []
        pos, end = position, position + count
        while pos < end:
            epoch, offset = divmod(pos, self.num_samples)
            take = min(end - pos, self.num_samples - offset)
            out.extend(self._perm(epoch)[offset:offset + take].tolist())
            pos += take
        return out

    def sample_epochs(self, step: int, worker: int) -> List[int]:
        """The epoch of each index :meth:`indices` returns (for exactly-once checks)."""
        start = step * self.global_batch + worker * self.batch_size
        return [(start + i) // self.num_samples for i in range(self.batch_size)]

    def state_dict(self) -> dict:
        return {"num_samples": self.num_samples, "logical_workers": self.logical_workers,
                "batch_size": self.batch_size, "seed": self.seed, "shuffle": self.shuffle}


def assign_workers(logical_workers: int, world_size: int, rank: int) -> range:
    """The logical workers rank ``rank`` of ``world_size`` runs: a contiguous block.

    The first ``L mod n`` ranks get one more than the others, so rank 0 always
    runs logical worker 0.
    """
    if world_size > logical_workers:
        raise MalleValueError(
            f"world size {world_size} exceeds logical_workers {logical_workers}: every rank "
            f"needs at least one logical worker")
    base, extra = divmod(logical_workers, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))

