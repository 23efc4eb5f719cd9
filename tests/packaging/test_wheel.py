"""The wheel a user installs (issue 25): self-contained, relative RPATHs, and working from a new
venv outside the source tree: import, the torch version guard, the CLI and its subcommands, a
two-rank elastic run with a kill -9, and the executables on PATH.

Every test uses the wheel the suite built (conftest.py: build/dist) and one venv made for it.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from pkg_env import ROOT, clean_env, pinned_torch, project_version

TORCH_RELEASE = pinned_torch().removeprefix("torch==")
# Libraries the wheel leaves to torch (tests/setup_env.sh: MALLE_WHEEL_EXCLUDES): the
# extension and the daemons load torch's own copies from site-packages/torch/lib (libcudart
# from torch's nvidia-cuda-runtime dependency).
TORCH_LIBS = re.compile(r"^(libtorch\w*\.so|libc10\w*\.so|libcudart\.so\.\d+)$")
EXECUTABLES = ("malle-alloc", "malle-allocator", "malle-agent")
HPO_MIX = ROOT.parent / "shared" / "data" / "jobs-hpo-shufflenet-10.csv"
SUMMIT = ROOT.parent / "shared" / "data" / "summit-idle-2021-02.csv.gz"


def _manylinux_glibc(tag: str) -> tuple[int, int]:
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag)
    assert m, f"not a manylinux_X_Y platform tag: {tag}"
    return int(m.group(1)), int(m.group(2))


def _elf_files(root: pathlib.Path) -> list[pathlib.Path]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def _platform_libs(wheel: pathlib.Path) -> set[str]:
    """The libraries the wheel's manylinux policy lets it take from the system (auditwheel's
    whitelist: glibc's, libstdc++, libgcc_s, ...)."""
    import auditwheel  # the build venv has it (pyproject.toml's wheel group)

    tag = wheel.name.removesuffix(".whl").split("-")[-1].split(".")[0]
    policies = json.loads((pathlib.Path(auditwheel.__file__).parent / "policy" /
                           "manylinux-policy.json").read_text())
    (policy,) = [p for p in policies if p["name"] == tag.removesuffix("_x86_64")]
    return set(policy["lib_whitelist"])


# --- the wheel file ----------------------------------------------------------------------------


