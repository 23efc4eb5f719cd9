"""tests/setup_env.sh's Python install (malle_setup_venv), run against a stand-in for .venv's
python that records what pip is asked for and passes everything else to the real interpreter.

A CI run once ran out of disk while pip unpacked torch's CUDA wheels (stop 37): pip's cache kept a
second copy of every wheel, and the failure said only "No space left on device". The install now
runs without the cache, and a failed install says how much room the disk had.
"""

from __future__ import annotations

import pathlib
import stat
import subprocess
import sys

from pkg_env import ROOT, clean_env


def _fake_venv(tmp_path: pathlib.Path, pip_rc: int) -> pathlib.Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"""#!/bin/bash
if [[ $1 == -m && $2 == pip ]]; then printf '%s\\n' "$@" > {tmp_path}/pip-args; exit {pip_rc}; fi
exec {sys.executable} "$@"
""")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return venv


def _setup_venv(venv: pathlib.Path) -> subprocess.CompletedProcess:
    script = (f'source {ROOT}/tests/setup_env.sh && MALLE_ROOT={ROOT} MALLE_VENV={venv} '
              f'MALLE_PY={venv}/bin/python && malle_setup_venv')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env=clean_env())


def test_pip_installs_the_pins_without_keeping_a_cache(tmp_path):
    venv = _fake_venv(tmp_path, pip_rc=0)
    r = _setup_venv(venv)
    assert r.returncode == 0, r.stdout + r.stderr
    args = (tmp_path / "pip-args").read_text().splitlines()
    assert args[:3] == ["-m", "pip", "install"], args
    assert "--no-cache-dir" in args, args
    assert any(a.startswith("torch==") for a in args), args


def test_a_failed_install_names_the_free_space(tmp_path):
    venv = _fake_venv(tmp_path, pip_rc=1)
    r = _setup_venv(venv)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "pip could not install the Python packages" in r.stderr, r.stderr
    assert f"free space on the disk of {venv}:" in r.stderr, r.stderr
