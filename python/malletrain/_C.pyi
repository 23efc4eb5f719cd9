"""Type stub of malletrain._C, the private C++ extension (python/src/bind_*.cc).

Use the public ``malletrain`` package instead; this module's API may change
between releases. Every function that fails raises a class of
``malletrain.errors`` (never a bare ``RuntimeError`` from C++).
"""

def version() -> str:
    """malletrain version this extension was built as (CMake's PROJECT_VERSION)."""

def torch_version() -> str:
    """``torch.__version__`` of the torch this extension was compiled against."""

def set_log_level(level: str) -> None:
    """Sets the threshold of libmalle's log, written to stderr.

    Args:
        level: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"`` (any case).

    Raises:
        malletrain.errors.MalleValueError: ``level`` is none of these.
    """

def get_log_level() -> str:
    """Current threshold of libmalle's log: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``."""

def _raise_status(code: int, message: str, error_class: str | None = None) -> None:
    """Test hook: throws a C++ StatusError with ``code`` and ``message``.

    The binding's translator turns it into ``malletrain.errors._from_status(code, message,
    error_class)``; ``error_class`` is sent as the status payload ``malletrain/error_class``.

    Raises:
        malletrain.errors.MalleError: always (the subclass depends on ``code``);
            ``MalleValueError`` if ``code`` is not in [1, 16].
    """

def _status_code_names() -> dict[int, str]:
    """Abseil's name of every status code, e.g. ``{4: "DEADLINE_EXCEEDED", ...}``."""

def alloc_solve(problem_json: str, options_json: str) -> str:
    """Decides an allocation (``malletrain.alloc.solve`` is the public API).

    Args:
        problem_json: a problem, JSON version 1 (``docs/allocator-json.md``).
        options_json: ``{"policy", "time_limit_s", "isolation", "relative_gap",
            "horizon_buckets"}``, every key optional; ``""`` means all defaults.

    Returns:
        The decision as compact JSON. Releases the GIL; blocks for up to the MILP
        time limit plus its kill grace.

    Raises:
        malletrain.errors.MalleValueError: invalid problem or options; the message
            starts with the JSON path of the field.
        malletrain.errors.MalleError: the allocator failed otherwise.
    """

def alloc_validate(problem_json: str) -> str:
    """Checks a problem; returns ``"ok: N jobs, M nodes, K pools"``. Releases the GIL.

    Raises:
        malletrain.errors.MalleValueError: the problem is invalid (JSON path first).
    """
