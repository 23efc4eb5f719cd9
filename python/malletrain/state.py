"""Job state in a few large flat buffers, for state sync to joiners and laggards.

Per-tensor messages are what make state transfer slow in other systems (one
round trip and one small send per tensor). Here the source rank walks the job
state (a nested structure of dicts, lists, tuples, tensors and plain Python
values), replaces every tensor by a reference, and concatenates the tensors of
each dtype into one flat buffer. The transfer is then three messages whatever
the model: a fixed-size header, the pickled skeleton, and one buffer per dtype
(broadcasts, or point-to-point sends to the ranks that need the state; see
ElasticJob._sync_state).

Receivers rebuild the structure with tensors that are views of the received
buffers; the caller copies them into place.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import torch

__all__ = ["pack", "unpack", "TensorRef", "digest"]


@dataclass(frozen=True)
class TensorRef:
    """Stands for a tensor inside the pickled skeleton."""

    dtype: str      # e.g. "float32"
    shape: Tuple[int, ...]
    offset: int     # elements into the flat buffer of `dtype`
    numel: int
    requires_grad: bool = False


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"state: unknown dtype {name!r} in a state message")
    return d


def pack(state: Any) -> Tuple[bytes, Dict[str, torch.Tensor]]:
    """Returns (skeleton bytes, {dtype name: flat buffer}) for ``state``.

    Tensors must be dense and on one device (the buffers are on that device;
    CPU when there are none).
    """
    groups: Dict[str, List[torch.Tensor]] = {}
    sizes: Dict[str, int] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.is_sparse:
                raise ValueError("state: sparse tensors are not supported in job state")
            name = _dtype_name(x.dtype)
            off = sizes.get(name, 0)
            t = x.detach()
            groups.setdefault(name, []).append(t.reshape(-1))
            sizes[name] = off + t.numel()
            return TensorRef(name, tuple(t.shape), off, t.numel(), bool(x.requires_grad))
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple(walk(v) for v in x)
        return x

    skeleton = walk(state)
    buffers = {name: (torch.cat(ts) if len(ts) > 1 else ts[0].clone())
               for name, ts in groups.items()}
    out = io.BytesIO()
    pickle.dump({"skeleton": skeleton, "sizes": sizes}, out, protocol=pickle.HIGHEST_PROTOCOL)
    return out.getvalue(), buffers


def read_sizes(skeleton_bytes: bytes) -> Tuple[Any, Dict[str, int]]:
    """Decodes a skeleton: (skeleton, {dtype name: buffer length})."""
    try:
        msg = pickle.loads(skeleton_bytes)
        return msg["skeleton"], dict(msg["sizes"])
    except Exception as e:  # noqa: BLE001 - any decoding failure is a corrupt message
        raise ValueError(f"state: corrupt state message ({type(e).__name__}: {e})") from e


def unpack(skeleton: Any, buffers: Dict[str, torch.Tensor]) -> Any:
    """Rebuilds the state; tensors are views of ``buffers``."""

    def walk(x: Any) -> Any:
        if isinstance(x, TensorRef):
            buf = buffers.get(x.dtype)
            if buf is None or x.offset + x.numel > buf.numel():
                raise ValueError(f"state: tensor reference {x} outside the received buffers")
            return buf[x.offset:x.offset + x.numel].view(x.shape)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple(walk(v) for v in x)
        return x

    return walk(skeleton)


def digest(state: Any) -> str:
    """SHA-256 of a state's tensors (bytes, shapes, dtypes) and plain values, in order."""
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{_dtype_name(t.dtype)}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            for k in x:
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(repr(x).encode())

    walk(state)
    return h.hexdigest()
