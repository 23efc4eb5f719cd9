"""The exceptions malletrain raises.

libmalle reports recoverable failures as ``absl::Status``; the binding turns each
non-OK status into one of these classes (one translator, in ``bind_base.cc``,
which calls :func:`_from_status`). Every class carries the status code as
``exc.code`` (a :class:`StatusCode`) and the status message as ``str(exc)``.

=====================  =================================  ==========================
status code            class                              also an instance of
=====================  =================================  ==========================
INVALID_ARGUMENT,      :class:`MalleValueError`           ``ValueError``
OUT_OF_RANGE
DEADLINE_EXCEEDED      :class:`MalleTimeoutError`         ``TimeoutError``
UNAVAILABLE, ABORTED   :class:`RankFailureError`          (a peer died or hung)
FAILED_PRECONDITION    :class:`MembershipChangedError`    (the group moved on)
any other              :class:`MalleError`                ``RuntimeError``
=====================  =================================  ==========================

:class:`StoreError` (also a ``ConnectionError``) is chosen by the C++ side, not by
the code: a status whose payload ``malletrain/error_class`` is ``"StoreError"``
(the control store cannot be reached or answered garbage). Its code is usually
UNAVAILABLE, which alone would mean a failed rank.

All classes derive from :class:`MalleError`, itself a ``RuntimeError``, so
``except MalleError`` catches everything malletrain raises.
"""

from __future__ import annotations

import enum
from typing import Optional, Sequence

__all__ = [
    "StatusCode",
    "MalleError",
    "MalleValueError",
    "MalleTimeoutError",
    "RankFailureError",
    "MembershipChangedError",
    "StoreError",
    "SlurmCommandError",
]


class StatusCode(enum.IntEnum):
    """``absl::StatusCode`` (the gRPC codes); the values are fixed by Abseil."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class MalleError(RuntimeError):
    """Base class of every error malletrain raises.

    Attributes:
        code: the :class:`StatusCode` libmalle reported.
    """

    code: StatusCode = StatusCode.UNKNOWN


class MalleValueError(MalleError, ValueError):
    """An argument or a message was invalid or out of range."""

    code = StatusCode.INVALID_ARGUMENT


class MalleTimeoutError(MalleError, TimeoutError):
    """A wait (store, collective, rendezvous) ran past its deadline."""

    code = StatusCode.DEADLINE_EXCEEDED


class RankFailureError(MalleError):
    """A peer rank died, hung or left while this rank depended on it.

    The in-flight step is lost; the survivors can form the next generation.
    """

    code = StatusCode.UNAVAILABLE


class MembershipChangedError(MalleError):
    """The operation belongs to a generation that is no longer current."""

    code = StatusCode.FAILED_PRECONDITION


class StoreError(MalleError, ConnectionError):
    """The control store could not be reached or returned an invalid answer."""

    code = StatusCode.UNAVAILABLE


class SlurmCommandError(MalleError):
    """A Slurm command failed, timed out or is not installed (the message says which, with its
    output). ``command`` is the argv, ``returncode`` its exit status (None: it did not finish).
    Raised by :mod:`malletrain.slurm`, never by the C++ side."""

    def __init__(self, message: str, command: Sequence[str] = (),
                 returncode: Optional[int] = None) -> None:
        super().__init__(message)
        self.command = list(command)
        self.returncode = returncode


_CLASS_BY_CODE: dict[StatusCode, type[MalleError]] = {
    StatusCode.INVALID_ARGUMENT: MalleValueError,
    StatusCode.OUT_OF_RANGE: MalleValueError,
    StatusCode.DEADLINE_EXCEEDED: MalleTimeoutError,
    StatusCode.UNAVAILABLE: RankFailureError,
    StatusCode.ABORTED: RankFailureError,
    StatusCode.FAILED_PRECONDITION: MembershipChangedError,
}

_CLASS_BY_NAME: dict[str, type[MalleError]] = {
    cls.__name__: cls
    for cls in (
        MalleError,
        MalleValueError,
        MalleTimeoutError,
        RankFailureError,
        MembershipChangedError,
        StoreError,
    )
}


def _from_status(code: int, message: str, error_class: str | None = None) -> MalleError:
    """Builds the exception for a non-OK status (called by the C++ translator).

    ``error_class`` names a class of this module and overrides the code's class;
    an unknown name or code falls back to the code's class or :class:`MalleError`.
    """
    try:
        status = StatusCode(code)
    except ValueError:
        status = StatusCode.UNKNOWN
    cls = _CLASS_BY_NAME.get(error_class) if error_class else None
    if cls is None:
        cls = _CLASS_BY_CODE.get(status, MalleError)
    exc = cls(message)
    exc.code = status
    return exc
