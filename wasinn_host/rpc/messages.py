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
