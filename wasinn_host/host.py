"""The embedding API: :class:`WasiNN` adds the imports to your Linker, or runs a module in one call.

>>> nn = WasiNN(preload=["default:GGML:AUTO:model.gguf"])
>>> exit_code = nn.run("guest.wasm", ["default", "Once upon a time"])

or, with your own wasmtime objects::

    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    nn.add_to_linker(linker)
    store = wasmtime.Store(engine)
    nn.attach(store)          # per-Store handle tables, freed with the Store
    ...

A Store's ``stream-stdout`` pieces go where its guest's stdout goes (``attach(stdout=...)``, see
:mod:`wasinn_host.guest_stdout`).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, Union

import wasmtime
import wasmtime.component

from .backend.local import LocalBackend
from .backend.protocol import Backend
from .compile_cache import CompileCache
from .core.errors import ErrorKind, WasiNNError
from .core.limits import Limits
from .core.preload import Preload
from .core.prompt_cache import PromptCache
from .core.registry import LoadedModel, ModelRegistry
from .ephemeral.imports import WasiNNImports
from .guest_stdout import GuestStdout, PieceSink, inherited_stdout, python_stdout
from .guest_stop import GuestStop
from .observability.metrics import serve_metrics
from .session import Session
from .sockets import SOCKET_FUNCTIONS, SocketLayer, SocketPolicy

if TYPE_CHECKING:  # imported when first used: a core module run needs neither gRPC nor the component front end
    from .rpc.endpoint import ClientOptions
    from .wit.imports import WitNNImports

log = logging.getLogger("wasinn_host")

ModuleSource = Union[str, os.PathLike, bytes, wasmtime.Module, wasmtime.component.Component]
Guest = Union[wasmtime.Module, wasmtime.component.Component]
COMPONENT_HEADER = b"\0asm\x0d\x00\x01\x00"
"""The first 8 bytes of a component (a core module's are ``\\0asm`` and version 1)."""
RUN_INTERFACE = "wasi:cli/run@0.2.0"
_COMPONENT_SESSION_KEYS = ("component_stores", "component_execution_contexts", "component_graphs", "component_tensors")
"""The component front end's status keys (all 0 before it is first used)."""


class GuestError(Exception):
    """The guest could not be started or trapped; the message is one line for the user."""


@dataclass
class RunOptions:
    """What ``wasinn run`` passes to a guest besides its arguments."""

    env: Mapping[str, str] = field(default_factory=dict)
    dirs: Sequence[tuple[str, str]] = ()
    """(host path, guest path) pairs to preopen."""
    stdin: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    """File paths for the guest's stdio; None inherits the host's.  The guest's ``stream-stdout`` pieces
    go to its stdout, in order with its own writes."""
    program_name: str | None = None
    stop: GuestStop | None = None
    """Traps the guest at its time limit or on an interrupt (needs ``WasiNN(interruptible=True)`` and
    something advancing the engine's epoch, as :func:`wasinn_host.runner.run_instances` does)."""
    close_fds: tuple[int, ...] = ()
    """Host file descriptors to close when the guest ends (pipe ends given as /dev/fd/N)."""


class WasiNN:
    """WASI-NN (``wasi_ephemeral_nn``, WasmEdge GGML dialect) for wasmtime-py.

    ``preload`` takes ``NAME:ENCODING:TARGET:PATH`` strings or :class:`Preload` records;
    the models load lazily, on a guest's first ``load_by_name``.  Instances share the
    process-wide registry unless given their own, so a model is in memory once however
    many Stores use it.  Every field of ``limits`` applies to this instance's guests.
    ``backend`` replaces the local registry and engine (for example with
    :func:`~wasinn_host.backend.fake.fake_backend` in tests); ``legacy_output`` lets a
    zero-length ``get_output`` buffer receive the whole output, as WasmEdge <= 0.16.3 did.
    ``rpc`` (one URI or several) serves the models from ``wasinn serve`` or WasmEdge's
    ``wasi_nn_rpcserver`` instead, with ``rpc_options`` (token, TLS roots, deadlines);
    guests and sessions behave the same.  ``sockets`` says where guests using WasmEdge's socket
    extension may listen and connect (default: listen on loopback only, no outbound connections).
    """

    def __init__(
        self,
        preload: Iterable[Preload | str] = (),
        *,
        registry: ModelRegistry | None = None,
        limits: Limits | None = None,
        allowed_models: Iterable[str] | None = None,
        engine: wasmtime.Engine | None = None,
        interruptible: bool = False,
        backend: LocalBackend | None = None,
        legacy_output: bool = False,
        rpc: str | Sequence[str] | None = None,
        rpc_options: ClientOptions | None = None,
        compile_cache: bool | str | os.PathLike[str] = False,
        sockets: SocketPolicy | None = None,
        prompt_cache: str | os.PathLike[str] | PromptCache | None = None,
    ) -> None:
        self.limits = limits or (backend.limits if backend is not None else Limits())
        self.local: LocalBackend | None = None
        self.backend: Backend
        if rpc is not None:
            from .rpc.client import RemoteBackend

            self.backend = RemoteBackend([rpc] if isinstance(rpc, str) else list(rpc), rpc_options)
            if preload:
                log.warning("--nn-preload is ignored with --nn-rpc-uri: the server's preloads are used")
            if prompt_cache is not None:
                log.warning("--nn-prompt-cache is ignored with --nn-rpc-uri: the server keeps its own")
        else:
            if backend is None:
                backend = LocalBackend(registry, self.limits, prompt_cache)
            else:
                if limits is not None:
                    backend.limits = limits
                if prompt_cache is not None:
                    backend.use_prompt_cache(prompt_cache)
            self.backend = self.local = backend
            for spec in preload:
                backend.registry.add_preload(spec)
        self._allowed = tuple(allowed_models) if allowed_models is not None else None
        self.imports = WasiNNImports(self.backend, self.limits, self._allowed, legacy_output)
        self._wit: WitNNImports | None = None
        self._wit_lock = threading.Lock()
        self._early_stores: weakref.WeakKeyDictionary[wasmtime.Store, tuple[Any, Any, PieceSink]] = (
            weakref.WeakKeyDictionary()
        )
        """Stores attached before the component front end was built: it attaches them when it is."""
        self.interruptible = interruptible
        if engine is None:
            config = wasmtime.Config()
            config.epoch_interruption = interruptible
            engine = wasmtime.Engine(config)
        self.engine = engine
        self.sockets = SocketLayer(engine, sockets)
        self._component_linker: wasmtime.component.Linker | None = None
        self._linker_lock = threading.Lock()
        self.compile_cache: CompileCache | None = None
        if compile_cache is not False:
            directory = None if compile_cache is True else Path(compile_cache)
            self.compile_cache = CompileCache(engine, directory, "epoch" if interruptible else "")

    def add_to_linker(self, linker: wasmtime.Linker) -> None:
        """Define the 12 ``wasi_ephemeral_nn`` imports on ``linker`` (usable with many Stores)."""
        self.imports.add_to_linker(linker)

    @property
    def wit_imports(self) -> WitNNImports:
        """The component front end (wasi:nn WIT and Hayride's interfaces), imported and built on first use."""
        with self._wit_lock:
            if self._wit is None:
                from .wit.imports import WitNNImports

                self._wit = WitNNImports(self.backend, self.limits, self._allowed, self.imports.contexts_alive)
                for store, (allowed, dirs, sink) in list(self._early_stores.items()):
                    self._wit.attach(store, allowed, dirs, sink)
                self._early_stores.clear()
            return self._wit

    def add_to_component_linker(self, linker: wasmtime.component.Linker) -> None:
        """Define ``wasi:nn@0.2.0-rc-2024-10-28`` (graph, tensor, inference, errors) and Hayride's streaming
        interfaces on a component linker (build a Linker once and use it for every Store: each call
        defines a few hundred host functions)."""
        self.wit_imports.add_to_linker(linker)

    def attach(
        self,
        store: wasmtime.Store,
        allowed_models: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink | None = None,
    ) -> None:
        """Give ``store`` its own handle and resource tables, for core modules and components (freed
        with the Store).

        ``allowed_models`` limits which preloaded names this Store may load; ``dirs`` are the (host,
        guest) directories preopened for it, the only places its ``image`` config key may name.
        ``stdout`` receives the Store's ``stream-stdout`` pieces: give the one that writes where the
        guest's WASI stdout goes (:class:`~wasinn_host.guest_stdout.GuestStdout`'s ``write``); the default
        writes to this process's file descriptor 1, where ``WasiConfig.inherit_stdout`` sends the guest's.
        It is called on the model's worker thread and must not block; a failure logs one line.
        """
        allowed = tuple(allowed_models) if allowed_models is not None else None
        sink = stdout or inherited_stdout
        self.imports.attach(store, allowed, dirs, sink)
        with self._wit_lock:
            if self._wit is None:
                self._early_stores[store] = (allowed, dirs, sink)
                wit = None
            else:
                wit = self._wit
        if wit is not None:
            wit.attach(store, allowed, dirs, sink)
        self.sockets.attach(store)

    def detach(self, store: wasmtime.Store) -> None:
        """Free ``store``'s graphs, execution contexts and tensors now."""
        self.imports.detach(store)
        with self._wit_lock:
            self._early_stores.pop(store, None)
        if self._wit is not None:
            self._wit.detach(store)
        self.sockets.detach(store)

    def session(
        self,
        name: str,
        config: Mapping[str, Any] | str | bytes | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = python_stdout,
    ) -> Session:
        """An execution context on a preloaded ``name`` for use from Python (see :class:`Session`);
        ``dirs`` (host directory, guest path) let its ``image`` key name files, as a guest's ``--dir``;
        ``stdout`` receives the pieces of a ``stream-stdout`` compute (default: ``sys.stdout``)."""
        return Session(self.backend, name, config, dirs, stdout)

    @property
    def registry(self) -> ModelRegistry:
        """The local model registry (UnsupportedOperation when the models are served over RPC)."""
        if self.local is None:
            raise WasiNNError(ErrorKind.UNSUPPORTED, "models are served over RPC: there is no local registry")
        return self.local.registry

    def swap_model(self, name: str, path: str | os.PathLike[str] | None = None) -> None:
        """Hot swap: new ``load_by_name(name)`` calls get the model at ``path`` (or the file re-read);
        contexts running on the old model finish there, and it is freed after its last one."""
        if self.local is None:
            raise WasiNNError(ErrorKind.UNSUPPORTED, "models served over RPC are swapped on the server (SIGHUP)")
        self.local.swap_model(name, path)

    def close(self) -> None:
        """Free the models (local) or close the connections (RPC; the servers free this session)."""
        self.backend.close()

    def status(self) -> dict[str, Any]:
        """Queue, memory, sessions, performance and model information (JSON-ready)."""
        status = self.backend.status()
        wit = self._wit.sessions_status() if self._wit is not None else dict.fromkeys(_COMPONENT_SESSION_KEYS, 0)
        status["sessions"] = {**self.imports.sessions_status(), **wit}
        return status

    get_backend_status = status

    def serve_metrics(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve Prometheus metrics on ``address:port`` (needs ``prometheus-client``)."""
        serve_metrics(self.status, port, address)

    def models(self) -> list[LoadedModel]:
        """The models loaded in this process."""
        return self.local.registry.loaded() if self.local is not None else []

    def load_module(self, source: ModuleSource) -> wasmtime.Module:
        """Compile a core module from a path or bytes (or pass a Module through)."""
        guest = self.load_guest(source)
        if not isinstance(guest, wasmtime.Module):
            raise GuestError("a component was given where a core module is needed")
        return guest

    def load_guest(self, source: ModuleSource) -> Guest:
        """Compile a core module or a component (told apart by its header) from a path or bytes,
        through the compile cache when it is on; a compiled one is passed through."""
        if isinstance(source, (wasmtime.Module, wasmtime.component.Component)):
            return source
        if isinstance(source, bytes):
            return self._compile(source, "")
        path = Path(source)
        if not path.is_file():
            raise GuestError(f"module {str(path)!r} does not exist")
        data = path.read_bytes()
        if not data.startswith(b"\0asm"):
            raise GuestError(f"{str(path)!r} is not a WebAssembly module (no \\0asm header)")
        return self._compile(data, f"{str(path)!r} ")

    def _compile(self, data: bytes, label: str) -> Guest:
        component = data.startswith(COMPONENT_HEADER)
        kind = "component" if component else "module"
        try:
            if self.compile_cache is not None:
                return self.compile_cache.component(data) if component else self.compile_cache.module(data)
            return wasmtime.component.Component(self.engine, data) if component else wasmtime.Module(self.engine, data)
        except wasmtime.WasmtimeError as exc:
            what = f"{label}is not a valid WebAssembly {kind}" if label else f"not a valid WebAssembly {kind}"
            raise GuestError(f"{what}: {_first_line(exc)}") from None

    def run(self, module: ModuleSource, args: Sequence[str] = (), options: RunOptions | None = None) -> int:
        """Instantiate ``module`` with WASI and WASI-NN, run ``_start``, return the exit code.

        Raises :class:`GuestError` if the module cannot be loaded or linked, or traps.
        """
        options = options or RunOptions()
        compiled = self.load_guest(module)
        try:
            stdout = GuestStdout(options.stdout)
        except OSError as exc:
            raise GuestError(f"cannot open the guest's stdout {options.stdout!r}: {exc.strerror or exc}") from None
        try:
            return self._run_in_store(compiled, module, args, options, stdout)
        finally:
            stdout.close()  # after the Store: everything the guest and its pieces wrote is in place

    def _run_in_store(
        self, compiled: Guest, module: ModuleSource, args: Sequence[str], options: RunOptions, stdout: GuestStdout
    ) -> int:
        store = wasmtime.Store(self.engine)
        stop_hook: tuple[Any, ...] = ()
        if self.interruptible:
            if options.stop is not None:
                stop_hook = options.stop.install(store)
            else:
                store.set_epoch_deadline(2**62)
        store.set_wasi(_wasi_config(module, args, options, stdout))
        self.attach(store, dirs=options.dirs, stdout=stdout.write)
        trap = None
        try:
            if isinstance(compiled, wasmtime.component.Component):
                return self._run_component(store, compiled)
            return self._run_module(store, compiled)
        except wasmtime.ExitTrap as exit_trap:
            return exit_trap.code
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            trap = _first_line(exc)
        finally:
            self.detach(store)
            store.close()  # now, not when a traceback lets go of it: the guest's files (pipes) close here
            del stop_hook
            for fd in options.close_fds:
                os.close(fd)
        raise GuestError(f"the guest trapped: {trap}")

    def _run_module(self, store: wasmtime.Store, module: wasmtime.Module) -> int:
        """Run a command module: WASI preview 1 and ``wasi_ephemeral_nn``, then ``_start``."""
        linker = wasmtime.Linker(self.engine)
        linker.define_wasi()
        self.add_to_linker(linker)
        self.sockets.link(linker, module)  # WasmEdge's sockets and wasi:logging, for modules importing them
        check_imports(linker, store, module)
        try:
            instance = linker.instantiate(store, module)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            raise GuestError(f"cannot instantiate the module: {_first_line(exc)}") from None
        start = instance.exports(store).get("_start")
        if not isinstance(start, wasmtime.Func):
            raise GuestError("the module has no _start function (is it a WASI command?)")
        start(store)
        return 0

    def _run_component(self, store: wasmtime.Store, component: wasmtime.component.Component) -> int:
        """Run a command component: wasi:cli (``add_wasip2``) and wasi:nn, then ``wasi:cli/run``."""
        with self._linker_lock:  # one Linker for every run: it holds no per-Store state
            if self._component_linker is None:
                self._component_linker = wasmtime.component.Linker(self.engine)
                self._component_linker.add_wasip2()
                self.add_to_component_linker(self._component_linker)
            linker = self._component_linker
        try:
            instance = linker.instantiate(store, component)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            raise GuestError(f"cannot instantiate the component: {_first_line(exc)}") from None
        interface = instance.get_export_index(store, RUN_INTERFACE)
        index = instance.get_export_index(store, "run", interface) if interface is not None else None
        run = instance.get_func(store, index) if index is not None else None
        if run is None:
            raise GuestError(f"the component does not export {RUN_INTERFACE} (is it a command?)")
        result = run(store)
        return 0 if result is None or getattr(result, "tag", "ok") == "ok" else 1

    def cancel_all(self) -> None:
        """Stop every inference in flight (the guests waiting in ``compute`` get a runtime error)."""
        for state in self.imports.states():
            for context in list(state.contexts.values()):
                context.cancel()
        if self._wit is not None:
            self._wit.cancel_all()
        self.sockets.cancel_all()


def _wasi_config(
    module: ModuleSource, args: Sequence[str], options: RunOptions, stdout: GuestStdout
) -> wasmtime.WasiConfig:
    wasi = wasmtime.WasiConfig()
    name = options.program_name or (str(module) if isinstance(module, (str, os.PathLike)) else "guest.wasm")
    wasi.argv = [name, *args]
    wasi.env = list(options.env.items())
    for host, guest in options.dirs:
        wasi.preopen_dir(host, guest)
    if options.stdin is None:
        wasi.inherit_stdin()
    else:
        wasi.stdin_file = options.stdin
    stdout.configure(wasi)
    if options.stderr is None:
        wasi.inherit_stderr()
    else:
        wasi.stderr_file = options.stderr
    return wasi


def _first_line(exc: BaseException) -> str:
    """The informative line of a wasmtime error: its cause, not the backtrace header."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if "Caused by:" in lines and lines.index("Caused by:") + 1 < len(lines):
        return lines[lines.index("Caused by:") + 1]
    for line in lines:
        if line.startswith("wasm trap:"):
            return line
    return lines[0] if lines else type(exc).__name__


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
