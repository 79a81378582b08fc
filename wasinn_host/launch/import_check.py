"""A module's imports checked before instantiation: one error naming every import the Linker lacks."""

from __future__ import annotations

import wasmtime

from ..sockets import SOCKET_FUNCTIONS
from .guest_load import GuestError


def check_imports(linker: wasmtime.Linker, store: wasmtime.Store, module: wasmtime.Module) -> None:
    """Raise one :class:`GuestError` naming every import ``linker`` cannot satisfy, not just the first;
    WasmEdge's socket extension is called by its name."""
    missing: list[str] = []
    sockets = False
    for imp in module.imports:
        name = imp.name or ""
        try:
            defined = linker.get(store, imp.module, name)
        except (wasmtime.WasmtimeError, KeyError, ValueError):
            missing.append(f"{imp.module}::{name}")
        else:
            if not _same_signature(defined, imp.type, store):
                missing.append(f"{imp.module}::{name} (defined with another signature)")
                sockets |= name.startswith("sock_")
            continue
        sockets |= imp.module == "wasi_snapshot_preview1" and name.startswith("sock_")
    if not missing:
        return
    message = f"{len(missing)} unresolved import{'s' if len(missing) > 1 else ''}: {', '.join(missing)}"
    if sockets:
        message += (
            "; the sock_* ones belong to WasmEdge's socket extension, of which wasinn provides "
            f"{', '.join(sorted(SOCKET_FUNCTIONS))} in WasmEdge's V1 and V2 signatures (README: Sockets); "
            "this guest asks for a function or signature beyond those"
        )
    raise GuestError(message)


def _same_signature(defined: object, wanted: object, store: wasmtime.Store) -> bool:
    """Whether a linker's function has the parameter and result types an import asks for."""
    if not isinstance(defined, wasmtime.Func) or not isinstance(wanted, wasmtime.FuncType):
        return True  # memories, tables, globals: wasmtime checks them at instantiation
    have = defined.type(store)
    return [str(t) for t in have.params] == [str(t) for t in wanted.params] and [str(t) for t in have.results] == [
        str(t) for t in wanted.results
    ]
