"""Guests run in-process for tests: what the ``wasinn_run`` pytest fixture does, usable without pytest.

:class:`GuestHarness` runs a core module or a component as ``wasinn run`` does (the same WASI setup,
deadline and trap handling, through :func:`wasinn_host.launch.runner.run_instances`), in this process:

1. the model name is turned into a file by :class:`~wasinn_host.testing.model_catalog.ModelFiles`;
2. one host (:class:`WasiNN`) per (preload name, file, limits) is made on first use and kept, all on
   one interruptible wasmtime Engine, so each model loads once and each guest compiles once;
3. the guest runs with its stdin, stdout and stderr in files, which are read back (the pieces of a
   ``stream-stdout`` compute are in its stdout, where the guest's output has them, as ``wasinn run`` prints);
4. the wasi-nn calls of its Store are counted (``calls``), by the name of the import: the
   ``wasi_ephemeral_nn`` functions for a core module, ``load-by-name``, ``init-execution-context``,
   ``compute`` ... for a component.

A trap or a timeout is a result, as on the command line: exit code 134 and ``wasinn run``'s error
line (``wasinn: error: ...``) at the end of stderr; a guest that cannot be loaded or linked, 2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence, Union

import wasmtime

from ..core.config.limits import Limits
from ..core.config.preload import Preload
from ..core.registry import ModelRegistry
from ..guest.store_tables import store_key
from ..host import WasiNN
from ..launch.guest_load import Guest, GuestError
from ..launch.guest_options import parse_dir, warn_missing_models
from ..launch.guest_run import RunOptions
from ..launch.runner import EXIT_USAGE, exit_status, run_instances
from .model_catalog import ModelFiles, ModelSpec

GuestSource = Union[str, "os.PathLike[str]", bytes]
"""A ``.wasm`` file (core module or component), or its bytes."""
DirSpec = Union[str, tuple[str, str]]
"""``PATH``, ``GUEST:HOST`` or ``HOST::GUEST`` as ``wasinn run --dir`` takes it, or (host, guest)."""
LIMIT_FIELDS = frozenset(f.name for f in dataclasses.fields(Limits))


@dataclass
class GuestResult:
    """How a guest run ended: exit code, its output, and its wasi-nn calls counted by name."""

    exit_code: int
    stdout: str
    stderr: str
    calls: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    """Wall-clock time of the run (compiling the guest and loading the model included)."""


class RunGuest(Protocol):
    """The ``wasinn_run`` fixture's type, for annotating tests: ``def test_x(wasinn_run: RunGuest)``."""

    def __call__(
        self,
        module: GuestSource,
        args: Sequence[str] = (),
        *,
        model: ModelSpec = "demo",
        name: str = "default",
        env: Mapping[str, str] | None = None,
        dirs: Sequence[DirSpec] = (),
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        **limits: int | bool,
    ) -> GuestResult:
        """Run ``module`` with ``args`` while ``name`` serves ``model``; see the module docstring."""


class CountingWasiNN(WasiNN):
    """A :class:`WasiNN` that keeps the wasi-nn call counts of the last Store it detached."""

    last_calls: Counter[str] = Counter()

    def detach(self, store: wasmtime.Store) -> None:
        """Read the Store's call counters, then free its state."""
        key = store_key(store)
        calls: Counter[str] = Counter()
        for state in (self.imports.stores.lookup(key), self.wit_imports.stores.lookup(key)):
            if state is not None:
                calls.update(state.calls)
        self.last_calls = calls
        super().detach(store)


def make_limits(values: Mapping[str, int | bool]) -> Limits:
    """:class:`Limits` from keyword values; TypeError naming the valid fields for an unknown one."""
    unknown = sorted(set(values) - LIMIT_FIELDS)
    if unknown:
        raise TypeError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: the limits are the fields of "
            f"wasinn_host.Limits ({', '.join(sorted(LIMIT_FIELDS))})"
        )
    return Limits(**values)  # type: ignore[arg-type]  # each field's own type, checked by the dataclass's users


