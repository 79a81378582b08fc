"""The component-model front end: ``wasi:nn`` (0.2.0-rc-2024-10-28, -08-19 and -06-25) on a
``wasmtime.component.Linker``.

``imports.py`` (the four interfaces), ``versions.py`` (the versions served and how they differ),
``error_code.py`` (the one ErrorKind -> WIT error-code mapping), ``llm_mapping.py`` (which named
tensors carry the prompt, config and answer), ``tensors.py`` (the tensor resource),
``store_state.py`` (per-Store resource tables), ``hayride_streams.py`` and ``ready_pollable.py``
(Hayride's streaming interfaces), ``wasi-nn.wit`` and ``wasi-nn-VERSION.wit`` (the WIT of each
version).  Its host functions pass byte lists in one copy through :mod:`wasinn_host.guest.fast_calls`.
"""

from .error_code import ErrorCode, error_code_for
from .imports import WitNNImports

__all__ = ["ErrorCode", "WitNNImports", "error_code_for"]
