"""malletrain: elastic data-parallel training for PyTorch.

Jobs grow and shrink in place while they train::

    job = malletrain.init(logical_workers=4)
    model = job.wrap_model(model)
    optimizer = job.wrap_optimizer(optimizer)
    for x, y in job.loader(dataset, batch_size=16, epochs=3):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

See :mod:`malletrain.elastic` for the semantics, ``malletrain.alloc`` and
``malletrain.sim`` for the allocator and the simulator.
"""

from __future__ import annotations

import os
import warnings

# c10d's flight recorder is not safe with several process groups enqueueing at once (it
# fills a shared map before taking its lock), and malletrain builds a group per
# generation beside the old one: off unless the program sets a buffer size itself.
# Before torch, so that c10d reads it when it first needs it (libmalle/comm/gloo_backend.cc).
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "0")

# torch first: it loads libtorch*.so and registers its pybind11 types, which
# malletrain._C is linked against.
import torch

try:
    from malletrain import _C
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"malletrain's C++ extension failed to load ({e}). It must be compiled against the "
        f"installed torch {torch.__version__}: pip install --no-build-isolation ."
    ) from e

from malletrain import alloc, callbacks, sim
from malletrain.elastic import ElasticJob, init
from malletrain.sampler import ElasticSampler
from malletrain.errors import (
    MalleError,
    MalleTimeoutError,
    MalleValueError,
    MembershipChangedError,
    RankFailureError,
    SlurmCommandError,
    StatusCode,
    StoreError,
)

__version__: str = _C.version()

if _C.torch_version() != torch.__version__:
    warnings.warn(
        f"malletrain was compiled against torch {_C.torch_version()} but torch "
        f"{torch.__version__} is installed; rebuild it with pip install --no-build-isolation .",
        RuntimeWarning,
        stacklevel=2,
    )

__all__ = [
    "__version__",
    "alloc",
    "callbacks",
    "sim",
    "init",
    "ElasticJob",
    "ElasticSampler",
    "MalleError",
    "MalleTimeoutError",
    "MalleValueError",
    "MembershipChangedError",
    "RankFailureError",
    "SlurmCommandError",
    "StatusCode",
    "StoreError",
]
