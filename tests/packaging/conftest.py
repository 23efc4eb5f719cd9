"""Fixtures of the packaging tests (pkg_env.py has the helpers and what they stand for)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from pkg_env import (ROOT, SETUP_TIMEOUT_S, Venv, clean_env, link_installed,
                     project_dependencies, project_version)


@pytest.fixture(scope="session")
def wheel() -> pathlib.Path:
    """The self-contained wheel of this build. Fails (does not skip) if there is none: the
    suite builds it first (tests/setup_env.sh, malle_build_install)."""
    env = os.environ.get("MALLE_WHEEL")
    if env:
        path = pathlib.Path(env)
        assert path.is_file(), f"MALLE_WHEEL={env} does not exist"
        return path
    found = sorted((ROOT / "build" / "dist").glob(f"malletrain-{project_version()}-*.whl"))
    assert len(found) == 1, (
        f"expected one wheel in {ROOT / 'build' / 'dist'}, found {found}: build it with "
        "`source tests/setup_env.sh && malle_build_install` (tests/run_all.sh does)")
    return found[0]


def _pip(python: pathlib.Path, *args: str, cwd: pathlib.Path) -> None:
    r = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                        *args], cwd=cwd, capture_output=True, text=True,
                       timeout=SETUP_TIMEOUT_S, env=clean_env())
    assert r.returncode == 0, f"pip install {args}: exit {r.returncode}\n{r.stdout[-3000:]}\n" \
                              f"{r.stderr[-3000:]}"


@pytest.fixture(scope="session")
def wheel_venv(wheel, tmp_path_factory):
    """A new venv holding the supported torch and the wheel, as a user would make it. Removed
    at the end of the session (torch's ~5 GB are hard links: removing them frees nothing of
    .venv's)."""
    base = tmp_path_factory.mktemp("wheel-venv")
    assert ROOT not in base.parents, base
    root, workdir = base / "venv", base / "work"
    workdir.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300,
                   env=clean_env())
    venv = Venv(root, workdir)
    # 1. The wheel's dependencies (the supported torch among them), the files pip installed
    # for them in this interpreter (pkg_env.link_installed); scikit-learn for the digits data.
    assert link_installed([*project_dependencies(), "scikit-learn"], venv) > 1000
    # 2. The wheel, plainly: pip must find torch satisfied and install nothing else (no
    # index: a dependency it would fetch fails here instead of being downloaded).
    _pip(venv.python, "--no-index", str(wheel), cwd=workdir)
    yield venv
    shutil.rmtree(base, ignore_errors=True)
