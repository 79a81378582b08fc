"""wasinn-host: WasmEdge-compatible WASI-NN (GGML / llama.cpp) for wasmtime-py guests.

Public API (``__all__``): :class:`WasiNN` (add the imports to a Linker, or run a module in one call)
with its :class:`RunOptions`, :class:`Session` (an execution context from Python), :class:`GuestStdout`,
:class:`ModelRegistry` / :func:`default_registry`, :class:`Preload` / :func:`parse_preload`,
:class:`Limits`, :class:`PromptCache`, :class:`SocketPolicy`, :class:`ClientOptions` (for ``rpc=``),
:class:`LocalBackend` and :func:`fake_backend`, and the errors: :class:`WasiNNError` with its
:class:`ErrorKind`, :class:`Errno` (the guest's return codes), :class:`GuestError`, :class:`PreloadError`.
Everything else is private by name or by package.  The test tooling is not re-exported here (the package
stands above no layer of it): the ``wasinn_run`` fixture's types ``RunGuest`` and ``GuestResult`` are
imported from :mod:`wasinn_host.testing.guest_harness`.

Layout, top layer first; a package imports only the packages below it (``tests/package/test_layers.py``):

1. ``cli/``: the ``wasinn`` command, one module per subcommand.
2. ``pytest_plugin.py`` and ``testing/``: the ``wasinn_run`` fixture, test models, the fuzzers
   (``testing/fuzz/``, which need ``hypothesis``).
3. ``host.py`` (:class:`WasiNN`: the front ends on a Linker, and running a guest) and ``session.py``.
4. ``launch/``: compiling guests, running them in Stores (N at once, deadlines, Ctrl-C).
5. The front ends, which never import each other: ``ephemeral/`` (``wasi_ephemeral_nn``), ``wit/``
   (``wasi:nn`` for components), ``rpc/`` (WASI-NN over gRPC, serving the ``wasi_ephemeral_nn`` ABI with
   ``ephemeral/``'s rules), ``sockets/`` (WasmEdge's socket extension).
6. ``guest/``: what the front ends share per Store (tables, guest memory, host functions, files, stdout).
7. ``backend/``: the protocol the front ends call, the local backend, the fake one.
8. ``llama/``: the llama.cpp backend.
9. ``core/``: backend-neutral parameters, config, limits, registry, scheduler, inference contexts.
10. ``observability/``: logging and metrics.

``models/`` (the embedded demo model) is a leaf anyone may import.
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

from .aio import AsyncSession
from .backend.fake import fake_backend
from .backend.local import LocalBackend
from .core.config.limits import Limits
from .core.config.preload import Preload, PreloadError, parse_preload
from .core.errors import ErrorKind, WasiNNError
from .core.prompt_cache.cache import PromptCache
from .core.registry import ModelRegistry, default_registry
from .ephemeral.errno import Errno
from .guest.stdout import GuestStdout
from .host import WasiNN
from .launch.guest_load import GuestError
from .launch.guest_run import RunOptions
from .session import Session
from .sockets.policy import SocketPolicy
from .sockets.shared import ListenerGroup

if TYPE_CHECKING:
    from .rpc.endpoint import ClientOptions

_LAZY = {"ClientOptions": "wasinn_host.rpc.endpoint"}
"""Names imported on first use: gRPC stays out of a plain ``import wasinn_host``."""
_MOVED = {"GuestResult": "wasinn_host.testing.guest_harness", "RunGuest": "wasinn_host.testing.guest_harness"}
"""Names the package once re-exported, and the module to import them from (named in the error)."""

__all__ = [
    "AsyncSession",
    "ClientOptions",
    "Errno",
    "ErrorKind",
    "GuestError",
    "GuestStdout",
    "Limits",
    "ListenerGroup",
    "LocalBackend",
    "ModelRegistry",
    "Preload",
    "PreloadError",
    "PromptCache",
    "RunOptions",
    "Session",
    "SocketPolicy",
    "WasiNN",
    "WasiNNError",
    "__version__",
    "default_registry",
    "fake_backend",
    "parse_preload",
]


def __getattr__(name: str) -> Any:
    """The names of :data:`_LAZY`, imported when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        moved = f"; import it from {_MOVED[name]}" if name in _MOVED else ""
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}{moved}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
