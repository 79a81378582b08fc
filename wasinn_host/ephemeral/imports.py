"""The ``wasi_ephemeral_nn`` import functions (WasmEdge GGML dialect) on a wasmtime Linker.

Steps of every call:

1. find the calling Store's handle tables (:class:`HandleTables`) and the guest memory;
2. read and bounds-check the guest's pointers, lengths and structs;
3. call the backend (load a graph, open a context) or the execution context (``execution.py``);
4. write the results back and return the errno.

This is the one place that turns a :class:`WasiNNError` into the guest's return code
(through :func:`~wasinn_host.ephemeral.errno.errno_for`) and one log line; no exception ever
escapes into wasmtime (that would trap the guest), except the trap WasmEdge also raises
when the module exports no memory.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Sequence

import wasmtime

from ..backend.protocol import Backend
from ..core.cold_store import COLD_STORE
from ..core.config.keys import EMPTY_CONFIG, ParsedConfig, parse_config
from ..core.config.limits import Limits
from ..core.config.preload import Encoding, Target
from ..core.errors import ErrorKind, WasiNNError, invalid
from ..guest.memory import U32_MASK, GuestMemory
from ..guest.native_func import GuestTrap, caller_memory, define_i32_func
from ..guest.stdout import PieceSink, inherited_stdout
from ..guest.store_tables import ContextCounter, StoreTable
from .errno import errno_for
from .handles import HandleTables
from .tensor_check import check_dims_count, check_input_data, check_input_tensor

log = logging.getLogger("wasinn_host")

MODULE = "wasi_ephemeral_nn"
_NO_MEMORY = frozenset(("compute", "compute_single", "fini_single", "unload", "finalize_execution_context"))
"""Calls that read and write no guest memory: theirs is not looked up (a stream's ``compute_single``
comes once a token)."""
_UNUSED_MEMORY = GuestMemory(0, 0)
PRELOAD_PREFIX = b"preload:"
_QUIET = (ErrorKind.END_OF_SEQUENCE,)

# name -> number of i32 parameters (every import returns one i32)
SIGNATURES: dict[str, int] = {
    "load": 5,
    "load_by_name": 3,
    "load_by_name_with_config": 5,
    "init_execution_context": 2,
    "set_input": 3,
    "compute": 1,
    "get_output": 5,
    "compute_single": 1,
    "get_output_single": 5,
    "fini_single": 1,
    "unload": 1,
    "finalize_execution_context": 1,
}


class WasiNNImports:
    """The import functions, bound to a backend; one instance serves any number of Stores.

    ``legacy_output`` copies the whole output into a zero-length ``get_output`` buffer, as
    WasmEdge <= 0.16.3 did (LlamaEdge's apps rely on it), never past the end of guest memory.
    """

    def __init__(
        self,
        backend: Backend,
        limits: Limits | None = None,
        allowed: Iterable[str] | None = None,
        legacy_output: bool = False,
    ) -> None:
        self.backend = backend
        self.limits = limits or Limits()
        self.legacy_output = legacy_output
        self.allowed = frozenset(allowed) if allowed is not None else None
        self.contexts_alive = ContextCounter()
        self.stores: StoreTable[HandleTables] = StoreTable(
            self.limits,
            "execution contexts",
            "a Store not attached with WasiNN.attach() called wasi_ephemeral_nn; "
            "its handles are kept until WasiNN.detach()",
        )

    # -- Store bookkeeping ---------------------------------------------------------

    def _new_state(
        self,
        allowed: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = inherited_stdout,
    ) -> HandleTables:
        return HandleTables(
            self.limits, self.contexts_alive, allowed if allowed is not None else self.allowed, dirs, stdout
        )

    def attach(
        self,
        store: wasmtime.Store,
        allowed: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = inherited_stdout,
    ) -> HandleTables:
        """Register a Store: its state is freed with it, and its memory export is cached.

        ``allowed`` limits the model names this Store may load (default: the instance's list);
        ``dirs`` are its preopened (host dir, guest dir) pairs, the only places its ``image`` key may name;
        ``stdout`` receives its ``stream-stdout`` pieces (where its guest's stdout goes).
        """
        state = self._new_state(allowed, dirs, stdout)
        state.cache_memory = True
        return self.stores.put(store, state)

    def detach(self, store: wasmtime.Store) -> None:
        """Free a Store's contexts and graphs now."""
        self.stores.detach(store)

    def state_count(self) -> int:
        """The number of Stores with handle tables now."""
        return len(self.stores)

    def states(self) -> list[HandleTables]:
        """The Stores known now."""
        return self.stores.states()

    def sessions_status(self) -> dict[str, int]:
        """The ``sessions`` section of the status: Stores, contexts, graphs and their limits."""
        states = self.states()
        return {
            "stores": len(states),
            "execution_contexts": sum(len(s.contexts) for s in states),
            "graphs": sum(len(s.graphs) for s in states),
            "max_contexts_per_store": self.limits.max_contexts_per_store,
            "max_contexts_total": self.limits.max_contexts_total,
            **COLD_STORE.status(),
        }

    def reap_idle(self) -> None:
        """Finalise the execution contexts unused for ``idle_timeout_ms`` in every Store."""
        self.stores.reap_idle()

    def _state(self, key: int) -> HandleTables:
        return self.stores.get(key, self._new_state)

    @staticmethod
    def _memory(caller: int, context: int, state: HandleTables, used: bool = True) -> GuestMemory:
        """The guest's memory as it is now (``used`` False: only checked to exist, for a call that
        reads and writes none)."""
        memory = state.memory
        if memory is None:
            memory = caller_memory(caller)
            if memory is None:
                raise GuestTrap("wasi_ephemeral_nn: the calling module exports no memory")
            if state.cache_memory:
                state.memory = memory
        return GuestMemory(*memory.base_and_size(context)) if used else _UNUSED_MEMORY

    # -- registration --------------------------------------------------------------

    def add_to_linker(self, linker: wasmtime.Linker) -> None:
        """Define all 12 imports of module ``wasi_ephemeral_nn`` on ``linker``."""
        for name, arity in SIGNATURES.items():
            define_i32_func(linker, MODULE, name, arity, self._wrap(name, getattr(self, name)))

    def _wrap(self, name: str, impl: Callable[..., None]) -> Callable[..., int]:
        used = name not in _NO_MEMORY

        def host_function(caller: int, context: int, *args: int) -> int:
            state = self._state(context)
            state.calls[name] += 1
            memory = self._memory(caller, context, state, used)
            try:
                impl(memory, state, *args)
                return 0
            except WasiNNError as err:
                errno = errno_for(err.kind)
                if err.kind not in _QUIET:
                    log.warning(
                        "wasi-nn %s: %s (errno %d %s)",
                        name,
                        err.message,
                        errno,
                        errno.name,
                        extra=_log_fields(name, args, errno),
                    )
                return int(errno)
            except Exception as exc:  # a host bug must not take the guest down with a trap
                log.exception("wasi-nn %s: internal error: %s", name, exc)
                return int(errno_for(ErrorKind.RUNTIME_ERROR))

        host_function.__name__ = f"wasi_nn_{name}"
        return host_function

    # -- loading -------------------------------------------------------------------

    def load(
        self,
        mem: GuestMemory,
        state: HandleTables,
        builders_ptr: int,
        builders_len: int,
        encoding: int,
        target: int,
        graph_out: int,
    ) -> None:
        """``load(builders, n, encoding, target, *graph)``: a model from GGUF bytes in ``builders[0]``
        (``builders[1]``: optional config JSON); GGML encoding and CPU/GPU/TPU target only (the target
        chooses the GPU layers unless the config sets ``n-gpu-layers``)."""
        encoding &= U32_MASK
        target &= U32_MASK
        if encoding != Encoding.GGML:
            name = Encoding(encoding).name if encoding in Encoding._value2member_map_ else "unknown"
            raise WasiNNError(
                ErrorKind.INVALID_ENCODING, f"load: encoding {encoding} ({name}) is not supported; accepted: 6 (GGML)"
            )
        if target not in (Target.CPU, Target.GPU, Target.TPU):
            raise invalid(f"load: execution target {target} is not accepted; accepted: 0 (CPU), 1 (GPU), 2 (TPU)")
        count = builders_len & U32_MASK
        if count == 0:
            raise invalid("load: the graph-builder array is empty; builders[0] must hold the GGUF bytes")
        if not self.limits.allow_load_bytes:
            raise WasiNNError(
                ErrorKind.UNSUPPORTED,
                "load: loading models from guest bytes is disabled on this host "
                "(Limits(allow_load_bytes=True) or drop `wasinn run --no-load-bytes`); use load_by_name",
            )
        state.check_graph_room()
        entries = mem.read_u32s(builders_ptr, 2 * min(count, 2), "load builders")
        if entries[1] > self.limits.max_load_bytes:
            raise self.limits.refuse(
                ErrorKind.TOO_LARGE, f"load: model of {entries[1]} bytes", "max_load_bytes", self.limits.max_load_bytes
            )
        mem.check(graph_out, 4, "load graph_id_out")
        model_bytes = mem.read(entries[0], entries[1], "load builders[0]")
        if model_bytes.startswith(PRELOAD_PREFIX):
            raise invalid(
                "load: 'preload:<path>' builders are refused: guests may not name host files; "
                "use load_by_name with a name the host preloaded"
            )
        config = mem.read(entries[2], entries[3], "load builders[1]") if count >= 2 else b""
        parsed = (parse_config(config) if config else EMPTY_CONFIG).with_target(Target(target))
        graph = self.backend.load_bytes(model_bytes, parsed)
        mem.write_u32(graph_out, state.add_graph(graph), "load graph_id_out")

    def _load_named(
        self,
        mem: GuestMemory,
        state: HandleTables,
        name_ptr: int,
        name_len: int,
        config: ParsedConfig | None,
        graph_out: int,
    ) -> None:
        """Load ``name`` (or return the Store's cached handle for it) and write the graph handle."""
        raw = mem.read(name_ptr, name_len, "model name")
        mem.check(graph_out, 4, "graph_id_out")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(f"model name {raw!r} is not valid UTF-8") from None
        mem.write_u32(graph_out, state.load_named(self.backend, name, config or EMPTY_CONFIG), "graph_id_out")

    def load_by_name(self, mem: GuestMemory, state: HandleTables, name_ptr: int, name_len: int, graph_out: int) -> None:
        """``load_by_name(name, len, *graph)``: a model the host preloaded under ``name``."""
        self._load_named(mem, state, name_ptr, name_len, None, graph_out)

    def load_by_name_with_config(
        self,
        mem: GuestMemory,
        state: HandleTables,
        name_ptr: int,
        name_len: int,
        config_ptr: int,
        config_len: int,
        graph_out: int,
    ) -> None:
        """``load_by_name_with_config(name, len, config, len, *graph)``: as ``load_by_name``, with config
        JSON (load-time keys choose the model instance; the rest are the contexts' defaults)."""
        text = mem.read(config_ptr, config_len, "config")
        self._load_named(mem, state, name_ptr, name_len, parse_config(text), graph_out)

    def unload(self, mem: GuestMemory, state: HandleTables, graph: int) -> None:
        """``unload(graph)``: forget the graph; its contexts fail from now on, as in WasmEdge."""
        state.unload(graph)

    # -- contexts ------------------------------------------------------------------

    def init_execution_context(self, mem: GuestMemory, state: HandleTables, graph: int, ctx_out: int) -> None:
        """``init_execution_context(graph, *ctx)``: a new conversation on the graph."""
        state.graph(graph)
        mem.check(ctx_out, 4, "ctx_out")
        mem.write_u32(ctx_out, state.open_context(graph), "ctx_out")

    def finalize_execution_context(self, mem: GuestMemory, state: HandleTables, ctx: int) -> None:
        """``finalize_execution_context(ctx)``: free the context."""
        state.finalize(ctx)

    def set_input(self, mem: GuestMemory, state: HandleTables, ctx: int, index: int, tensor_ptr: int) -> None:
        """``set_input(ctx, index, *tensor)``: a U8 tensor; index 1 is metadata JSON, any other the prompt."""
        context = state.context(ctx)
        dims_ptr, dims_len, ttype, data_ptr, data_len = mem.read_u32s(tensor_ptr, 5, "tensor struct")
        check_dims_count(dims_len)
        check_input_tensor(ttype & 0xFF, mem.read_u32s(dims_ptr, dims_len, "tensor dims"), data_len, self.limits)
        data = mem.read(data_ptr, data_len, "tensor data")
        check_input_data(data, self.limits)
        context.set_input(index & U32_MASK, data)

    def compute(self, mem: GuestMemory, state: HandleTables, ctx: int) -> None:
        """``compute(ctx)``: generate the whole answer (context full: output kept, reported)."""
        state.context(ctx).compute()

    def compute_single(self, mem: GuestMemory, state: HandleTables, ctx: int) -> None:
        """``compute_single(ctx)``: generate one token (end-of-sequence reported at the end)."""
        state.context(ctx).compute_single()

    def fini_single(self, mem: GuestMemory, state: HandleTables, ctx: int) -> None:
        """``fini_single(ctx)``: end a stream; the next ``compute_single`` starts over."""
        state.context(ctx).fini_single()

    def get_output(
        self, mem: GuestMemory, state: HandleTables, ctx: int, index: int, out_ptr: int, out_max: int, written_ptr: int
    ) -> None:
        """``get_output(ctx, index, buf, len, *written)``: index 1 the metadata JSON, else the whole output."""
        self._copy_out(mem, state.context(ctx).get_output(index & U32_MASK), out_ptr, out_max, written_ptr)

    def get_output_single(
        self, mem: GuestMemory, state: HandleTables, ctx: int, index: int, out_ptr: int, out_max: int, written_ptr: int
    ) -> None:
        """``get_output_single(ctx, index, buf, len, *written)``: index 1 the metadata JSON, else the last piece."""
        self._copy_out(mem, state.context(ctx).get_output_single(index & U32_MASK), out_ptr, out_max, written_ptr)

    def _copy_out(self, mem: GuestMemory, data: bytes, out_ptr: int, out_max: int, written_ptr: int) -> None:
        """Copy output to the guest; too small a buffer gets TooLarge, the needed size and no bytes.

        A zero-length buffer with ``legacy_output`` on gets the whole output (WasmEdge <= 0.16.3),
        as long as it fits between ``out_ptr`` and the end of guest memory.
        """
        out_max &= U32_MASK
        mem.check(written_ptr, 4, "bytes_written_out")
        needed = len(data)
        if out_max == 0 and needed and self.legacy_output:
            out_max = max(0, min(needed, mem.size - (out_ptr & U32_MASK)))
        mem.check(out_ptr, out_max, "output buffer")
        if needed > out_max:
            mem.write_u32(written_ptr, needed, "bytes_written_out")
            if out_max == 0 and not self.legacy_output:
                raise WasiNNError(
                    ErrorKind.TOO_LARGE,
                    (
                        f"output of {needed} bytes does not fit the guest buffer of 0 bytes: a zero-length buffer "
                        f"is LlamaEdge's pattern (it relied on WasmEdge <= 0.16.3 copying anyway); "
                        f"run with `wasinn run --nn-legacy-output` or WasiNN(legacy_output=True) to allow it"
                    ),
                )
            raise WasiNNError(
                ErrorKind.TOO_LARGE, f"output of {needed} bytes does not fit the guest buffer of {out_max} bytes"
            )
        mem.write(out_ptr, data, "output buffer")
        mem.write_u32(written_ptr, needed, "bytes_written_out")


_GRAPH_FIRST = ("init_execution_context", "unload")
_CONTEXT_FIRST = (
    "set_input",
    "compute",
    "get_output",
    "compute_single",
    "get_output_single",
    "fini_single",
    "finalize_execution_context",
)


def _log_fields(name: str, args: tuple[int, ...], errno: int) -> dict[str, object]:
    """``extra`` for a log record: the call, its graph or context handle, the errno."""
    fields: dict[str, object] = {"event": name, "errno": int(errno)}
    if name in _GRAPH_FIRST:
        fields["graph"] = args[0] & U32_MASK
    elif name in _CONTEXT_FIRST:
        fields["context"] = args[0] & U32_MASK
    return fields
