"""tests/setup_env.sh's Python install (malle_setup_venv), run against a stand-in for .venv's
python that records every pip call, answers pip's dry run with a report, and passes everything
else to the real interpreter.

A CI run once ran out of disk while pip unpacked torch's CUDA wheels (stop 37): one pip call
downloads every wheel before it unpacks any, pip's cache kept another copy, and the failure said
only "No space left on device". The install now runs without the cache, installs the large
wheels one pip call at a time, and a failed install says how much room the disk had.
"""

from __future__ import annotations

import json
import pathlib
import stat
import subprocess
import sys

from pkg_env import ROOT, clean_env

# What pip's --dry-run --report would list on a fresh venv (a part of it).
REPORT = {"version": "1", "install": [
    {"metadata": {"name": "torch", "version": "2.11.0"}},
    {"metadata": {"name": "nvidia-cudnn-cu13", "version": "9.19.0.56"}},
    {"metadata": {"name": "triton", "version": "3.6.0"}},
    {"metadata": {"name": "cuda-toolkit", "version": "13.0.2"}},
    {"metadata": {"name": "numpy", "version": "2.4.6"}},
    {"metadata": {"name": "pytest", "version": "9.2.0"}},
]}


def _fake_venv(tmp_path: pathlib.Path, final_rc: int) -> pathlib.Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (tmp_path / "report.json").write_text(json.dumps(REPORT))
    python = venv / "bin" / "python"
    # One line per pip call. The dry run copies the report where it is asked to; the call that
    # installs the requirements themselves (the last one) exits with final_rc.
    python.write_text(f"""#!/bin/bash
if [[ $1 == -m && $2 == pip ]]; then
  echo "$*" >> {tmp_path}/pip-calls
  args=("$@")
  for ((i = 0; i < $#; ++i)); do
    if [[ ${{args[i]}} == --report ]]; then cp {tmp_path}/report.json "${{args[i + 1]}}"; exit 0; fi
  done
  if [[ " $* " == *" --no-deps "* ]]; then exit 0; fi
  exit {final_rc}
fi
exec {sys.executable} "$@"
""")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return venv


def _setup_venv(venv: pathlib.Path) -> subprocess.CompletedProcess:
    script = (f'source {ROOT}/tests/setup_env.sh && MALLE_ROOT={ROOT} MALLE_VENV={venv} '
              f'MALLE_PY={venv}/bin/python && malle_setup_venv')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env=clean_env())


def test_large_wheels_one_call_each_then_the_pins_without_a_cache(tmp_path):
    venv = _fake_venv(tmp_path, final_rc=0)
    r = _setup_venv(venv)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = (tmp_path / "pip-calls").read_text().splitlines()
    assert all(c.startswith("-m pip install ") and " --no-cache-dir" in c for c in calls), calls
    assert "--dry-run" in calls[0], calls
    # The large ones from the report, each on its own and without its dependencies, in the
    # report's order; numpy and pytest wait for the last call.
    alone = [c.split()[-1] for c in calls[1:-1]]
    assert alone == ["torch==2.11.0", "nvidia-cudnn-cu13==9.19.0.56", "triton==3.6.0",
                     "cuda-toolkit==13.0.2"], calls
    assert all(" --no-deps " in c for c in calls[1:-1]), calls
    # The last call installs what pyproject.toml pins, with dependencies.
    assert " --no-deps " not in calls[-1] and " torch==" in calls[-1], calls


def test_a_failed_install_names_the_free_space(tmp_path):
    venv = _fake_venv(tmp_path, final_rc=1)
    r = _setup_venv(venv)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "pip could not install the Python packages" in r.stderr, r.stderr
    assert f"free space on the disk of {venv}:" in r.stderr, r.stderr
