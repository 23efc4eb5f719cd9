"""The console scripts ``malle-alloc``, ``malle-allocator`` and ``malle-agent``.

Each replaces itself (``os.execv``) with the executable of the same name that the wheel ships
in ``malletrain/bin/``. This module lives outside the ``malletrain`` package on purpose:
importing anything inside it runs ``malletrain/__init__.py``, which imports torch (seconds),
and these are C++ programs that do not need it. Not an API.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _exec(name: str) -> None:
    spec = importlib.util.find_spec("malletrain")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{name}: the malletrain package is not installed in {sys.prefix}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "bin", name)
    if not os.access(path, os.X_OK):
        sys.exit(f"{name}: {path} is missing or not executable; reinstall malletrain")
    os.execv(path, [path, *sys.argv[1:]])


def malle_alloc() -> None:
    _exec("malle-alloc")


def malle_allocator() -> None:
    _exec("malle-allocator")


def malle_agent() -> None:
    _exec("malle-agent")
