"""wasinn-host: WasmEdge-compatible WASI-NN (GGML / llama.cpp) for wasmtime-py guests.

Public API: :class:`WasiNN` (add the imports to a Linker, or run a module in one call),
:class:`Session`, :class:`ModelRegistry`, :class:`Limits`, :class:`Preload` /
:func:`parse_preload`, :class:`WasiNNError` with its :class:`ErrorKind`, and :class:`Errno`
(the guest's return codes).

Layout: ``core/`` (parameters, config, registry, engine, llama.cpp runtime, contexts),
``backend/`` (the protocol front ends talk to; local and fake implementations),
``ephemeral/`` (the ``wasi_ephemeral_nn`` front end), ``observability/`` (status, metrics,
logging) and ``testing/`` (test models and guests).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .core.errors import ErrorKind, WasiNNError
from .core.limits import Limits
from .core.preload import Preload, PreloadError, parse_preload
from .core.registry import ModelRegistry, default_registry
from .ephemeral.errno import Errno
from .host import GuestError, RunOptions, WasiNN
from .session import Session

__all__ = [
    "Errno",
    "ErrorKind",
    "GuestError",
    "Limits",
    "ModelRegistry",
    "Preload",
    "PreloadError",
    "RunOptions",
    "Session",
    "WasiNN",
    "WasiNNError",
    "__version__",
    "default_registry",
    "parse_preload",
]
