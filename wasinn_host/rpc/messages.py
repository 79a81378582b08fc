"""The protocol buffers and gRPC stubs, compiled at import from the ``.proto`` files shipped here.

``wasi_ephemeral_nn.proto`` is WasmEdge's protocol, with the later ``output_max_size`` field of
``GetOutputRequest``; ``wasinn_host_rpc.proto`` is this host's own service.  Compiling at import
(``grpc.protos_and_services``, from grpcio-tools) keeps the generated code in step with the
installed protobuf runtime.  grpcio-tools finds a ``.proto`` through ``sys.path``, so the directory
holding the ``wasinn_host`` package is put there for the compilation: in an editable install it is
the source checkout, which is not on ``sys.path`` otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grpc

_PROTOS = "wasinn_host/rpc/protos/"
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def _compile(name: str) -> tuple[Any, Any]:
    """The messages and services of ``protos/NAME``, found through the package's own directory."""
    added = _PACKAGE_PARENT not in sys.path
    if added:
        sys.path.append(_PACKAGE_PARENT)
    try:
        return grpc.protos_and_services(_PROTOS + name)
    finally:
        if added:
            sys.path.remove(_PACKAGE_PARENT)


nn: Any
nn_grpc: Any
host: Any
host_grpc: Any
nn, nn_grpc = _compile("wasi_ephemeral_nn.proto")
host, host_grpc = _compile("wasinn_host_rpc.proto")

SESSION_KEY = "wasinn-session"
"""Call metadata naming the client session whose handles a call may use (none: the shared scope)."""
TOKEN_KEY = "authorization"
"""Call metadata carrying ``Bearer <token>`` when the server requires ``--nn-rpc-token``."""
ERRNO_KEY = "errno"
"""Trailing metadata with the decimal WASI-NN errno of a failed call (WasmEdge's convention)."""
U8 = 3
"""The tensor type a client sends for bytes: the guest's witx value, as WasmEdge's client does."""
MAX_MESSAGE = (1 << 31) - 1
"""gRPC's largest message; the server narrows it to its prompt, output and load limits."""
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
"""Keep-alive pings both ends send, so a dead peer is noticed within about 15 s."""
