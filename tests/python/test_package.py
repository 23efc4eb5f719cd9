"""The installed malletrain package: versions, the torch version guard, error translation, log
level, CLI, the plots extra. (The wheel itself, in a new venv: tests/packaging.)"""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
import torch

import malletrain
from malletrain import _C, errors

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 120  # importing torch takes a few seconds on a loaded 2-core machine


def _pyproject() -> dict:
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "malletrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd="/",  # the installed package, not a source tree
    )


# --- versions -------------------------------------------------------------------------------------


def test_version_matches_pyproject_and_metadata():
    expected = _pyproject()["project"]["version"]
    assert malletrain.__version__ == expected
    assert _C.version() == expected  # CMake's project(VERSION) agrees with pyproject.toml
    assert importlib.metadata.version("malletrain") == expected


def test_extension_built_against_installed_torch():
    assert _C.torch_version() == torch.__version__


def test_torch_pin_is_installed():
    pins = [d for d in _pyproject()["project"]["dependencies"] if d.startswith("torch==")]
    assert len(pins) == 1, pins
    pinned = pins[0].removeprefix("torch==")
    assert torch.__version__.split("+")[0] == pinned


def test_extension_is_installed_not_from_source_tree():
    # _C only exists in the installed package; importing the source tree would fail.
    assert pathlib.Path(_C.__file__).parent == pathlib.Path(malletrain.__file__).parent
    assert (pathlib.Path(malletrain.__file__).parent / "_C.pyi").is_file()
    assert (pathlib.Path(malletrain.__file__).parent / "py.typed").is_file()


# --- error translation ----------------------------------------------------------------------------

C = errors.StatusCode
# The documented mapping (malletrain/errors.py docstring, docs/errors.md).
EXPECTED_CLASS = {
    C.CANCELLED: errors.MalleError,
    C.UNKNOWN: errors.MalleError,
    C.INVALID_ARGUMENT: errors.MalleValueError,
    C.DEADLINE_EXCEEDED: errors.MalleTimeoutError,
    C.NOT_FOUND: errors.MalleError,
    C.ALREADY_EXISTS: errors.MalleError,
    C.PERMISSION_DENIED: errors.MalleError,
    C.RESOURCE_EXHAUSTED: errors.MalleError,
    C.FAILED_PRECONDITION: errors.MembershipChangedError,
    C.ABORTED: errors.RankFailureError,
    C.OUT_OF_RANGE: errors.MalleValueError,
    C.UNIMPLEMENTED: errors.MalleError,
    C.INTERNAL: errors.MalleError,
    C.UNAVAILABLE: errors.RankFailureError,
    C.DATA_LOSS: errors.MalleError,
    C.UNAUTHENTICATED: errors.MalleError,
}


def test_status_code_enum_matches_abseil():
    assert {int(c): c.name for c in C} == _C._status_code_names()
    assert set(EXPECTED_CLASS) == set(C) - {C.OK}


@pytest.mark.parametrize("code", sorted(EXPECTED_CLASS), ids=lambda c: c.name)
def test_every_status_code_maps_to_documented_class(code):
    message = f"rank 3: {code.name.lower()} happened (äöü)"
    with pytest.raises(errors.MalleError) as info:
        _C._raise_status(int(code), message)
    assert type(info.value) is EXPECTED_CLASS[code]
    assert str(info.value) == message
    assert info.value.code is code
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize(
    ("code", "builtin"),
    [
        (C.INVALID_ARGUMENT, ValueError),
        (C.OUT_OF_RANGE, ValueError),
        (C.DEADLINE_EXCEEDED, TimeoutError),
    ],
)
def test_errors_are_builtin_exceptions_too(code, builtin):
    with pytest.raises(builtin, match="boom"):
        _C._raise_status(int(code), "boom")


def test_error_class_payload_selects_store_error():
    with pytest.raises(errors.StoreError, match="store at 127.0.0.1:1 unreachable") as info:
        _C._raise_status(int(C.UNAVAILABLE), "store at 127.0.0.1:1 unreachable", "StoreError")
    assert isinstance(info.value, ConnectionError)
    assert info.value.code is C.UNAVAILABLE


def test_unknown_error_class_payload_falls_back_to_code():
    with pytest.raises(errors.MalleTimeoutError):
        _C._raise_status(int(C.DEADLINE_EXCEEDED), "late", "NoSuchClass")


@pytest.mark.parametrize("code", [0, 17, -1])
def test_raise_status_rejects_invalid_code(code):
    with pytest.raises(errors.MalleValueError, match=r"code: got -?\d+"):
        _C._raise_status(code, "x")


def test_errors_exported_from_package():
    for name in errors.__all__:
        assert getattr(malletrain, name) is getattr(errors, name)


# --- log level ------------------------------------------------------------------------------------


@pytest.fixture
def restore_log_level():
    before = _C.get_log_level()
    yield
    _C.set_log_level(before)


