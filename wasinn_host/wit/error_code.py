"""The WIT ``error-code`` enum, and the one function that turns an error kind into one.

This module is the only place in the component front end where WIT error codes are chosen.
"""

from __future__ import annotations

import enum

from ..core.errors import ErrorKind


class ErrorCode(str, enum.Enum):
    """``wasi:nn/errors.error-code`` (0.2.0-rc-2024-10-28), by its WIT case name."""

    INVALID_ARGUMENT = "invalid-argument"
    INVALID_ENCODING = "invalid-encoding"
    TIMEOUT = "timeout"
    RUNTIME_ERROR = "runtime-error"
    UNSUPPORTED_OPERATION = "unsupported-operation"
    TOO_LARGE = "too-large"
    NOT_FOUND = "not-found"
    SECURITY = "security"
    UNKNOWN = "unknown"


_BY_KIND = {
    ErrorKind.INVALID_ARGUMENT: ErrorCode.INVALID_ARGUMENT,
    ErrorKind.INVALID_ENCODING: ErrorCode.INVALID_ENCODING,
    ErrorKind.MISSING_MEMORY: ErrorCode.RUNTIME_ERROR,
    ErrorKind.BUSY: ErrorCode.RUNTIME_ERROR,
    ErrorKind.RUNTIME_ERROR: ErrorCode.RUNTIME_ERROR,
    ErrorKind.UNSUPPORTED: ErrorCode.UNSUPPORTED_OPERATION,
    ErrorKind.TOO_LARGE: ErrorCode.TOO_LARGE,
    ErrorKind.NOT_FOUND: ErrorCode.NOT_FOUND,
    ErrorKind.END_OF_SEQUENCE: ErrorCode.RUNTIME_ERROR,
    ErrorKind.CONTEXT_FULL: ErrorCode.TOO_LARGE,
    ErrorKind.PROMPT_TOO_LONG: ErrorCode.TOO_LARGE,
    ErrorKind.MODEL_NOT_FOUND: ErrorCode.NOT_FOUND,
    ErrorKind.SECURITY: ErrorCode.SECURITY,
    ErrorKind.TIMEOUT: ErrorCode.TIMEOUT,
}


def error_code_for(kind: ErrorKind) -> ErrorCode:
    """The WIT error code a component receives for ``kind``.

    Kinds the WIT has no case for: busy (a limit on contexts, graphs or the queue), missing
    memory and end of sequence are runtime errors; a full context and a prompt longer than the
    context are too large; a missing model file is not found.  A host bug is ``unknown`` (see
    :mod:`wasinn_host.wit.imports`).
    """
    return _BY_KIND[kind]