def test_wheel_holds_the_package_the_executables_and_its_libraries(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.startswith(f"malletrain-{project_version()}-cp3")
    for exe in EXECUTABLES:
        assert f"malletrain/bin/{exe}" in names, exe
    assert any(re.fullmatch(r"malletrain/_C\.cpython-.*\.so", n) for n in names)
    assert "malletrain/_build_info.py" in names and "_malletrain_launcher.py" in names
    bundled = [n for n in names if n.startswith("malletrain.libs/")]
    # Abseil, CBC/CLP/CoinUtils/Osi, OpenSSL, libcurl (the etcd store); auditwheel renames them
    # (libabsl_status-<hash>.so.20220623), so match on the stem.
    for stem in ("libabsl_status", "libCbc", "libClp", "libCoinUtils", "libOsi", "libcrypto",
                 "libcurl"):
        assert any(pathlib.PurePath(n).name.startswith(stem + "-") for n in bundled), \
            (stem, bundled)
    # torch's libraries stay torch's: one copy in the process.
    assert not [n for n in bundled if re.search(r"/lib(torch|c10|cudart)", n)], bundled
    tag = wheel.name.removesuffix(".whl").split("-")[-1]
    for t in tag.split("."):
        assert _manylinux_glibc(t) <= (2, 36), tag  # Debian 12's glibc, at most


def test_auditwheel_finds_no_external_library_beyond_the_platform_and_torch(wheel):
    r = subprocess.run([str(pathlib.Path(sys.executable).parent / "auditwheel"), "show", "--json",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    external = set(info["external_libs"])
    assert all(TORCH_LIBS.match(lib) for lib in external), \
        f"unbundled libraries beyond torch's: {sorted(external)}"
    # The symbol versions the wheel needs (glibc, libstdc++) fit a manylinux policy no newer
    # than Debian 12's glibc.
    assert _manylinux_glibc(info["sym_tag"]) <= (2, 36), info["sym_tag"]


# --- the installed files -----------------------------------------------------------------------


def test_installed_native_files_have_relative_rpaths_and_resolve_in_the_venv(wheel, wheel_venv):
    site = wheel_venv.site_packages
    elves = _elf_files(site / "malletrain") + _elf_files(site / "malletrain.libs")
    assert len(elves) >= 4 + 20, elves  # _C, three executables, the bundled libraries
    platform = _platform_libs(wheel)
    for elf in elves:
        dyn = subprocess.run(["readelf", "-d", str(elf)], capture_output=True, text=True,
                             check=True).stdout
        for m in re.finditer(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn):
            for entry in m.group(1).split(":"):
                assert entry.startswith("$ORIGIN"), f"{elf.name}: absolute RPATH {entry}"
        ldd = subprocess.run(["ldd", str(elf)], capture_output=True, text=True,
                             env=clean_env()).stdout
        assert "not found" not in ldd, f"{elf}:\n{ldd}"
        for line in ldd.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if not m:
                continue  # linux-vdso, the dynamic loader
            soname, path = m.groups()
            resolved = pathlib.Path(path).resolve()
            inside = wheel_venv.root.resolve() in resolved.parents
            assert inside or soname in platform, \
                f"{elf.name} loads {soname} from {path}: neither in the venv nor the platform's"


def test_import_from_the_venv_with_nothing_of_the_source_tree(wheel_venv):
    code = ("import sys, malletrain, malletrain._C as C; print(malletrain.__file__); "
            "print(C.__file__); print(malletrain.__version__); print('\\n'.join(sys.path))")
    r = wheel_venv.run(wheel_venv.python, "-c", code, check=True)
    lines = r.stdout.splitlines()
    assert pathlib.Path(lines[0]).is_relative_to(wheel_venv.site_packages), lines[0]
    assert pathlib.Path(lines[1]).is_relative_to(wheel_venv.site_packages), lines[1]
    assert lines[2] == project_version()
    for entry in lines[3:]:
        assert not (entry and pathlib.Path(entry).resolve().is_relative_to(ROOT)), entry
    # The daemons' libraries too: nothing from build/ or the project's .venv.
    maps = wheel_venv.run(wheel_venv.python, "-c", "import malletrain; "
                          "print(open('/proc/self/maps').read())", check=True).stdout
    assert str(ROOT) not in maps


def test_version_flag_and_python_dash_m(wheel_venv):
    want = f"malletrain {project_version()}"
    for args in (["malletrain", "--version"], [wheel_venv.python, "-m", "malletrain", "--version"]):
        r = wheel_venv.run(*args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == want, r.stdout
        assert f"torch (runtime) {TORCH_RELEASE}" in r.stdout


def test_torch_version_guard_names_the_supported_version(wheel_venv):
    # Another torch: a stand-in package that says it is 2.10.0, found before the real one.
    fake = wheel_venv.workdir / "other-torch"
    (fake / "torch").mkdir(parents=True, exist_ok=True)
    (fake / "torch" / "__init__.py").write_text('__version__ = "2.10.0+cu128"\n')
    r = wheel_venv.run(wheel_venv.python, "-c",
                       f"import sys; sys.path.insert(0, {str(fake)!r}); import malletrain")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: malletrain {project_version()} supports torch "
                    f"{TORCH_RELEASE} only (it is compiled against torch's C++ internals), but "
                    "torch 2.10.0+cu128 is installed. Install the supported one (pip install "
                    f"torch=={TORCH_RELEASE}) or build malletrain against this torch "
                    "(docs/install.md)."), r.stderr
    assert "undefined symbol" not in r.stderr
    # No torch at all.
    r = wheel_venv.run(wheel_venv.python, "-c",
                       "import sys; sys.modules['torch'] = None; import malletrain")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"ImportError: malletrain {project_version()} needs torch {TORCH_RELEASE}, which is not "
        f"installed: pip install torch=={TORCH_RELEASE}"), r.stderr


def test_executables_are_on_path_and_start_without_python(wheel_venv):
    for exe in EXECUTABLES:
        assert shutil.which(exe, path=clean_env(wheel_venv.root)["PATH"]) == \
            str(wheel_venv.root / "bin" / exe)
    # The console script replaces itself with the C++ program (os.execv): no torch import.
    problem = ROOT / "examples" / "alloc" / "problem_small.json"
    r = wheel_venv.run("malle-alloc", "validate", problem)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok: 3 jobs, 8 nodes, 3 pools"
    for daemon in ("malle-agent", "malle-allocator"):
        r = wheel_venv.run(daemon, "--no_such_flag")
        assert r.returncode != 0
        assert "no_such_flag" in r.stderr, (daemon, r.stderr)


def test_alloc_solve_in_python_and_on_path_agree(wheel_venv):
    problem = wheel_venv.workdir / "problem.json"
    shutil.copy(ROOT / "examples" / "alloc" / "problem_small.json", problem)
    py = wheel_venv.run("malletrain", "alloc", "solve", problem, "--policy", "dp", "--compact",
                        check=True)
    cc = wheel_venv.run("malle-alloc", "solve", "--policy=dp", "--compact", problem, check=True)
    decision, from_path = json.loads(py.stdout), json.loads(cc.stdout)
    # The same decision (only the solve time, also in "reason", differs between two solves).
    for key in ("policy", "objective", "optimal", "jobs"):
        assert from_path[key] == decision[key], key
    # examples/alloc/README.md: densenet starts on the three free v100 nodes.
    nodes = {j["id"]: sorted(j["nodes"]) for j in decision["jobs"]}
    assert nodes == {"resnet18": ["a0", "a1"], "vgg16": ["b0", "b1"],
                     "densenet": ["a2", "a3", "a4"]}, decision
    r = wheel_venv.run("malletrain", "alloc", "solve", wheel_venv.workdir / "missing.json")
    assert r.returncode == 2 and "missing.json" in r.stderr


@pytest.mark.skipif(not HPO_MIX.is_file(), reason=f"{HPO_MIX.parent} (the project's data) absent")
def test_simulate_the_hpo_mix_and_plots_need_the_extra(wheel_venv):
    r = wheel_venv.run("malletrain", "simulate", "--trace", SUMMIT, "--jobs", HPO_MIX,
                       "--policy", "dp", "--skip-snapshots", "999", "--quiet", timeout=600)
    assert r.returncode == 0, r.stderr
    row = next(line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["dp"])
    assert "jobs: 10" in r.stderr and row, r.stdout
    # matplotlib is not installed here: --out says what to install instead of an ImportError.
    assert wheel_venv.run(wheel_venv.python, "-c", "import matplotlib").returncode == 1
    r = wheel_venv.run("malletrain", "simulate", "--trace", SUMMIT, "--jobs", HPO_MIX,
                       "--out", wheel_venv.workdir / "sim", "--quiet")
    assert r.returncode == 2
    assert r.stderr.strip() == ("malletrain simulate: --out: plots need matplotlib, which is not "
                                "installed: pip install 'malletrain[plots]' (or pip install "
                                "matplotlib)"), r.stderr
    assert "Traceback" not in r.stderr


def test_two_rank_local_run_survives_a_kill_9(wheel_venv):
    script = wheel_venv.workdir / "train_digits.py"
    shutil.copy(ROOT / "examples" / "train_digits.py", script)
    out = wheel_venv.workdir / "digits"
    r = wheel_venv.run("malletrain", "local", "--nodes", "2", "--schedule", "step=15 kill 1",
                       "--timeout", "400", "--", "python", script, "--steps", "40",
                       "--logical-workers", "2", "--out", out, timeout=450)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"kill", r.stdout + r.stderr), r.stdout[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 40, result
    assert 0.5 < result["accuracy"] <= 1.0, result
