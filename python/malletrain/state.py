"""Job state as a few large flat segments, for state sync to joiners and laggards.

Per-tensor messages are what make state transfer slow in other systems (one
round trip and one small send per tensor); copying the state into a send buffer
and out of a receive buffer is what makes it slow next (a 250 MB state is
250 MB of fresh pages to fault in on each side, 0.1-0.7 s on a VM). Here:

- the job keeps its state *in* flat buffers: :func:`flatten_module` makes a
  module's parameters and buffers views of one buffer per dtype and device
  (at ``wrap_model``), :func:`flatten_optimizer` does the same for the
  optimizer's state tensors (after its first step, and after every sync);
- :func:`pack` walks the state (nested dicts, lists, tuples, tensors and plain
  Python values), replaces every tensor by a :class:`TensorRef`, and sends each
  such buffer *as it is*, as one segment: no copy. Tensors that are not in a
  large shared buffer (scalars, a user's small extras, an optimizer state not
  flattened yet) are concatenated into one packed segment per dtype;
- a receiver that has nothing to lose (a joiner) receives each segment whose
  layout matches one of its own buffers straight into that buffer
  (:func:`in_place_targets`); the others into buffers it faulted in during its
  warm-up from the layout the leader published (:func:`landing_buffers`), else
  into fresh memory. :func:`unpack` rebuilds
  the structure with tensors that are views of the received segments.

The transfer is then a header, the pickled skeleton, and one message per
segment (two or three for a model and Adam), whatever the model.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["pack", "unpack", "read_skeleton", "in_place_targets", "flatten_module",
           "flatten_optimizer", "segments_of", "encode_layout", "decode_layout",
           "landing_buffers", "take_landing", "TensorRef", "Segment", "digest"]

# A tensor is sent from its own storage (no copy) when the span of that storage
# the state references is at least this large and mostly referenced; smaller
# ones are packed, so that no state needs more than a few messages.
DIRECT_MIN_BYTES = 1 << 20
_DIRECT_MAX_SLACK = 1.25

# Each tensor in a flat buffer starts on a 64-byte boundary (the CPU allocator's
# alignment of the buffer itself), so vectorised kernels over it (an optimizer's
# update, a gradient's scaling) never straddle cache lines at every load, as they
# would behind a 1-element tensor such as Adam's ``step``. The gaps are zeros.
_ALIGN_BYTES = 64


def _padded(numel: int, element_size: int) -> int:
    """``numel`` rounded up to the alignment: what a tensor takes in a flat buffer."""
    align = max(1, _ALIGN_BYTES // element_size)
    return -(-numel // align) * align


@dataclass(frozen=True)
class TensorRef:
    """Stands for a tensor inside the pickled skeleton."""

    segment: int    # index into the message's segments
    shape: Tuple[int, ...]
    offset: int     # elements into the segment
    numel: int
    requires_grad: bool = False


@dataclass(frozen=True)
class Segment:
    """One flat message of the state: ``numel`` elements of ``dtype`` on ``device_type``."""

    dtype: str          # e.g. "float32"
    numel: int
    device_type: str    # "cpu" or "cuda"; a receiver uses its current device of that type
    direct: bool        # sent from the source's own buffer (False: packed by copying)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"state: unknown dtype {name!r} in a state message")
    return d


def _walk(x: Any, fn: Any, path: Tuple[Any, ...] = ()) -> Any:
    """Rebuilds ``x`` with every leaf ``fn(leaf, path)``; containers are kept."""
    if isinstance(x, dict):
        return {k: _walk(v, fn, path + (k,)) for k, v in x.items()}
    if isinstance(x, list):
        return [_walk(v, fn, path + (i,)) for i, v in enumerate(x)]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_walk(v, fn, path + (i,)) for i, v in enumerate(x))
    return fn(x, path)


def _tensors(state: Any) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []

    def leaf(x: Any, path: Tuple[Any, ...]) -> Any:
        if isinstance(x, torch.Tensor):
            if x.is_sparse:
                raise ValueError(f"state: sparse tensor at {path} is not supported in job state")
            out.append(x)
        return x

    _walk(state, leaf)
    return out


def _storage_key(t: torch.Tensor) -> Tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def _plan(state: Any, direct_min_bytes: int) -> Tuple[Any, List[Segment], List[Any]]:
    """(skeleton, segments, sources): a source is a span tensor (direct) or a tensor list."""
    tensors = _tensors(state)
    by_storage: Dict[Tuple[str, int], List[torch.Tensor]] = {}
    for t in tensors:
        if t.numel() > 0:
            by_storage.setdefault(_storage_key(t), []).append(t)

    segments: List[Segment] = []
    sources: List[Any] = []
    direct_of: Dict[Tuple[str, int], Tuple[int, int]] = {}  # storage -> (segment, lo)
    for key, ts in by_storage.items():
        dtype = ts[0].dtype
        if any(t.dtype != dtype or not t.is_contiguous() for t in ts):
            continue
        lo = min(t.storage_offset() for t in ts)
        hi = max(t.storage_offset() + t.numel() for t in ts)
        used = sum(_padded(t.numel(), t.element_size()) for t in ts)  # a flat buffer's gaps
        if (hi - lo) * ts[0].element_size() < direct_min_bytes or hi - lo > _DIRECT_MAX_SLACK * used:
            continue
        span = ts[0].detach().as_strided((hi - lo,), (1,), lo)
        direct_of[key] = (len(segments), lo)
        segments.append(Segment(_dtype_name(dtype), hi - lo, ts[0].device.type, True))
        sources.append(span)

    packed: Dict[Tuple[str, str], int] = {}  # (dtype, device type) -> segment

    def leaf(x: Any, path: Tuple[Any, ...]) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        t = x.detach()
        key = _storage_key(t) if t.numel() > 0 else None
        if key in direct_of:
            seg, lo = direct_of[key]
            return TensorRef(seg, tuple(t.shape), t.storage_offset() - lo, t.numel(),
                             bool(x.requires_grad))
        pkey = (_dtype_name(t.dtype), t.device.type)
        if pkey not in packed:
            packed[pkey] = len(segments)
            segments.append(Segment(pkey[0], 0, pkey[1], False))
            sources.append([])
        seg = packed[pkey]
        off = segments[seg].numel
        segments[seg] = Segment(pkey[0], off + t.numel(), pkey[1], False)
        sources[seg].append(t.reshape(-1))
        return TensorRef(seg, tuple(t.shape), off, t.numel(), bool(x.requires_grad))

    skeleton = _walk(state, leaf)
    return skeleton, segments, sources


def pack(state: Any, *, direct_min_bytes: int = DIRECT_MIN_BYTES
         ) -> Tuple[bytes, List[torch.Tensor]]:
    """Returns (skeleton bytes, segments) for ``state``.

    A direct segment is a view of the source's own buffer (do not modify the
    state until it is sent); a packed one is a fresh concatenation.
    """
    skeleton, segments, sources = _plan(state, direct_min_bytes)
    tensors: List[torch.Tensor] = []
    for seg, src in zip(segments, sources):
        if seg.direct:
            tensors.append(src)
        elif len(src) == 1:
            tensors.append(src[0].clone())
        else:
            tensors.append(torch.cat(src))
    out = io.BytesIO()
    pickle.dump({"skeleton": skeleton, "segments": segments}, out,
                protocol=pickle.HIGHEST_PROTOCOL)
    return out.getvalue(), tensors


def segments_of(state: Any, *, direct_min_bytes: int = DIRECT_MIN_BYTES) -> List[Segment]:
    """The segments :func:`pack` would send for ``state``, without copying anything."""
    return _plan(state, direct_min_bytes)[1]


def encode_layout(segments: Sequence[Segment]) -> bytes:
    """A state's segment list as JSON, for the control store (see :func:`landing_buffers`)."""
    return json.dumps([[s.dtype, s.numel, s.device_type, s.direct] for s in segments]).encode()


