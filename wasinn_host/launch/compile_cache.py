"""Compiled modules and components cached on disk, so a guest compiles once per machine.

A cache entry is ``<cache dir>/<sha256 of the wasm>-<kind>-<wasmtime version>-<engine flags>.bin``
holding a SHA-256 of the serialized bytes followed by the bytes (``Module.serialize`` or
``Component.serialize``).  Loading checks that digest before ``deserialize`` (a truncated or
overwritten file is never handed to wasmtime) and wasmtime checks its own version and settings; an
entry failing either is deleted and the wasm compiled again.  Entries are written to a temporary
file and renamed, so concurrent ``wasinn run`` processes never read a half-written one.

The directory is ``$XDG_CACHE_HOME/wasinn`` or ``~/.cache/wasinn``; ``wasinn run --no-cache``
and ``WasiNN(compile_cache=False)`` turn caching off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable, TypeVar, Union

import wasmtime
import wasmtime.component

from ..core.cache_dir import default_cache_dir

log = logging.getLogger("wasinn_host")

Compiled = Union[wasmtime.Module, wasmtime.component.Component]
C = TypeVar("C", wasmtime.Module, wasmtime.component.Component)
DIGEST = 32


def wasmtime_version() -> str:
    """The wasmtime-py version (its compiled artifacts only load in the same version)."""
    try:
        from importlib.metadata import version

        return version("wasmtime")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        return "unknown"


class CompileCache:
    """Compile through the cache: :meth:`module` and :meth:`component`."""

    def __init__(self, engine: wasmtime.Engine, directory: Path | None = None, flags: str = "") -> None:
        self.engine = engine
        self.directory = directory or default_cache_dir()
        self.flags = flags
        """Engine settings that change the compiled code (epoch interruption): part of the key."""
        self.hits = 0
        self.misses = 0

    def path_for(self, wasm: bytes, kind: str) -> Path:
        """Where the compiled form of ``wasm`` lives."""
        digest = hashlib.sha256(wasm).hexdigest()
        return self.directory / f"{digest}-{kind}-{wasmtime_version()}-{self.flags or 'default'}.bin"

    def module(self, wasm: bytes) -> wasmtime.Module:
        """A compiled core module (from the cache when there)."""
        return self._get(wasm, "module", wasmtime.Module, wasmtime.Module.deserialize)

    def component(self, wasm: bytes) -> wasmtime.component.Component:
        """A compiled component (from the cache when there)."""
        return self._get(wasm, "component", wasmtime.component.Component, wasmtime.component.Component.deserialize)

    def _get(
        self,
        wasm: bytes,
        kind: str,
        compile_: Callable[[wasmtime.Engine, bytes], C],
        deserialize: Callable[[wasmtime.Engine, bytes], C],
    ) -> C:
        path = self.path_for(wasm, kind)
        cached = self._read(path)
        if cached is not None:
            try:
                compiled = deserialize(self.engine, cached)
                self.hits += 1
                return compiled
            except wasmtime.WasmtimeError as exc:
                log.info("compile cache: %s is stale (%s); compiling again", path.name, str(exc).splitlines()[0])
                _remove(path)
        compiled = compile_(self.engine, wasm)
        self.misses += 1
        self._write(path, bytes(compiled.serialize()))
        return compiled

    @staticmethod
    def _read(path: Path) -> bytes | None:
        """The serialized bytes of an entry whose digest matches, else None (a bad entry is removed)."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        payload = data[DIGEST:]
        if len(data) < DIGEST or hashlib.sha256(payload).digest() != data[:DIGEST]:
            log.info("compile cache: %s is corrupt; compiling again", path.name)
            _remove(path)
            return None
        return payload

    def _write(self, path: Path, payload: bytes) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # deserializing trusts these files
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out:
                out.write(hashlib.sha256(payload).digest())
                out.write(payload)
            os.replace(tmp, path)
        except OSError as exc:  # a read-only or full disk only costs the next start its compile
            log.info("compile cache: cannot write %s: %s", path, exc)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
