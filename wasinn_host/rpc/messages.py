"""The protocol buffers and gRPC stubs, compiled at import from the ``.proto`` files shipped here.

``wasi_ephemeral_nn.proto`` is WasmEdge's protocol, unchanged; ``wasinn_host_rpc.proto`` is this
host's own service.  Compiling at import (``grpc.protos_and_services``, from grpcio-tools) keeps
the generated code in step with the installed protobuf runtime.
"""

from __future__ import annotations

from typing import Any

import grpc

_PROTOS = "wasinn_host/rpc/protos/"

nn: Any
nn_grpc: Any
host: Any
host_grpc: Any
nn, nn_grpc = grpc.protos_and_services(_PROTOS + "wasi_ephemeral_nn.proto")
host, host_grpc = grpc.protos_and_services(_PROTOS + "wasinn_host_rpc.proto")

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
