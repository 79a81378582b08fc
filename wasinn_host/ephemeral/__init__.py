"""The ``wasi_ephemeral_nn`` front end (WasmEdge's GGML dialect) on a core-module Linker.

``imports.py`` (the 12 imports, reading and writing guest memory), ``handles.py`` (one Store's graph
and context handles, with its limits and allow-list), ``execution.py`` (an execution context's input
and output tensors by index), ``tensor_check.py`` (the ABI's checks of a guest's tensors) and
``errno.py`` (the one mapping from error kinds to errno values).  The gRPC server (:mod:`wasinn_host.rpc`)
serves this same ABI to remote clients and uses those four ABI modules, never the wasm binding.
"""
