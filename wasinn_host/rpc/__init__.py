"""WASI-NN over gRPC: WasmEdge's protocol served by ``wasinn serve`` and spoken by a remote backend.

``server.py`` serves the registry and engine of this process to many clients (WasmEdge's
services plus this host's own ``wasinn_host.rpc.v1.Host``); ``client.py`` is a backend that
forwards every call to one or more servers, so a guest cannot tell a remote model from a
local one.
"""