def decode_layout(data: bytes) -> List[Segment]:
    """Inverse of :func:`encode_layout`; ValueError naming the problem if ``data`` is not one."""
    try:
        items = json.loads(data.decode())
        if not isinstance(items, list):
            raise ValueError(f"expected a list, got {type(items).__name__}")
        out = []
        for i, item in enumerate(items):
            if (not isinstance(item, list) or len(item) != 4 or not isinstance(item[0], str)
                    or type(item[1]) is not int or item[1] < 0 or item[2] not in ("cpu", "cuda")
                    or not isinstance(item[3], bool)):
                raise ValueError(f"segment {i}: expected [dtype, numel >= 0, 'cpu'|'cuda', "
                                 f"direct], got {item!r}")
            _dtype(item[0])
            out.append(Segment(item[0], item[1], item[2], item[3]))
        return out
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"state layout: {e}") from e


def landing_buffers(expected: Sequence[Segment], own: Sequence[Segment],
                    *, min_bytes: int = DIRECT_MIN_BYTES) -> List[torch.Tensor]:
    """Memory to receive a state into, faulted in now, while nobody waits.

    A joiner receives the segments that match its own buffers in place; the
    others (an optimizer's state, which a joiner that has not stepped does not
    have yet) would land in fresh memory, and faulting in fresh pages costs more
    than the transfer itself (measured on the 2-core VM: 168 MiB received in
    165-577 ms into fresh memory, 50-87 ms into memory already touched). So a
    joiner, during its warm-up, makes one zero-filled CPU buffer for each
    ``expected`` segment of at least ``min_bytes`` that its ``own`` direct
    segments (same dtype, length and device type, counted as a multiset) will
    not take. Receive into them with :func:`take_landing`.
    """
    spare: Dict[Tuple[str, int, str], int] = {}
    for s in own:
        if s.direct:
            k = (s.dtype, s.numel, s.device_type)
            spare[k] = spare.get(k, 0) + 1
    out: List[torch.Tensor] = []
    for s in expected:
        k = (s.dtype, s.numel, s.device_type)
        if spare.get(k, 0) > 0:
            spare[k] -= 1
            continue
        dtype = _dtype(s.dtype)
        if s.device_type != "cpu" or s.numel * dtype.itemsize < min_bytes:
            continue
        out.append(torch.zeros(s.numel, dtype=dtype))  # zero-filled: every page touched
    return out


