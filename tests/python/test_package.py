"""The installed malletrain package: versions, error translation, log level, CLI."""

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