@pytest.mark.parametrize("level", ["debug", "INFO", "Warning", "error"])
def test_set_log_level(level, restore_log_level):
    _C.set_log_level(level)
    assert _C.get_log_level() == level.lower()


@pytest.mark.parametrize("level", ["verbose", "", "info "])
def test_invalid_log_level_is_value_error(level, restore_log_level):
    before = _C.get_log_level()
    with pytest.raises(ValueError, match="log level") as info:
        _C.set_log_level(level)
    assert isinstance(info.value, errors.MalleValueError)
    assert _C.get_log_level() == before


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_version():
    result = _run_cli("version")
    assert result.returncode == 0, result.stderr
    assert f"malletrain {malletrain.__version__}" in result.stdout
    assert f"torch (built against) {_C.torch_version()}" in result.stdout
    assert f"torch (runtime) {torch.__version__}" in result.stdout


def test_cli_bad_flag_exits_2_with_message():
    result = _run_cli("version", "--no-such-flag")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr
    assert "usage: malletrain" in result.stderr


def test_cli_without_command_exits_2():
    result = _run_cli()
    assert result.returncode == 2
    assert "usage: malletrain" in result.stderr


def test_cli_version_flag_and_python_dash_m_print_what_version_prints():
    want = _run_cli("version")
    assert want.returncode == 0, want.stderr
    flag = _run_cli("--version")
    assert (flag.returncode, flag.stdout) == (0, want.stdout), flag.stderr
    dash_m = subprocess.run([sys.executable, "-m", "malletrain", "--version"], capture_output=True,
                            text=True, timeout=CLI_TIMEOUT_S, cwd="/")
    assert (dash_m.returncode, dash_m.stdout) == (0, want.stdout), dash_m.stderr
    assert dash_m.stdout.splitlines()[0] == f"malletrain {malletrain.__version__}"


# --- the torch version guard (and the build information it reads) -------------------------------


def test_build_info_agrees_with_the_extension():
    from malletrain import _build_info

    assert _build_info.version == _C.version() == malletrain.__version__
    assert _build_info.torch_version == _C.torch_version()
    assert isinstance(_build_info.with_nccl, bool)


def _import_with_torch(tmp_path, torch_init: str) -> subprocess.CompletedProcess:
    """Imports malletrain in a fresh interpreter whose `import torch` finds a stand-in first."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(torch_init)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
         "import malletrain"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd="/")


@pytest.mark.parametrize("other", ["2.10.0", "2.12.0+cpu", "3.0.0a0+git1234"])
def test_another_torch_release_is_refused_by_name_before_the_extension_loads(tmp_path, other):
    r = _import_with_torch(tmp_path, f"__version__ = {other!r}\n")
    assert r.returncode == 1
    supported = _C.torch_version().split("+")[0]
    assert r.stderr.strip().splitlines()[-1] == (
        f"ImportError: malletrain {malletrain.__version__} supports torch {supported} only (it is "
        f"compiled against torch's C++ internals), but torch {other} is installed. Install the "
        f"supported one (pip install torch=={supported}) or build malletrain against this torch "
        "(docs/install.md).")
    assert "_C" not in r.stderr and "undefined symbol" not in r.stderr


def test_missing_torch_names_the_one_to_install(tmp_path):
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; "
                        "import malletrain"], capture_output=True, text=True,
                       timeout=CLI_TIMEOUT_S, cwd="/")
    assert r.returncode == 1
    supported = _C.torch_version().split("+")[0]
    assert r.stderr.strip().splitlines()[-1] == (
        f"ImportError: malletrain {malletrain.__version__} needs torch {supported}, which is not "
        f"installed: pip install torch=={supported}")


# --- plots are an extra ---------------------------------------------------------------------------


def test_plots_extra_is_declared():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert extras["plots"] == ["matplotlib"]
    assert "matplotlib" not in " ".join(_pyproject()["project"]["dependencies"])


def test_simulate_out_without_matplotlib_says_what_to_install(monkeypatch, tmp_path, capsys):
    from malletrain import cli, sim

    monkeypatch.setattr(sim, "plots_available", lambda: False)
    trace = tmp_path / "trace.csv"
    trace.write_text("time,node,idle\n0,n0,1\n100,n0,0\n")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("name,submit_time,min_nodes,max_nodes,work_samples,rescale_up_s,"
                    "rescale_down_s,nodes,throughput\nj,0,1,1,100,1,1,0;1,0;10\n")
    assert cli.main(["simulate", "--trace", str(trace), "--jobs", str(jobs), "--out",
                     str(tmp_path / "out"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "malletrain simulate: --out: plots need matplotlib, which is not installed: "
        "pip install 'malletrain[plots]' (or pip install matplotlib)")
    assert not (tmp_path / "out").exists()  # refused before simulating, nothing half-written


def test_plot_functions_without_matplotlib_raise_a_clear_import_error(monkeypatch):
    from malletrain import sim

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'malletrain\[plots\]'"):
        sim._pyplot()