def take_landing(landing: List[torch.Tensor], segment: Segment) -> Optional[torch.Tensor]:
    """Removes and returns a buffer of ``landing`` that fits ``segment`` exactly, or None."""
    if segment.device_type != "cpu":
        return None
    dtype = _dtype(segment.dtype)
    for i, b in enumerate(landing):
        if b.dtype == dtype and b.numel() == segment.numel:
            return landing.pop(i)
    return None


def read_skeleton(skeleton_bytes: bytes) -> Tuple[Any, List[Segment]]:
    """Decodes a skeleton: (skeleton, segments)."""
    try:
        msg = pickle.loads(skeleton_bytes)
        skeleton, segments = msg["skeleton"], list(msg["segments"])
        if not all(isinstance(s, Segment) and s.numel >= 0 for s in segments):
            raise ValueError("bad segment list")
    except Exception as e:  # noqa: BLE001 - any decoding failure is a corrupt message
        raise ValueError(f"state: corrupt state message ({type(e).__name__}: {e})") from e
    for s in segments:
        _dtype(s.dtype)
    return skeleton, segments


def _layout(skeleton: Any) -> Dict[int, List[Tuple[Tuple[Any, ...], Tuple[int, ...], int]]]:
    """segment -> [(path, shape, offset)] of the references into it, in walk order."""
    out: Dict[int, List[Tuple[Tuple[Any, ...], Tuple[int, ...], int]]] = {}

    def leaf(x: Any, path: Tuple[Any, ...]) -> Any:
        if isinstance(x, TensorRef):
            out.setdefault(x.segment, []).append((path, x.shape, x.offset))
        return x

    _walk(skeleton, leaf)
    return out