class GuestHarness:
    """Runs guests in this process against named models; :meth:`close` frees the models."""

    def __init__(self, models: ModelFiles, work_dir: Path) -> None:
        self.models = models
        self.work_dir = work_dir
        config = wasmtime.Config()
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        self._registries: dict[tuple[str, Path], ModelRegistry] = {}
        self._hosts: dict[tuple[str, Path, Limits], CountingWasiNN] = {}
        self._compiled: dict[object, Guest] = {}
        self._lock = threading.Lock()
        self._runs = 0

    def run(
        self,
        module: GuestSource,
        args: Sequence[str] = (),
        *,
        model: ModelSpec = "demo",
        name: str = "default",
        env: Mapping[str, str] | None = None,
        dirs: Sequence[DirSpec] = (),
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        limits: Mapping[str, int | bool] | None = None,
    ) -> GuestResult:
        """Run ``module`` with ``args`` while ``name`` serves ``model``; see the module docstring."""
        host_dirs = [parse_dir(d) if isinstance(d, str) else (str(d[0]), str(d[1])) for d in dirs]
        path = self.models.path(model).resolve()
        with self._lock:
            nn = self._host(name, path, make_limits(limits or {}))
            self._runs += 1
            stem = self.work_dir / f"run{self._runs}"
            files = {part: stem.with_suffix(f".{part}") for part in ("stdin", "stdout", "stderr")}
            try:
                return self._run(nn, module, args, env, host_dirs, stdin, timeout, files)
            finally:
                for file in files.values():
                    file.unlink(missing_ok=True)

    def _run(
        self,
        nn: CountingWasiNN,
        module: GuestSource,
        args: Sequence[str],
        env: Mapping[str, str] | None,
        dirs: list[tuple[str, str]],
        stdin: str | bytes | None,
        timeout: float | None,
        files: dict[str, Path],
    ) -> GuestResult:
        started = time.perf_counter()
        try:
            guest = self._guest(nn, module)
        except GuestError as exc:
            return GuestResult(EXIT_USAGE, "", f"wasinn: error: {exc}\n", seconds=time.perf_counter() - started)
        if stdin is not None:
            files["stdin"].write_bytes(stdin.encode() if isinstance(stdin, str) else stdin)
        options = RunOptions(
            env=dict(env or {}),
            dirs=dirs,
            stdin=str(files["stdin"]) if stdin is not None else os.devnull,
            stdout=str(files["stdout"]),
            stderr=str(files["stderr"]),
            program_name=os.fspath(module) if not isinstance(module, bytes) else None,
        )
        nn.last_calls = Counter()
        (instance,) = run_instances(nn, guest, list(args), options, 1, timeout, timeout_name="--timeout")  # its line
        code, message = exit_status(instance)
        stdout, stderr = (_read_text(files[part]) for part in ("stdout", "stderr"))
        if message is not None:
            stderr += f"wasinn: error: {message}\n"
        return GuestResult(code, stdout, stderr, nn.last_calls, time.perf_counter() - started)

    def _host(self, name: str, path: Path, limits: Limits) -> CountingWasiNN:
        """The host serving ``path`` as ``name`` under ``limits`` (made once; models load once per file)."""
        nn = self._hosts.get((name, path, limits))
        if nn is None:
            registry = self._registries.get((name, path))
            if registry is None:
                preload = Preload(name, path)
                warn_missing_models([preload])
                registry = self._registries[(name, path)] = ModelRegistry([preload])
            nn = CountingWasiNN(registry=registry, limits=limits, engine=self.engine, interruptible=True)
            self._hosts[(name, path, limits)] = nn
        return nn

    def _guest(self, nn: WasiNN, module: GuestSource) -> Guest:
        """The compiled guest, compiled once per file version (or bytes) for the harness's Engine."""
        if isinstance(module, bytes):
            key: object = hashlib.sha256(module).digest()
        else:
            try:
                stat = os.stat(module)
                key = (os.path.realpath(module), stat.st_mtime_ns, stat.st_size)
            except OSError:
                return nn.load_guest(module)  # the GuestError wasinn run gives
        guest = self._compiled.get(key)
        if guest is None:
            guest = self._compiled[key] = nn.load_guest(module)
        return guest

    def close(self) -> None:
        """Free every model loaded for the runs."""
        with self._lock:
            for registry in self._registries.values():
                registry.close()
            self._registries.clear()
            self._hosts.clear()


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
