"""What every front end shares about a guest: per-Store tables reaped when idle (:mod:`.store_tables`),
guest memory (:mod:`.memory`), host functions through wasmtime's C API for core modules
(:mod:`.native_func`) and components (:mod:`.fast_calls`), files a guest names inside its preopened
directories (:mod:`.files`), where its ``stream-stdout`` pieces go (:mod:`.stdout`), the output
metadata JSON it reads (:mod:`.metadata`) and wasmtime's errors in one line (:mod:`.wasm_errors`).
"""
