"""WasmEdge's errno values, and the one function that turns an error kind into one.

This module is the only place in the package where errno numbers appear.
"""

from __future__ import annotations

import enum

from ..core.errors import ErrorKind


class Errno(enum.IntEnum):
    """Return codes of the ``wasi_ephemeral_nn`` imports (WasmEdge numbering)."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    INVALID_ENCODING = 2
    MISSING_MEMORY = 3
    BUSY = 4
    RUNTIME_ERROR = 5
    UNSUPPORTED_OPERATION = 6
    TOO_LARGE = 7
    NOT_FOUND = 8
    END_OF_SEQUENCE = 100
    CONTEXT_FULL = 101
    PROMPT_TOO_LONG = 102
    MODEL_NOT_FOUND = 103


_BY_KIND = {
    ErrorKind.INVALID_ARGUMENT: Errno.INVALID_ARGUMENT,
    ErrorKind.INVALID_ENCODING: Errno.INVALID_ENCODING,
    ErrorKind.MISSING_MEMORY: Errno.MISSING_MEMORY,
    ErrorKind.BUSY: Errno.BUSY,
    ErrorKind.RUNTIME_ERROR: Errno.RUNTIME_ERROR,
    ErrorKind.UNSUPPORTED: Errno.UNSUPPORTED_OPERATION,
    ErrorKind.TOO_LARGE: Errno.TOO_LARGE,
    ErrorKind.NOT_FOUND: Errno.NOT_FOUND,
    ErrorKind.END_OF_SEQUENCE: Errno.END_OF_SEQUENCE,
    ErrorKind.CONTEXT_FULL: Errno.CONTEXT_FULL,
    ErrorKind.PROMPT_TOO_LONG: Errno.PROMPT_TOO_LONG,
    ErrorKind.MODEL_NOT_FOUND: Errno.MODEL_NOT_FOUND,
    ErrorKind.SECURITY: Errno.INVALID_ARGUMENT,
    ErrorKind.TIMEOUT: Errno.RUNTIME_ERROR,
}
# errno -> the kind that maps back to it (a security refusal and a timeout read as their errno's own kind)
_BY_ERRNO: dict[int, ErrorKind] = {int(errno): kind for kind, errno in reversed(list(_BY_KIND.items()))}


def errno_for(kind: ErrorKind) -> Errno:
    """The errno a guest receives for ``kind`` (WasmEdge's numbering; the spec's table).

    Kinds WasmEdge has no number for: a security refusal is an invalid argument (the guest
    asked for something it may not have), a timeout a runtime error.
    """
    return _BY_KIND[kind]


def kind_for(errno: int) -> ErrorKind:
    """The error kind behind an errno received from elsewhere (an RPC server); unknown numbers
    are runtime errors.  ``errno_for(kind_for(n)) == n`` for every WasmEdge errno but 0."""
    return _BY_ERRNO.get(errno, ErrorKind.RUNTIME_ERROR)
