"""The C++ library as a CMake package (issue 25): `cmake --install` of the suite's build into a
new prefix, then projects outside the tree that find_package(malle) and link malle::...:
examples/nas_search (built and run against a local cluster) and one that compiles every
installed header. The installed headers are the modules' MALLE_<MODULE>_PUBLIC_HDRS lists.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from pkg_env import ROOT, clean_env, pinned_torch, project_version

BUILD = ROOT / "build" / "ci"
BUILD_TIMEOUT_S = 900


def _cache(name: str) -> str:
    text = (BUILD / "CMakeCache.txt").read_text()
    m = re.search(rf"^{name}:\w+=(.*)$", text, re.M)
    assert m, f"{name} not in {BUILD}/CMakeCache.txt"
    return m.group(1)


def _run(*args, cwd=None, timeout=BUILD_TIMEOUT_S, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=clean_env(**env))


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> pathlib.Path:
    """`cmake --install build/ci --prefix <new dir>`: what a user of the C++ library installs."""
    assert (BUILD / "CMakeCache.txt").is_file(), "build/ci is made by tests/run_all.sh"
    p = tmp_path_factory.mktemp("malle-prefix")
    r = _run("cmake", "--install", BUILD, "--prefix", p)
    assert r.returncode == 0, r.stdout + r.stderr
    return p


def _configure_and_build(source: pathlib.Path, build: pathlib.Path, prefix: pathlib.Path,
                         basetemp: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    # ccache, as malletrain's own build uses it: compiling a consumer's file against LibTorch's
    # headers takes 25-50 s here. Paths under pytest's base folder (the prefix, the build, a
    # generated source) are hashed relative to it, so the next session's new folders hit.
    # The link, against the installed static libraries, is never cached.
    launcher, env = [], {}
    ccache = shutil.which("ccache")
    if ccache:
        launcher = [f"-DCMAKE_CXX_COMPILER_LAUNCHER={ccache}"]
        env = {"CCACHE_BASEDIR": str(basetemp)}
    r = _run("cmake", "-S", source, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             f"-DCMAKE_PREFIX_PATH={prefix}", *launcher, *extra)
    if r.returncode != 0:
        return r
    return _run("nice", "-n", "10", "cmake", "--build", build, "-j", "2", **env)


def _source_public_headers() -> set[str]:
    """Every header of libmalle outside internal/ and testing/ folders, as installed paths."""
    nccl = _cache("MALLE_NCCL_ENABLED").upper() in ("ON", "TRUE", "1")
    out = set()
    for h in (ROOT / "libmalle").rglob("*.h"):
        rel = h.relative_to(ROOT)
        if {"internal", "testing"} & set(rel.parts) or (h.name == "nccl_backend.h" and not nccl):
            continue
        out.add(str(rel))
    return out


def test_install_holds_the_cmake_package_and_only_it(prefix):
    cmake_dir = next(prefix.glob("lib*/cmake/malle"))
    assert {p.name for p in cmake_dir.iterdir()} >= {
        "malleConfig.cmake", "malleConfigVersion.cmake", "malleTargets.cmake", "malleTorch.cmake"}
    libs = {p.name for p in cmake_dir.parent.parent.glob("libmalle_*.a")}
    assert {"libmalle_base.a", "libmalle_alloc.a", "libmalle_control_service.a",
            "libmalle_elastic.a"} <= libs, libs
    # The wheel's files are not a C++ install's business.
    assert not (prefix / "malletrain").exists() and not (prefix / "bin").exists()
    assert f'PACKAGE_VERSION "{project_version()}"' in \
        (cmake_dir / "malleConfigVersion.cmake").read_text()


def test_installed_headers_are_the_public_lists_and_closed(prefix):
    installed = {str(p.relative_to(prefix / "include")) for p in (prefix / "include").rglob("*.h")}
    # Every header outside internal/ and testing/ is public: listed, hence installed ...
    assert installed == _source_public_headers(), (
        f"not installed: {sorted(_source_public_headers() - installed)}; installed but not "
        f"public: {sorted(installed - _source_public_headers())} (a module's "
        "MALLE_<MODULE>_PUBLIC_HDRS list and its headers disagree)")
    # ... and an installed header includes only installed headers.
    for h in installed:
        for inc in re.findall(r'^#include "(libmalle/[^"]+)"', (prefix / "include" / h).read_text(),
                              re.M):
            assert inc in installed, f"{h} includes {inc}, which is not installed"


def test_nas_search_builds_out_of_tree_and_runs_against_the_package(prefix, tmp_path,
                                                                   tmp_path_factory):
    build = tmp_path / "build"
    r = _configure_and_build(ROOT / "examples" / "nas_search", build, prefix,
                             tmp_path_factory.getbasetemp(),
                             f"-DPython_EXECUTABLE={sys.executable}")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    nas = build / "nas_search"
    # Linked against the installed static libraries: nothing from build/ci.
    assert str(BUILD) not in (build / "CMakeCache.txt").read_text()
    bad = _run(nas, "--store=nohost", timeout=60)
    assert bad.returncode == 2 and "--store must be HOST:PORT" in bad.stderr, bad.stderr

    from malletrain.cluster import LocalCluster

    script = ROOT / "examples" / "train_digits.py"
    with LocalCluster(["n0", "n1"], policy="dp", workdir=tmp_path / "cluster") as c:
        c.node_up("n0")
        c.node_up("n1")
        r = _run(nas, f"--store={c.address}", f"--secret={c.secret_path}",
                 f"--python={sys.executable}", f"--script={script}", "--widths=16,32",
                 "--steps=30", "--max_nodes=2", f"--out={tmp_path / 'nas'}", "--timeout=5m",
                 timeout=400)
        jobs = c.jobs()
    assert r.returncode == 0, r.stdout + r.stderr
    for w in (16, 32):
        assert jobs[f"nas-w{w}"]["phase"] == "succeeded", jobs
        assert f"nas-w{w} (width {w}): succeeded, test accuracy" in r.stdout, r.stdout
    assert re.search(r"^best: nas-w(16|32) \(test accuracy 0\.\d+\)$", r.stdout, re.M), r.stdout


def test_every_installed_header_compiles_in_a_consumer(prefix, tmp_path, tmp_path_factory):
    """One translation unit that includes every installed header, compiled with nothing but
    what find_package(malle) gives (include dirs, LibTorch's flags, defines), linked to every
    library target and run."""
    headers = sorted(str(p.relative_to(prefix / "include"))
                     for p in (prefix / "include").rglob("*.h"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "all_headers.cc").write_text(
        "".join(f'#include "{h}"\n' for h in headers) + "int main() { return 0; }\n")
    nccl = "malle::comm_nccl" if _cache("MALLE_NCCL_ENABLED").upper() in ("ON", "TRUE", "1") else ""
    (src / "CMakeLists.txt").write_text(f"""
cmake_minimum_required(VERSION 3.22)
project(all_headers LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(malle {project_version()} CONFIG REQUIRED)
add_executable(all_headers all_headers.cc)
target_link_libraries(all_headers PRIVATE malle::base malle::cluster malle::alloc malle::advisor
  malle::sim malle::control_wire malle::control_state malle::membership malle::comm
  malle::elastic malle::control_service {nccl})
""")
    r = _configure_and_build(src, tmp_path / "build", prefix, tmp_path_factory.getbasetemp(),
                             f"-DPython_EXECUTABLE={sys.executable}")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert _run(tmp_path / "build" / "all_headers", timeout=60).returncode == 0


def test_config_refuses_another_libtorch_by_name(prefix, tmp_path):
    # A LibTorch that says it is 2.10.0, found through Torch_DIR.
    fake = tmp_path / "torch-2.10" / "share" / "cmake" / "Torch"
    fake.mkdir(parents=True)
    (fake / "TorchConfig.cmake").write_text(
        f'set(TORCH_LIBRARY "{tmp_path}/torch-2.10/lib/libtorch.so")\n'
        f'set(TORCH_INCLUDE_DIRS "{tmp_path}/torch-2.10/include")\nset(Torch_FOUND TRUE)\n')
    (fake / "TorchConfigVersion.cmake").write_text(
        'set(PACKAGE_VERSION "2.10.0")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n')
    r = _run("cmake", "-S", ROOT / "examples" / "nas_search", "-B", tmp_path / "build",
             "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}", f"-DTorch_DIR={fake}")
    assert r.returncode != 0
    text = " ".join((r.stdout + r.stderr).split())
    torch = pinned_torch().removeprefix("torch==")
    assert (f"malle {project_version()} was built against LibTorch {torch} and uses its "
            f"internals (c10d). Found LibTorch 2.10.0 in {tmp_path}/torch-2.10/lib. Use "
            f"torch=={torch}, or rebuild malle against this one.") in text, text
