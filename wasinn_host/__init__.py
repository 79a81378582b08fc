"""wasinn-host: WasmEdge-compatible WASI-NN (GGML / llama.cpp) for wasmtime-py guests.

Public API: :class:`WasiNN` (add the imports to a Linker, or run a module in one call),
:class:`ModelRegistry`, :class:`Preload` / :func:`parse_preload`, :class:`Errno` and
:class:`WasiNNError`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import Errno, WasiNNError
from .host import GuestError, RunOptions, WasiNN
from .limits import Limits
from .preload import Preload, PreloadError, parse_preload
from .registry import ModelRegistry, default_registry
from .session import Session

__all__ = [
    "Errno", "GuestError", "Limits", "ModelRegistry", "Preload", "PreloadError", "RunOptions", "Session", "WasiNN",
    "WasiNNError", "__version__", "default_registry", "parse_preload",
]
