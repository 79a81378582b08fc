"""The ``wasi:nn`` imports (graph, tensor, inference, errors) on a component Linker, in every version
:mod:`.versions` lists (0.2.0-rc-2024-10-28, 08-19 and 06-25) on the same functions.

Steps of every call:

1. find the calling Store's resource tables (:class:`ComponentState`);
2. turn the guest's borrowed or owned handles into host objects (releasing borrows at once);
3. call the backend (load a graph, open a context) or the backend context (configure, prompt,
   generate), with the tensors read as :mod:`wasinn_host.wit.llm_mapping` says;
4. return the result, or a new ``error`` resource.

This is the one place that turns a :class:`WasiNNError` into a WIT ``error`` (through
:func:`~wasinn_host.wit.error_code.error_code_for`) and one log line, whose text is also what
``error.data()`` returns.  The backend is the same one the ``wasi_ephemeral_nn`` imports use, so
components and core modules share models and decode in the same batches.

The older versions' ``set-input(name, tensor)`` keeps the tensor on the execution context,
``compute()`` runs what 2024-10-28's ``compute(inputs)`` runs on the tensors set (and consumes them),
and ``get-output(name)`` returns one of the tensors that compute answered with (``output``,
``metadata``), the same answer in two steps.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Sequence

import wasmtime
from wasmtime import component as cm

from ..backend.protocol import Backend
from ..core.config.keys import EMPTY_CONFIG, parse_config
from ..core.config.limits import Limits
from ..core.config.preload import Target
from ..core.errors import ErrorKind, WasiNNError, invalid
from ..guest import fast_calls, variant_scratch
from ..guest.files import with_guest_projector
from ..guest.metadata import metadata_json
from ..guest.stdout import PieceSink, inherited_stdout
from ..guest.store_tables import ContextCounter, StoreTable, store_key
from .error_code import ErrorCode, error_code_for
from .hayride_streams import HayrideStreams
from .llm_mapping import answer_tensors, read_request
from .ready_pollable import ReadyPollables
from .store_state import CONTEXT, CONTEXT_STREAM, ERROR, GRAPH, GRAPH_STREAM, TENSOR, TENSOR_STREAM, ComponentState
from .tensors import HostTensor
from .versions import SERVED

log = logging.getLogger("wasinn_host")

RESOURCE_TYPES = {
    TENSOR: 0x776E6E01,
    ERROR: 0x776E6E02,
    CONTEXT: 0x776E6E03,
    GRAPH: 0x776E6E04,
    TENSOR_STREAM: 0x776E6E05,
    CONTEXT_STREAM: 0x776E6E06,
    GRAPH_STREAM: 0x776E6E07,
}
"""The host resource type id of each resource (arbitrary, distinct numbers; the same in every
``wasi:nn`` version)."""

ENCODINGS = ("ggml", "autodetect")
"""``graph-encoding`` cases ``load`` accepts (GGUF bytes)."""


Storelike = Any  # wasmtime.Store or the StoreContext a host function receives


def _own(kind: str, rep: int) -> cm.ResourceHost:
    return cm.ResourceHost.own(rep, RESOURCE_TYPES[kind])


def _rep(store: Storelike, handle: cm.ResourceAny) -> int:
    """The rep of a handle the guest passed (a borrow is released by this)."""
    return int(handle.to_host(store).rep)


class WitNNImports:
    """The WIT imports, bound to a backend; one instance serves any number of Stores."""

    def __init__(
        self,
        backend: Backend,
        limits: Limits | None = None,
        allowed: Iterable[str] | None = None,
        counter: ContextCounter | None = None,
        fast_lists: bool = True,
    ) -> None:
        self.backend = backend
        self.fast_lists = fast_lists
        """False: define the functions with wasmtime-py's ``add_func`` (byte lists element by element;
        for measuring what :mod:`~wasinn_host.guest.fast_calls` saves)."""
        self.limits = limits or Limits()
        self.allowed = frozenset(allowed) if allowed is not None else None
        self.contexts_alive = counter or ContextCounter()
        self._pollables: ReadyPollables | None = None
        self.stores: StoreTable[ComponentState] = StoreTable(
            self.limits,
            "component execution contexts",
            "a Store not attached with WasiNN.attach() called wasi:nn; its resources are kept until WasiNN.detach()",
        )

    # -- Store bookkeeping ---------------------------------------------------------

    def attach(
        self,
        store: wasmtime.Store,
        allowed: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = inherited_stdout,
    ) -> ComponentState:
        """Give ``store`` its resource tables, freed with the Store (or by :meth:`detach`); ``dirs`` are
        the (host, guest) directories preopened for it, the only places its ``image`` key may name;
        ``stdout`` receives its ``stream-stdout`` pieces (where its guest's stdout goes)."""
        return self.stores.put(store, self._new_state(allowed if allowed is not None else self.allowed, dirs, stdout))

    def _new_state(
        self,
        allowed: frozenset[str] | Iterable[str] | None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = inherited_stdout,
    ) -> ComponentState:
        return ComponentState(self.limits, self.contexts_alive, allowed, dirs, stdout)

    def detach(self, store: wasmtime.Store) -> None:
        """Free ``store``'s resources now."""
        self.stores.detach(store)

    def states(self) -> list[ComponentState]:
        """The Stores known now."""
        return self.stores.states()

    def state(self, store: Storelike) -> ComponentState:
        """The resource tables of the calling Store."""
        return self.stores.get(store_key(store), self._default_state)

    def _default_state(self) -> ComponentState:
        return self._new_state(self.allowed)

    # -- registration --------------------------------------------------------------

    def add_to_linker(self, linker: cm.Linker) -> None:
        """Define the four ``wasi:nn`` interfaces of every served version on ``linker`` (usable with many
        Stores)."""
        variant_scratch.install()  # guests in threads of their own lower variants at once

        def add_fast_func(instance: cm.LinkerInstance, name: str, func: Callable[..., Any]) -> None:
            if self.fast_lists:
                fast_calls.add_fast_func(instance, name, func)
            else:
                instance.add_func(name, func)

        compute = self.result("compute", self.compute, tagged=False)
        set_input = self.result("set-input", self.set_input, tagged=False)
        compute_set_inputs = self.result("compute", self.compute_set_inputs, tagged=False)
        get_output = self.result("get-output", self.get_output)
        init_execution_context = self.result("init-execution-context", self.init_execution_context)
        load = self.result("load", self.load)
        load_by_name = self.result("load-by-name", self.load_by_name)
        with linker.root() as root:
            for wit in SERVED:
                with root.add_instance(wit.interface("tensor")) as tensor:
                    self.resource(tensor, TENSOR)
                    add_fast_func(tensor, "[constructor]tensor", self.tensor_new)
                    add_fast_func(tensor, "[method]tensor.dimensions", self.tensor_dimensions)
                    add_fast_func(tensor, "[method]tensor.ty", self.tensor_ty)
                    add_fast_func(tensor, "[method]tensor.data", self.tensor_data)
                with root.add_instance(wit.interface("errors")) as errors:
                    self.resource(errors, ERROR)
                    if wit.error_constructor:
                        add_fast_func(errors, "[constructor]error", self.error_new)
                    add_fast_func(errors, "[method]error.code", self.error_code)
                    add_fast_func(errors, "[method]error.data", self.error_data)
                with root.add_instance(wit.interface("inference")) as inference:
                    self.resource(inference, CONTEXT)
                    if wit.set_input:
                        add_fast_func(inference, "[method]graph-execution-context.set-input", set_input)
                        add_fast_func(inference, "[method]graph-execution-context.compute", compute_set_inputs)
                        add_fast_func(inference, "[method]graph-execution-context.get-output", get_output)
                    else:
                        add_fast_func(inference, "[method]graph-execution-context.compute", compute)
                with root.add_instance(wit.interface("graph")) as graph:
                    self.resource(graph, GRAPH)
                    add_fast_func(graph, "[method]graph.init-execution-context", init_execution_context)
                    add_fast_func(graph, "load", load)
                    add_fast_func(graph, "load-by-name", load_by_name)
            HayrideStreams(self).add_to(root, add_fast_func)
        if self._pollables is None or self._pollables.engine is not linker.engine:
            self._pollables = ReadyPollables(linker.engine)

    def ready_pollable(self, store: Storelike, state: ComponentState) -> Any:
        """A ready ``wasi:io/poll`` pollable for the guest of ``store`` (see :mod:`.ready_pollable`)."""
        if self._pollables is None:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, "no Linker defined these imports")
        return self._pollables.new(store, state.pollable_factory)

    @staticmethod
    def own(kind: str, rep: int) -> cm.ResourceHost:
        """An owned handle of the host resource ``kind`` for the guest."""
        return _own(kind, rep)

    def resource(self, instance: cm.LinkerInstance, kind: str) -> None:
        """Define the host resource ``kind`` on ``instance`` (a guest's drop frees what is behind it)."""

        def dtor(store: Storelike, rep: int) -> None:
            self.state(store).drop(kind, rep)

        instance.add_resource(kind, cm.ResourceType.host(RESOURCE_TYPES[kind]), dtor)

    def result(self, name: str, impl: Callable[..., Any], tagged: bool = True) -> Callable[..., Any]:
        """Wrap a ``result<T, error>`` function: a WasiNNError becomes an ``error`` resource and a log line.

        wasmtime-py wants a :class:`~wasmtime.component.Variant` only where both cases are the same
        Python type (``result<own A, own B>``); ``result<list<...>, own B>`` takes the value itself.
        """

        def host_function(store: Storelike, *args: Any) -> Any:
            state = self.state(store)
            state.calls[name] += 1
            reps = _reps(store, args)
            try:
                value = impl(state, *reps)
                return cm.Variant("ok", value) if tagged else value
            except WasiNNError as err:
                prefixed = err.message.startswith(f"{name}: ")
                code, message = error_code_for(err.kind), err.message if prefixed else f"{name}: {err.message}"
            except Exception as exc:  # a host bug must not trap the guest
                log.exception("wasi:nn %s: internal error: %s", name, exc)
                code, message = ErrorCode.UNKNOWN, f"{name}: internal error: {type(exc).__name__}: {exc}"
            log.warning("wasi:nn %s (%s)", message, code.value, extra={"event": name, "error_code": code.value})
            error = _own(ERROR, state.add_error(code, message))
            return cm.Variant("err", error) if tagged else error

        return host_function

    # -- tensor --------------------------------------------------------------------

    def tensor_new(self, store: Storelike, dimensions: list[int], ty: str, data: bytes) -> cm.ResourceHost:
        """``[constructor]tensor(dimensions, ty, data)``: an immutable tensor owned by the guest."""
        return _own(TENSOR, self.state(store).add_tensor(HostTensor(tuple(dimensions), ty, data)))

    def tensor_dimensions(self, store: Storelike, handle: cm.ResourceAny) -> list[int]:
        """``[method]tensor.dimensions()``."""
        return list(self.state(store).tensor(_rep(store, handle)).dimensions)

    def tensor_ty(self, store: Storelike, handle: cm.ResourceAny) -> str:
        """``[method]tensor.ty()``."""
        return self.state(store).tensor(_rep(store, handle)).ty

    def tensor_data(self, store: Storelike, handle: cm.ResourceAny) -> bytes:
        """``[method]tensor.data()``: the bytes, in one copy (see :mod:`wasinn_host.guest.fast_calls`)."""
        return self.state(store).tensor(_rep(store, handle)).data

    # -- errors --------------------------------------------------------------------

    def error_new(self, store: Storelike, code: str, data: str) -> cm.ResourceHost:
        """``[constructor]error(code, data)`` (0.2.0-rc-2024-06-25 only): an error the guest made."""
        return _own(ERROR, self.state(store).add_error(ErrorCode(code), data))

    def error_code(self, store: Storelike, handle: cm.ResourceAny) -> str:
        """``[method]error.code()``."""
        return self.state(store).error(_rep(store, handle))[0].value

    def error_data(self, store: Storelike, handle: cm.ResourceAny) -> str:
        """``[method]error.data()``: the one-line message the host logged."""
        return self.state(store).error(_rep(store, handle))[1]

    # -- graph ---------------------------------------------------------------------

    def load(self, state: ComponentState, builders: list[bytes], encoding: str, target: str) -> cm.ResourceHost:
        """``load(builder, encoding, target)``: a model from GGUF bytes in ``builder[0]``."""
        if encoding not in ENCODINGS:
            raise WasiNNError(
                ErrorKind.INVALID_ENCODING, f"encoding {encoding} is not supported; accepted: {', '.join(ENCODINGS)}"
            )
        if not builders:
            raise invalid("the builder list is empty; builder[0] must hold the GGUF bytes")
        if not self.limits.allow_load_bytes:
            raise WasiNNError(
                ErrorKind.UNSUPPORTED,
                "loading models from guest bytes is disabled on this host "
                "(Limits(allow_load_bytes=True) or drop `wasinn run --no-load-bytes`); use load-by-name",
            )
        size = sum(len(b) for b in builders)
        if size > self.limits.max_load_bytes:
            raise self.limits.refuse(
                ErrorKind.TOO_LARGE, f"load: model of {size} bytes", "max_load_bytes", self.limits.max_load_bytes
            )
        config = EMPTY_CONFIG.with_target(Target[target.upper()])
        return _own(GRAPH, state.add_graph(self.backend.load_bytes(builders[0], config)))

    def load_by_name(self, state: ComponentState, name: str) -> cm.ResourceHost:
        """``load-by-name(name)``: a model the host preloaded under ``name`` (allow-list applies).

        The WIT has no config here, so load-time keys may follow the name as JSON:
        ``load-by-name("default {\"embedding\": true}")`` (what ``load_by_name_with_config`` does
        for a core module).
        """
        return _own(GRAPH, self.graph_rep(state, name))

    def graph_rep(self, state: ComponentState, name: str) -> int:
        """The rep of a new graph on the preloaded ``name`` (with its JSON config, see :meth:`load_by_name`)."""
        config = EMPTY_CONFIG
        if "{" in name:
            name, text = name[: name.index("{")].strip(), name[name.index("{") :]
            config = parse_config(text)
        state.check_name(name)
        if len(state.graphs) >= self.limits.max_graphs_per_store:
            raise self.limits.refuse(
                ErrorKind.BUSY, "load-by-name", "max_graphs_per_store", self.limits.max_graphs_per_store
            )
        return state.add_graph(self.backend.load_by_name(name, with_guest_projector(config, state.dirs)))

    def init_execution_context(self, state: ComponentState, graph: int) -> cm.ResourceHost:
        """``[method]graph.init-execution-context()``: a new conversation on the graph."""
        return _own(CONTEXT, state.add_context(state.graph(graph)))

    # -- inference -----------------------------------------------------------------

    def compute(
        self, state: ComponentState, context_rep: int, inputs: list[tuple[str, int]]
    ) -> list[tuple[str, cm.ResourceHost]]:
        """``[method]graph-execution-context.compute(inputs)``: generate the answer to the prompt tensor.

        The input tensors are the guest's to give: they are consumed whether or not the call succeeds.
        A full context is not an error here: the output so far comes back and the metadata's
        ``stop_reason`` says ``context full``.
        """
        tensors = self.take_inputs(state, inputs)
        answer = self.infer(state, context_rep, tensors)
        return [(name, _own(TENSOR, state.add_tensor(tensor))) for name, tensor in answer]

    def infer(
        self, state: ComponentState, context_rep: int, tensors: list[tuple[str, HostTensor]]
    ) -> list[tuple[str, HostTensor]]:
        """The answer of the context ``context_rep`` to the request ``tensors`` carry (every version's
        compute)."""
        context = state.context(context_rep)
        request = read_request(tensors, self.limits)
        if request.config is not None:
            context.configure(request.config)
        context.set_prompt(request.prompt)
        context.generate(stdout=state.stdout)
        return answer_tensors(request, bytes(context.output), context.embedding, metadata_json(context.metadata()))

    def set_input(self, state: ComponentState, context_rep: int, name: str, tensor_rep: int) -> None:
        """``[method]graph-execution-context.set-input(name, tensor)`` (08-19, 06-25): the tensor (the
        guest's to give) waits on the context for its ``compute()``; a second one of a name replaces
        the first."""
        tensor = state.tensors.pop(tensor_rep, None)
        if tensor is None:
            raise invalid(f"input tensor {name!r} does not exist in this store")
        state.set_input(context_rep, name, tensor)

    def compute_set_inputs(self, state: ComponentState, context_rep: int) -> None:
        """``[method]graph-execution-context.compute()`` (08-19, 06-25): :meth:`infer` on the tensors
        ``set-input`` gave (consumed whether or not it succeeds); the answer waits for ``get-output``."""
        state.keep_outputs(context_rep, self.infer(state, context_rep, state.take_set_inputs(context_rep)))

    def get_output(self, state: ComponentState, context_rep: int, name: str) -> cm.ResourceHost:
        """``[method]graph-execution-context.get-output(name)`` (08-19, 06-25): a new tensor holding
        the output ``name`` of the last ``compute()``."""
        return _own(TENSOR, state.add_tensor(state.output(context_rep, name)))

    @staticmethod
    def take_inputs(state: ComponentState, inputs: list[tuple[str, int]]) -> list[tuple[str, HostTensor]]:
        """The named input tensors, taken from the guest (consumed even when a name is unknown)."""
        taken = [(name, state.tensors.pop(rep, None)) for name, rep in inputs]
        tensors: list[tuple[str, HostTensor]] = []
        for name, tensor in taken:
            if tensor is None:
                raise invalid(f"input tensor {name!r} does not exist in this store")
            tensors.append((name, tensor))
        return tensors

    # -- status --------------------------------------------------------------------

    def sessions_status(self) -> dict[str, int]:
        """Stores, execution contexts, graphs and tensors held by components now."""
        states = self.states()
        return {
            "component_stores": len(states),
            "component_execution_contexts": sum(len(s.contexts) for s in states),
            "component_graphs": sum(len(s.graphs) for s in states),
            "component_tensors": sum(len(s.tensors) for s in states),
        }

    def reap_idle(self) -> None:
        """Free the execution contexts unused for ``idle_timeout_ms`` in every Store."""
        self.stores.reap_idle()

    def cancel_all(self) -> None:
        """Abort every component computation in flight."""
        for state in self.states():
            for context in list(state.contexts.values()):
                context.cancel()


def _reps(store: Storelike, args: tuple[Any, ...]) -> list[Any]:
    """``args`` with every handle (alone or in a named-tensor list) turned into its rep.

    Done before anything else: a borrow left unreleased when the call returns traps the guest,
    and an own handle is the host's from here on.
    """
    out: list[Any] = []
    for arg in args:
        if isinstance(arg, cm.ResourceAny):
            out.append(_rep(store, arg))
        elif isinstance(arg, list) and arg and isinstance(arg[0], tuple):
            out.append([(name, _rep(store, item)) for name, item in arg])
        else:
            out.append(arg)
    return out
