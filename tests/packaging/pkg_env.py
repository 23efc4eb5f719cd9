"""Helpers of the packaging tests (fixtures in conftest.py): the wheel the suite built, and a
new venv to install it into.

The wheel is the one tests/run_all.sh built and repaired (build/dist, $MALLE_WHEEL): the suite
does not compile twice. The venv is new, outside the source tree (pytest's temporary folder),
and gets only what a user would have: the wheel's dependencies (the pinned torch among
them, and scikit-learn for the digits data), then the wheel with plain `pip install` (no build isolation
flags, no build folder), which finds torch==2.11.0 satisfied and installs the wheel alone.
Commands run from a folder outside the repository, with no PYTHONPATH, so nothing of the
source tree or of build/ can be imported or loaded.

torch comes as the files pip installed for it in the interpreter running the tests (.venv),
hard-linked by their RECORD into the new venv (link_installed): the same bytes a
`pip install torch==2.11.0` gives, without the ~55 s of unpacking 5 GB and the ~45 s of
deleting them at the end. Not malletrain's files, nor matplotlib: only the closure of the
requirements asked for.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETUP_TIMEOUT_S = 600  # pip install of the wheel (its dependencies are there already)
COMMAND_TIMEOUT_S = 300


def project_dependencies() -> list[str]:
    """The runtime requirements of pyproject.toml (the pinned torch among them)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def pinned_torch() -> str:
    """The torch requirement of pyproject.toml, e.g. ``torch==2.11.0``."""
    (pin,) = [d for d in project_dependencies() if d.startswith("torch==")]
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



def _requirement_closure(names: list[str], site: pathlib.Path) -> dict:
    """The distributions installed in site that names need, with their dependencies (extras
    and environment markers followed as pip follows them)."""
    installed = {canonicalize_name(d.metadata["Name"]): d
                 for d in importlib.metadata.distributions(path=[str(site)])}
    todo = [Requirement(n) for n in names]
    seen, out = set(), {}
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = installed.get(key[0])
        assert dist is not None, f"{req} is needed but not installed in {site}"
        assert dist.version in req.specifier or not req.specifier, (req, dist.version)
        out[key[0]] = dist
        for dep in map(Requirement, dist.requires or []):
            envs = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if dep.marker is None or any(dep.marker.evaluate(env) for env in envs):
                todo.append(dep)
    return out


def link_installed(names: list[str], venv: Venv) -> int:
    """Hard-links into venv the files of the distributions names need, as installed in the
    running interpreter's site-packages (their RECORD; scripts in bin/ are left out: their
    shebang names the other interpreter). Copies where a link is impossible. Returns the
    number of files."""
    import sysconfig

    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    count = 0
    for dist in _requirement_closure(names, site).values():
        for rel in dist.files or []:
            src = (site / rel).resolve()
            if not src.is_relative_to(site.resolve()) or not src.is_file():
                continue  # bin/ scripts, or a RECORD entry for a file that is not there
            dst = venv.site_packages / src.relative_to(site.resolve())
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except FileExistsError:
                continue
            except OSError:
                shutil.copy2(src, dst)
            count += 1
    return count
