"""The component-model front end: ``wasi:nn@0.2.0-rc-2024-10-28`` on a ``wasmtime.component.Linker``.

``imports.py`` (the four interfaces), ``error_code.py`` (the one ErrorKind -> WIT error-code
mapping), ``llm_mapping.py`` (which named tensors carry the prompt, config and answer),
``tensors.py`` (the tensor resource), ``store_state.py`` (per-Store resource tables),
``fast_calls.py`` (host functions whose byte lists cross in one copy), ``wasi-nn.wit`` (the WIT).
"""

from .error_code import ErrorCode, error_code_for
from .imports import WitNNImports

__all__ = ["ErrorCode", "WitNNImports", "error_code_for"]
