"""Compiling a guest: a core module or a component, told apart by its header, through the compile cache.

Every way a guest cannot be compiled (no such file, not WebAssembly, invalid) is a
:class:`GuestError` whose message is one line for the user.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import wasmtime
import wasmtime.component

from ..guest.wasm_errors import first_line
from .compile_cache import CompileCache, Compiled

ModuleSource = Union[str, os.PathLike, bytes, wasmtime.Module, wasmtime.component.Component]
"""A guest as callers name it: a path, its bytes, or an already compiled module or component."""
Guest = Compiled
"""A compiled guest: a core module or a component."""
COMPONENT_HEADER = b"\0asm\x0d\x00\x01\x00"
"""The first 8 bytes of a component (a core module's are ``\\0asm`` and version 1)."""


class GuestError(Exception):
    """The guest could not be started or trapped; the message is one line for the user."""


def load_guest(engine: wasmtime.Engine, cache: CompileCache | None, source: ModuleSource) -> Guest:
    """Compile a core module or a component (told apart by its header) from a path or bytes for
    ``engine``, through ``cache`` when there is one; a compiled one is passed through."""
    if isinstance(source, (wasmtime.Module, wasmtime.component.Component)):
        return source
    if isinstance(source, bytes):
        return _compile(engine, cache, source, "")
    path = Path(source)
    if not path.is_file():
        raise GuestError(f"module {str(path)!r} does not exist")
    data = path.read_bytes()
    if not data.startswith(b"\0asm"):
        raise GuestError(f"{str(path)!r} is not a WebAssembly module (no \\0asm header)")
    return _compile(engine, cache, data, f"{str(path)!r} ")


def _compile(engine: wasmtime.Engine, cache: CompileCache | None, data: bytes, label: str) -> Guest:
    component = data.startswith(COMPONENT_HEADER)
    kind = "component" if component else "module"
    try:
        if cache is not None:
            return cache.component(data) if component else cache.module(data)
        return wasmtime.component.Component(engine, data) if component else wasmtime.Module(engine, data)
    except wasmtime.WasmtimeError as exc:
        what = f"{label}is not a valid WebAssembly {kind}" if label else f"not a valid WebAssembly {kind}"
        raise GuestError(f"{what}: {first_line(exc)}") from None


def is_component_file(path: str) -> bool:
    """Whether ``path`` holds a component (by its header; False for anything unreadable)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(COMPONENT_HEADER)) == COMPONENT_HEADER
    except OSError:
        return False