def in_place_targets(own_state: Any, skeleton: Any, segments: Sequence[Segment],
                     *, direct_min_bytes: int = DIRECT_MIN_BYTES
                     ) -> List[Optional[torch.Tensor]]:
    """For each incoming segment, this rank's own buffer to receive it into, or None.

    A segment qualifies when one of this rank's own direct segments holds
    tensors at exactly the same paths, shapes and offsets, of the same dtype and
    length: receiving into it then overwrites every tensor with its new value
    and nothing else. Only a rank whose state may be lost (it has none worth
    keeping, e.g. a joiner) should do this: a transfer cut halfway leaves the
    buffer half overwritten.
    """
    mine_skel, mine_segs, mine_srcs = _plan(own_state, direct_min_bytes)
    mine_layout = _layout(mine_skel)
    theirs_layout = _layout(skeleton)
    out: List[Optional[torch.Tensor]] = [None] * len(segments)
    used: set = set()
    for i, seg in enumerate(segments):
        for j, own in enumerate(mine_segs):
            if (j in used or not own.direct or own.dtype != seg.dtype or own.numel != seg.numel
                    or own.device_type != seg.device_type
                    or mine_layout.get(j) != theirs_layout.get(i)):
                continue
            out[i] = mine_srcs[j]
            used.add(j)
            break
    return out


def unpack(skeleton: Any, segments: Sequence[torch.Tensor]) -> Any:
    """Rebuilds the state; tensors are views of ``segments``."""

    def leaf(x: Any, path: Tuple[Any, ...]) -> Any:
        if not isinstance(x, TensorRef):
            return x
        if not 0 <= x.segment < len(segments):
            raise ValueError(f"state: tensor reference {x} names no received segment")
        buf = segments[x.segment]
        if x.offset < 0 or x.offset + x.numel > buf.numel():
            raise ValueError(f"state: tensor reference {x} outside the received buffers")
        return buf[x.offset:x.offset + x.numel].view(x.shape)

    return _walk(skeleton, leaf)


def _flat_views(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Copies of ``tensors`` that are views of one new buffer per (dtype, device)."""
    groups: Dict[Tuple[torch.dtype, torch.device], List[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    out: List[Optional[torch.Tensor]] = [None] * len(tensors)
    for (dtype, device), idx in groups.items():
        offsets = []
        end = 0
        for i in idx:
            offsets.append(end)
            end += _padded(tensors[i].numel(), tensors[i].element_size())
        flat = torch.zeros(end, dtype=dtype, device=device)
        for i, off in zip(idx, offsets):
            t = tensors[i]
            view = flat[off:off + t.numel()].view(t.shape)
            view.copy_(t.detach())
            out[i] = view
    return [t for t in out if t is not None]


def _is_flat(tensors: Sequence[torch.Tensor]) -> bool:
    """True when the tensors of each (dtype, device) are contiguous views of one storage."""
    seen: Dict[Tuple[torch.dtype, torch.device], int] = {}
    for t in tensors:
        if t.numel() == 0:
            continue
        if not t.is_contiguous():
            return False
        ptr = t.untyped_storage().data_ptr()
        if seen.setdefault((t.dtype, t.device), ptr) != ptr:
            return False
    return True


def flatten_module(module: torch.nn.Module) -> bool:
    """Makes ``module``'s parameters and buffers views of one buffer per dtype and device.

    The values, the Parameter objects (so optimizers and hooks holding them) and
    ``requires_grad`` are kept; only their storage moves. Returns False when
    they already were (nothing done). Shared parameters stay shared. Tensors
    that are not contiguous (e.g. channels_last weights) keep their own storage
    and layout: a state sync packs them.
    """
    tensors = [t for t in list(module.parameters()) + list(module.buffers()) if t.is_contiguous()]
    if _is_flat(tensors):
        return False
    views = _flat_views(tensors)
    with torch.no_grad():
        for t, v in zip(tensors, views):
            t.data = v
    return True


def flatten_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Makes the optimizer's state tensors views of one buffer per dtype and device.

    Optimizers update their state in place (``torch.optim`` does), so the state
    stays flat from then on; one that replaces a tensor only costs a copy at the
    next sync (:func:`pack` packs what is not flat). Returns False when the
    state already was flat or is empty.
    """
    entries = [(s, k) for s in optimizer.state.values() if isinstance(s, dict)
               for k, v in s.items() if isinstance(v, torch.Tensor) and not v.is_sparse
               and v.is_contiguous()]  # e.g. channels_last moments keep their layout
    tensors = [s[k] for s, k in entries]
    if not tensors or _is_flat(tensors):
        return False
    views = _flat_views(tensors)
    for (s, k), v in zip(entries, views):
        s[k] = v
    return True


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
