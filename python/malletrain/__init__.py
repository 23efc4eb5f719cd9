"""malletrain: elastic data-parallel training for PyTorch.

Jobs grow and shrink in place while they train. This release has the
foundation (logging, status handling) and the elastic process group of the C++
core; the Python training API is planned.
"""

from __future__ import annotations

import warnings

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

from malletrain import alloc, sim
from malletrain.errors import (
    MalleError,
    MalleTimeoutError,
    MalleValueError,
    MembershipChangedError,
    RankFailureError,
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
    "sim",
    "MalleError",
    "MalleTimeoutError",
    "MalleValueError",
    "MembershipChangedError",
    "RankFailureError",
    "StatusCode",
    "StoreError",
]
