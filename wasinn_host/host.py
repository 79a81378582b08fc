"""The embedding API: :class:`WasiNN` adds the front ends' imports to your Linker, or runs a module in
one call (through :mod:`wasinn_host.launch`).

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
:mod:`wasinn_host.guest.stdout`).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import wasmtime
import wasmtime.component

from .aio import DEFAULT_GUEST_THREADS, GuestPool, Output, SessionOpener, run_guest_async
from .backend.local import LocalBackend
from .backend.protocol import Backend
from .core.config.limits import Limits
from .core.config.preload import Preload
from .core.errors import ErrorKind, WasiNNError
from .core.prompt_cache.cache import PromptCache
from .core.registry import LoadedModel, ModelRegistry
from .ephemeral.imports import WasiNNImports
from .guest.stdout import PieceSink, inherited_stdout, python_stdout
from .guest.store_tables import store_key
from .launch.compile_cache import CompileCache
from .launch.guest_load import Guest, GuestError, ModuleSource, load_guest
from .launch.guest_run import RunOptions, run_guest
from .observability.metrics import serve_metrics
from .session import Session
from .sockets import ListenerGroup, SocketLayer, SocketPolicy

if TYPE_CHECKING:  # imported when first used: a core module run needs neither gRPC nor the component front end
    from .rpc.endpoint import ClientOptions
    from .wit.imports import WitNNImports

log = logging.getLogger("wasinn_host")

_COMPONENT_SESSION_KEYS = ("component_stores", "component_execution_contexts", "component_graphs", "component_tensors")
"""The component front end's status keys (all 0 before it is first used)."""


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
    ``guest_threads`` bounds how many guests :meth:`run_async` runs at once (the others wait their turn).
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
        guest_threads: int = DEFAULT_GUEST_THREADS,
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
        self._guest_pool = GuestPool(guest_threads)
        self._component_linker: wasmtime.component.Linker | None = None
        self._linker_lock = threading.Lock()
        self._module_linkers: weakref.WeakKeyDictionary[wasmtime.Module, wasmtime.Linker] = weakref.WeakKeyDictionary()
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
        """Define ``wasi:nn`` 0.2.0-rc-2024-10-28, -08-19 and -06-25 (graph, tensor, inference, errors) and
        Hayride's streaming interfaces on a component linker (build a Linker once and use it for every
        Store: each call defines a few hundred host functions)."""
        self.wit_imports.add_to_linker(linker)

    def attach(
        self,
        store: wasmtime.Store,
        allowed_models: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink | None = None,
        listeners: ListenerGroup | None = None,
    ) -> None:
        """Give ``store`` its own handle and resource tables, for core modules and components (freed
        with the Store).

        ``allowed_models`` limits which preloaded names this Store may load; ``dirs`` are the (host,
        guest) directories preopened for it, the only places its ``image`` config key may name.
        ``stdout`` receives the Store's ``stream-stdout`` pieces: give the one that writes where the
        guest's WASI stdout goes (:class:`~wasinn_host.guest.stdout.GuestStdout`'s ``write``); the default
        writes to this process's file descriptor 1, where ``WasiConfig.inherit_stdout`` sends the guest's.
        It is called on the model's worker thread and must not block; a failure logs one line.
        ``listeners`` (one :class:`~wasinn_host.sockets.shared.ListenerGroup` for several Stores running
        the same server guest) lets them listen on one address, as ``wasinn run --instances N`` does.
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
        self.sockets.attach(store, listeners)

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

    def session_async(
        self,
        name: str,
        config: Mapping[str, Any] | str | bytes | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = python_stdout,
    ) -> SessionOpener:
        """:meth:`session` for asyncio code: ``async with nn.session_async(name, config) as s`` (or ``s = await
        nn.session_async(...)``, then ``await s.close()``) gives an :class:`~wasinn_host.aio.AsyncSession`
        whose ``await s.complete(...)``, ``async for piece in s.stream(...)`` and ``await s.embed(...)``
        hold no thread while they wait; cancelling the awaiting task ends the sequence at the next step."""
        return SessionOpener(self, (name, config, dirs, stdout))

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
        self._guest_pool.close()
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
        return load_guest(self.engine, self.compile_cache, source)

    def run(self, module: ModuleSource, args: Sequence[str] = (), options: RunOptions | None = None) -> int:
        """Instantiate ``module`` with WASI and WASI-NN, run ``_start``, return the exit code.

        The guest runs in the calling thread, in Linux's ``SCHED_BATCH`` policy for the run if the thread
        was in the default one (its wake-ups do not preempt llama.cpp's threads; given back after:
        :mod:`wasinn_host.core.thread_policy`).  Raises :class:`GuestError` if the module cannot be loaded
        or linked, or traps.
        """
        return run_guest(self, self.load_guest(module), module, args, options or RunOptions())

    async def run_async(
        self,
        module: ModuleSource,
        args: Sequence[str] = (),
        options: RunOptions | None = None,
        *,
        stdout: Output = None,
        stderr: Output = None,
    ) -> int:
        """:meth:`run` for asyncio code: the guest runs on a pool of ``guest_threads`` threads and its exit
        code is returned (:class:`GuestError` as :meth:`run`).  ``stdout``/``stderr``: an async callback
        that receives the output a chunk at a time (a slow one makes the guest wait), a bytearray that
        collects it, or None (``options``' destination); its stdin is ``options.stdin`` or empty (never the
        host's).  Cancelling the awaiting task interrupts the
        guest (needs ``interruptible=True``): it traps, a compute it waits in ends at the next step, and
        the call returns once its contexts and sequences are freed."""
        return await run_guest_async(self, self._guest_pool, module, args, options, stdout, stderr)

    def module_linker(self, module: wasmtime.Module) -> wasmtime.Linker:
        """The Linker for ``module``: WASI preview 1, ``wasi_ephemeral_nn``, and WasmEdge's sockets and
        wasi:logging when the module imports them.  Made once per module and kept while the module lives
        (it holds no per-Store state), so each run of a module does not build its imports again."""
        with self._linker_lock:
            linker = self._module_linkers.get(module)
            if linker is None:
                linker = wasmtime.Linker(self.engine)
                linker.define_wasi()
                self.add_to_linker(linker)
                self.sockets.link(linker, module)
                self._module_linkers[module] = linker
            return linker

    def component_linker(self) -> wasmtime.component.Linker:
        """The one component Linker of this host (wasi:cli by ``add_wasip2``, and wasi:nn), made on first use:
        it holds no per-Store state."""
        with self._linker_lock:
            if self._component_linker is None:
                self._component_linker = wasmtime.component.Linker(self.engine)
                self._component_linker.add_wasip2()
                self.add_to_component_linker(self._component_linker)
            return self._component_linker

    def cancel_store(self, store: wasmtime.Store) -> None:
        """Stop the inference in flight of ``store``'s guest (a compute it waits in gets a runtime error)
        and end its socket waits: what an interrupted run does to its own Store only."""
        key = store_key(store)
        for table in (self.imports.stores, *((self._wit.stores,) if self._wit is not None else ())):
            state = table.lookup(key)
            if state is not None:
                for context in list(state.contexts.values()):
                    context.cancel()
        sockets = self.sockets.stores.lookup(key)
        if sockets is not None:
            sockets.cancel()

    def expect_guests(self, count: int) -> None:
        """Say that ``count`` guests will compute at once (``wasinn run --instances N`` does): a model
        loaded from then on starts with room for that many sequences (rounded up to a power of two,
        within the KV budget) instead of growing its context while they arrive, which stalls every
        running guest.  Models loaded already, and a host whose models run behind ``rpc``, are left
        as they are."""
        if self.local is not None:
            self.local.registry.expected_sequences = max(0, count)

    def cancel_all(self) -> None:
        """Stop every inference in flight (the guests waiting in ``compute`` get a runtime error)."""
        for state in self.imports.states():
            for context in list(state.contexts.values()):
                context.cancel()
        if self._wit is not None:
            self._wit.cancel_all()
        self.sockets.cancel_all()
