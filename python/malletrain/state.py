"""Python parts of the job state: what only Python understands, as the engine carries it.

The job state (``libmalle/elastic/job_state.h``) holds the model's tensors and *parts* that one
language understands. A Python part is a ``state_dict()`` (an optimizer's, a tracked
object's) split in two: its tensors, which the engine sends, parks and snapshots in the job's
flat buffers with the model's (never pickled), and the pickled *skeleton*: the same nested
structure with every tensor replaced by its index in that list.

The tensors are the objects themselves (not copies): the engine moves them into flat buffers
in place, and a loaded state holds views of the received buffers.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, List, Tuple

import torch

from malletrain.errors import MalleValueError

__all__ = ["to_part", "from_part"]


class _Ref:
    """Stands for the ``index``-th tensor of a part inside its pickled skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> Tuple[Any, Tuple[int]]:
        return (_Ref, (self.index,))


def _walk(x: Any, fn: Callable[[Any], Any]) -> Any:
    """Rebuilds ``x`` with every leaf ``fn(leaf)``; dicts, lists and tuples are kept."""
    if isinstance(x, dict):
        return type(x)((k, _walk(v, fn)) for k, v in x.items()) if type(x) is not dict \
            else {k: _walk(v, fn) for k, v in x.items()}
    if isinstance(x, list):
        return [_walk(v, fn) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_walk(v, fn) for v in x)
    return fn(x)


def to_part(state: Any) -> Tuple[List[torch.Tensor], bytes]:
    """(tensors, pickled skeleton) of a ``state_dict()``."""
    tensors: List[torch.Tensor] = []

    def leaf(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if x.layout != torch.strided:
            raise MalleValueError(f"job state: a {x.layout} tensor cannot be part of it")
        tensors.append(x)
        return _Ref(len(tensors) - 1)

    skeleton = _walk(state, leaf)
    return tensors, pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)


def from_part(tensors: List[torch.Tensor], data: bytes) -> Any:
    """The ``state_dict()`` again; its tensors are ``tensors`` (views of received buffers)."""
    try:
        skeleton = pickle.loads(data)
    except Exception as e:  # noqa: BLE001 - any decoding failure is a corrupt state
        raise MalleValueError(f"job state: corrupt part ({type(e).__name__}: {e})") from e

    def leaf(x: Any) -> Any:
        if not isinstance(x, _Ref):
            return x
        if not 0 <= x.index < len(tensors):
            raise MalleValueError(f"job state: tensor {x.index} of a part that has {len(tensors)}")
        return tensors[x.index]

    return _walk(skeleton, leaf)
