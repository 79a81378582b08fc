"""The ``wasi_ephemeral_nn`` front end (WasmEdge's GGML dialect): imports, guest memory, handle
tables, the metadata JSON and the one mapping from error kinds to errno values."""
