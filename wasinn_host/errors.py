"""The WASI-NN errno values and the one exception type that carries them.

Every layer below the ABI raises :class:`WasiNNError`; the ABI layer (``abi.py``) is
the single place that turns it into the guest's return code and one log line.
"""

from __future__ import annotations

import enum


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


class WasiNNError(Exception):
    """A failure with the errno the guest receives and a message for the host log."""

    def __init__(self, errno: Errno, message: str) -> None:
        super().__init__(message)
        self.errno = errno
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} (errno {int(self.errno)} {self.errno.name})"


def invalid(message: str) -> WasiNNError:
    """Shorthand for the most common failure: errno 1, InvalidArgument."""
    return WasiNNError(Errno.INVALID_ARGUMENT, message)
