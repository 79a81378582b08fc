"""Errors on the wire: a :class:`WasiNNError` becomes gRPC status ``UNKNOWN`` with an ``errno``
trailer (WasmEdge's convention), and back again on the client.

Following WasmEdge master's client: a failed call without a readable ``errno`` trailer (a
dead server, a refused connection, a message too large for gRPC) is a runtime error (5),
never a silent success.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from ..core.errors import ErrorKind, WasiNNError
from ..ephemeral.errno import errno_for, kind_for
from .messages import ERRNO_KEY


def abort_with(context: Any, err: WasiNNError) -> NoReturn:
    """End the call on the server with ``err``'s errno in the trailer and its message as details."""
    context.set_trailing_metadata(((ERRNO_KEY, str(int(errno_for(err.kind)))),))
    context.abort(grpc.StatusCode.UNKNOWN, err.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def errno_of(exc: grpc.RpcError) -> int | None:
    """The ``errno`` trailer of a failed call, or None when it is missing or not a number."""
    trailers: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == ERRNO_KEY:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def error_from(exc: grpc.RpcError, backend: str, method: str) -> WasiNNError:
    """The error a guest gets for a failed call of ``method`` to ``backend``."""
    code: Any = exc.code() if hasattr(exc, "code") else None
    details: Any = exc.details() if hasattr(exc, "details") else str(exc)
    errno = errno_of(exc)
    if errno is not None:
        return WasiNNError(kind_for(errno), str(details or f"{method} failed on {backend} (errno {errno})"))
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return WasiNNError(ErrorKind.UNSUPPORTED, f"the server at {backend} does not implement {method}")
    name = code.name if code is not None else "UNKNOWN"
    return WasiNNError(ErrorKind.RUNTIME_ERROR, f"{method} on {backend} failed: {name}: {details}")
