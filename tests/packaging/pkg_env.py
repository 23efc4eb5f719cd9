"""Helpers of the packaging tests (fixtures in conftest.py): the wheel the suite built, and a
new venv to install it into.

The wheel is the one tests/run_all.sh built and repaired (build/dist, $MALLE_WHEEL): the suite
does not compile twice. The venv is new, outside the source tree (pytest's temporary folder),
and gets only what a user would install: the pinned torch from PyPI (or pip's cache), then the
wheel with plain `pip install` (no build isolation flags, no build folder). Commands run from
a folder outside the repository, with no PYTHONPATH, so nothing of the source tree or of
build/ can be imported or loaded.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETUP_TIMEOUT_S = 1200  # torch's CUDA wheel with its nvidia-* dependencies: a few minutes
COMMAND_TIMEOUT_S = 300


def pinned_torch() -> str:
    """The torch requirement of pyproject.toml, e.g. ``torch==2.11.0``."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("torch==")]
    return pin


def project_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def clean_env(venv: pathlib.Path | None = None, **extra: str) -> dict:
    """The environment of a user's shell: no PYTHONPATH, no active venv, no LD_LIBRARY_PATH;
    PATH starts with ``venv/bin`` if given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
                        "MALLE_BIN_DIR", "PYTHONSTARTUP")}
    path = "/usr/local/bin:/usr/bin:/bin"
    env["PATH"] = f"{venv / 'bin'}:{path}" if venv else path
    env.update(extra)
    return env


@dataclasses.dataclass
class Venv:
    root: pathlib.Path
    workdir: pathlib.Path  # outside the repository; commands run here

    @property
    def python(self) -> pathlib.Path:
        return self.root / "bin" / "python"

    @property
    def site_packages(self) -> pathlib.Path:
        v = sys.version_info
        return self.root / "lib" / f"python{v.major}.{v.minor}" / "site-packages"

    def run(self, *args, timeout: float = COMMAND_TIMEOUT_S, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        r = subprocess.run([str(a) for a in args], cwd=self.workdir, capture_output=True,
                           text=True, timeout=timeout, env=env or clean_env(self.root))
        if check:
            assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r

