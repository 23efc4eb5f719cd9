"""README command 1 (examples/run_demo.sh) builds what the demo needs, not the C++ test suite
(issue 25: the demo used to wait for every C++ test to compile).

Two checks, neither of which compiles anything: what `malle_build_wheel package` asks
scikit-build-core for (tests/setup_env.sh, run against stand-ins for pip and auditwheel), and
what the target it names, malle_python_package, needs in the suite's own build (build/ci,
configured with the tests): ninja's command list for it holds no test, benchmark or example.
"""

from __future__ import annotations

import pathlib
import re
import stat
import subprocess

from pkg_env import ROOT, clean_env

BUILD = ROOT / "build" / "ci"


def _ninja_commands(target: str) -> list[str]:
    # Read-only: prints the commands that would build target, runs none.
    r = subprocess.run(["ninja", "-C", str(BUILD), "-t", "commands", target], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _outputs(commands: list[str]) -> set[str]:
    """The object files and programs the commands write (their -o arguments)."""
    return {m.group(1) for c in commands for m in re.finditer(r"\s-o\s+(\S+)", c)}


def test_the_demo_target_builds_the_wheel_and_no_test(tmp_path):
    assert (BUILD / "build.ninja").is_file(), "build/ci is made by tests/run_all.sh"
    everything = _outputs(_ninja_commands("all"))
    demo = _outputs(_ninja_commands("malle_python_package"))
    # The comparison means something only if the build holds the tests (tests/run_all.sh).
    assert any(o.startswith("tests/cpp/") for o in everything), \
        "build/ci was configured without the C++ tests; run tests/run_all.sh"
    # What the wheel holds is built ...
    for wanted in ("libmalle/tools/malle-alloc", "libmalle/tools/malle-agent",
                   "libmalle/tools/malle-allocator"):
        assert wanted in demo, (wanted, sorted(demo)[:50])
    assert any(re.search(r"python/_C\..*\.so$", o) for o in demo), sorted(demo)
    # ... and nothing of the C++ tests, benchmarks or examples.
    extra = sorted(o for o in demo if re.match(r"(tests|bench|examples)/", o)
                   or "gtest" in o or "gmock" in o)
    assert not extra, extra
    assert len(demo) < len(everything) / 2, (len(demo), len(everything))


def _stub(path: pathlib.Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_build_wheel_package_asks_for_that_target_without_the_tests(tmp_path):
    """malle_build_wheel "package" (what examples/run_demo.sh runs) with stand-ins for
    .venv's python and auditwheel that record their arguments and leave a wheel."""
    venv, root = tmp_path / "venv", tmp_path / "root"
    (venv / "bin").mkdir(parents=True)
    root.mkdir()
    _stub(venv / "bin" / "python", f"""printf '%s\\n' "$@" > {tmp_path}/pip-args
while (($#)); do if [[ $1 == -w ]]; then mkdir -p "$2"; touch "$2/malletrain-0-raw.whl"; fi; shift; done
""")
    _stub(venv / "bin" / "auditwheel", f"""printf '%s\\n' "$@" > {tmp_path}/auditwheel-args
while (($#)); do if [[ $1 == -w ]]; then touch "$2/malletrain-0-repaired.whl"; fi; shift; done
""")
    script = (f'source {ROOT}/tests/setup_env.sh && MALLE_ROOT={root} MALLE_VENV={venv} '
              f'MALLE_PY={venv}/bin/python MALLE_DIST_DIR={root}/dist && '
              f'malle_build_wheel "$1" && echo "wheel=$MALLE_WHEEL"')
    demo_script = (ROOT / "examples" / "run_demo.sh").read_text()
    (mode,) = re.findall(r"^malle_build_install (\w+)$", demo_script, re.M)
    r = subprocess.run(["bash", "-c", script, "bash", mode], capture_output=True, text=True,
                       timeout=60, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"wheel={root}/dist/malletrain-0-repaired.whl" in r.stdout
    args = (tmp_path / "pip-args").read_text().splitlines()
    assert "build.targets=malle_python_package" in args, args
    for option in ("MALLE_BUILD_TESTS", "MALLE_BUILD_BENCH", "MALLE_BUILD_EXAMPLES"):
        assert f"cmake.define.{option}=OFF" in args, (option, args)
    # tests/run_all.sh's build: everything, in the same build folder.
    r = subprocess.run(["bash", "-c", script, "bash", "all"], capture_output=True, text=True,
                       timeout=60, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    args = (tmp_path / "pip-args").read_text().splitlines()
    assert "build.targets=all" in args and "cmake.define.MALLE_BUILD_TESTS=ON" in args, args
    assert "build-dir=build/ci" in args, args
