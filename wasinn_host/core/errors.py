"""The one exception type of the core, and the neutral kinds of failure it carries.

Nothing in the core knows how a front end reports a failure: code raises
:class:`WasiNNError` with an :class:`ErrorKind` and a one-line message, and each front end
(the ``wasi_ephemeral_nn`` imports, later gRPC and the component model) turns the kind into
its own code in exactly one function.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    """What went wrong, in words every front end can map to its own error codes."""

    INVALID_ARGUMENT = "invalid argument"
    INVALID_ENCODING = "invalid encoding"
    MISSING_MEMORY = "missing memory"
    BUSY = "busy"
    RUNTIME_ERROR = "runtime error"
    UNSUPPORTED = "unsupported operation"
    TOO_LARGE = "too large"
    NOT_FOUND = "not found"
    END_OF_SEQUENCE = "end of sequence"
    CONTEXT_FULL = "context full"
    PROMPT_TOO_LONG = "prompt too long"
    MODEL_NOT_FOUND = "model not found"
    SECURITY = "security"
    TIMEOUT = "timeout"


class WasiNNError(Exception):
    """A failure: its :class:`ErrorKind` and a one-line message for the log (and the user)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} ({self.kind.value})"


def invalid(message: str) -> WasiNNError:
    """Shorthand for the most common failure: an invalid argument."""
    return WasiNNError(ErrorKind.INVALID_ARGUMENT, message)
