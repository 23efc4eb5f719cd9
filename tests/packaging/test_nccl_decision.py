"""NCCL on by default where it can be built (issue 23): the decision of cmake/MalleNccl.cmake
on faked inputs (a CMake script-mode test: a CPU torch, no toolkit, a toolkit of another
CUDA major, no nccl.h, each request), and this checkout's build against what is installed."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from pkg_env import ROOT, clean_env

BUILD = ROOT / "build" / "ci"


def test_the_decision_on_faked_inputs():
    r = subprocess.run(["cmake", "-P", str(ROOT / "tests" / "packaging" / "nccl_decision_test.cmake")],
                       capture_output=True, text=True, timeout=60, env=clean_env())
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"nccl decision: (\d+) cases passed", out)
    assert m and int(m.group(1)) >= 17, out


def _cache(name: str) -> str:
    text = (BUILD / "CMakeCache.txt").read_text()
    m = re.search(rf"^{name}:\w+=(.*)$", text, re.M)
    assert m, f"{name} not in {BUILD}/CMakeCache.txt: configure it (tests/setup_env.sh)"
    return m.group(1)


def test_this_build_followed_what_is_installed():
    """build/ci (tests/setup_env.sh passes MALLE_WITH_NCCL=AUTO unless told otherwise) built
    NCCL exactly when a CUDA torch, a CUDA toolkit and nccl.h are here, and the installed
    wheel says the same."""
    import torch
    from malletrain import _build_info

    request = _cache("MALLE_WITH_NCCL").upper()
    if request != "AUTO":
        pytest.skip(f"build/ci was configured with MALLE_WITH_NCCL={request}, not AUTO")
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    nccl_h = pathlib.Path(torch.__file__).parent.parent / "nvidia" / "nccl" / "include" / "nccl.h"
    installed = bool(torch.version.cuda) and nvcc is not None and nccl_h.exists()
    assert _cache("MALLE_NCCL_ENABLED") == ("ON" if installed else "OFF"), (
        torch.version.cuda, nvcc, nccl_h)
    assert _build_info.with_nccl == installed
