"""The remote backend: the backend protocol over WASI-NN RPC, to one server or many.

:class:`RemoteBackend` stands where :class:`~wasinn_host.backend.local.LocalBackend` would,
so the ``wasi_ephemeral_nn`` imports and a Python :class:`~wasinn_host.Session` run unchanged:
a context's calls become WasmEdge's RPC calls (``SetInput`` index 1 for per-context config,
index 0 for the prompt, ``Compute``/``ComputeSingle``/``FiniSingle``, ``GetOutput(Single)``),
and the server's errno comes back as the same error kind, so the guest gets the same errno.

Scale-out (spec §5.2): one channel per backend; each new context goes to the backend with the
fewest open contexts (from this host's ``Status`` call; round robin when a server cannot say),
its graph is loaded there if needed, and every later call of the context goes to that backend.
Graphs with the same name and config share one server handle per backend.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Sequence

import orjson

from ..core.config.keys import ParsedConfig
from ..core.errors import ErrorKind, WasiNNError, invalid
from ..core.generation import GenerationResult, StopReason, outlet_of
from .client_files import inline_image, without_client_keys
from .endpoint import ClientOptions, Endpoint
from .messages import U8, host, nn
from .stream_push import PushReceiver
from .targets import all_backend_targets

log = logging.getLogger("wasinn_host")

READY_AHEAD = 16
"""Pieces of already sampled tokens a streaming step asks the server for beyond its own."""
REFRESH_SECONDS = 30.0
"""How often DNS targets (a headless Service) are resolved again for new backends."""


class RemoteContext:
    """An execution context on one server; outputs fetched on demand and cached per revision."""

    embedding: list[float] | None = None
    """Always None: an embedding model's output arrives as the server's embedding JSON."""

    def __init__(self, endpoint: Endpoint, handle: int, graph: "RemoteGraph") -> None:
        self.endpoint = endpoint
        self.handle = handle
        self._graph = graph
        self.image_key = graph.image_key
        self.read_image: Callable[[str], bytes] | None = None
        """Reads the ``image`` key's file through the guest's directories (set by the front end)."""
        self.busy = False
        self.last_used = time.monotonic()
        self.revision = 0
        self._cache: dict[str, tuple[int, bytes]] = {}
        self._ready: collections.deque[bytes] = collections.deque()
        """Pieces of the stream's next tokens the server had sampled at the last step (``ready``)."""
        self._taken = 0
        """Steps answered from ``_ready`` that the server has not made yet (it makes them first)."""
        self._push: PushReceiver | None = None
        """The stream's pieces the server pushes (``StreamSingle``, :mod:`.stream_push`), while open."""
        self._future: Any = None
        self.closed = False
        self.stream_stdout = bool(graph.config.stopping.get("stream_stdout", False))
        """The guest's ``stream-stdout``: this client writes the pieces to the guest's stdout (a server
        never prints for a client)."""

    def _set_input(self, index: int, data: bytes) -> None:
        self._sync()
        tensor = nn.Tensor(dimensions=[len(data)], ty=U8, data=data)
        request = nn.SetInputRequest(resource_handle=self.handle, index=index, tensor=tensor)
        try:
            self.endpoint.call(self.endpoint.context.SetInput, request, "SetInput")
        finally:
            self.revision += 1

    def _compute(self, method: str, rpc: Any = None, request: Any = None, cancellable: bool = True) -> Any:
        if method != "ComputeSingleOutput":
            self._sync()
        self.busy = True
        try:
            return self.endpoint.compute(
                getattr(self.endpoint.context, method) if rpc is None else rpc,
                nn.ComputeRequest(resource_handle=self.handle) if request is None else request,
                method,
                self._started if cancellable else None,
            )
        finally:
            self.busy = False
            self._future = None
            self.last_used = time.monotonic()
            self.revision += 1

    def _started(self, future: Any) -> None:
        self._future = future

    def _sync(self) -> None:
        """Before any other call of this context: the server makes the steps answered here (their tokens
        are sampled already), so it is where the guest is; the pieces not used are forgotten."""
        self._close_push()
        self._ready.clear()
        taken, self._taken = self._taken, 0
        if taken:  # tokens sampled already: no wait for the model, so a plain call (not a cancellable future)
            revision = self.revision  # what the guest sees does not change
            request = host.StepRequest(ctx_handle=self.handle, taken=taken, sync_only=True)
            self._compute("ComputeSingleOutput", self.endpoint.host.ComputeSingleOutput, request, cancellable=False)
            self.revision = revision

    def _output(self, method: str, index: int) -> bytes:
        key = f"{method}:{index}"
        cached = self._cache.get(key)
        if cached is not None and cached[0] == self.revision:
            return cached[1]
        self._sync()
        request = nn.GetOutputRequest(resource_handle=self.handle, index=index)
        data = bytes(self.endpoint.call(getattr(self.endpoint.context, method), request, method).data)
        self._cache[key] = (self.revision, data)
        return data

    def configure(self, config: ParsedConfig) -> None:
        """Send the config JSON as written (``SetInput`` index 1), less the keys naming the guest's
        files (``client_files.py``); an ``image`` key applies to the following prompts."""
        config, image = without_client_keys(config)
        if image is not None:
            self.image_key = image
        if "stream_stdout" in config.stopping:
            self.stream_stdout = bool(config.stopping["stream_stdout"])
        self._set_input(1, config.source)

    def set_prompt(self, data: bytes) -> None:
        """Send the prompt (``SetInput`` index 0), with the ``image`` key's file inline."""
        if self.image_key:
            if self.read_image is None:
                raise invalid(f"config key 'image' {self.image_key!r}: this front end cannot read files")
            data = inline_image(data, self.read_image(self.image_key))
        self._set_input(0, data)

    def generate(
        self, on_piece: Callable[[bytes], None] | None = None, stdout: Callable[[bytes], None] | None = None
    ) -> GenerationResult:
        """``Compute``; a full context keeps its output, as locally.

        With ``on_piece`` (or the guest's ``stream-stdout``: the pieces go to ``stdout``, the guest's
        stdout here on the guest's host) the pieces come as they are generated through this host's
        ``ComputePieces``; a server without it computes first and the whole output goes to the sink at the end."""
        sink = on_piece or (stdout if self.stream_stdout else None)
        try:
            if sink is None:
                self._compute("Compute")
            else:
                self._compute_pieces(sink)
        except WasiNNError as err:
            if err.kind is ErrorKind.CONTEXT_FULL:
                return GenerationResult(stop_reason=StopReason.CONTEXT_FULL)
            raise
        finally:
            if (outlet := outlet_of(sink)) is not None:
                outlet.flush()  # the pieces land before whatever the guest writes next
        return GenerationResult()

    def _compute_pieces(self, sink: Callable[[bytes], None]) -> None:
        if self.endpoint.has_host is not False and self.endpoint.has_pieces:
            request = host.StepRequest(ctx_handle=self.handle)
            self.busy = True
            try:
                for result in self.endpoint.stream(self.endpoint.host.ComputePieces, request, "compute", self._started):
                    sink(bytes(result.piece))
                return
            except WasiNNError as err:
                if err.kind is not ErrorKind.UNSUPPORTED:
                    raise
                self.endpoint.has_pieces = False  # WasmEdge's server, or an older wasinn-host one
            finally:
                self.busy = False
                self._future = None
                self.last_used = time.monotonic()
                self.revision += 1
        try:
            self._compute("Compute")
        except WasiNNError as err:
            if err.kind is ErrorKind.CONTEXT_FULL:
                sink(self._output("GetOutput", 0))
            raise
        sink(self._output("GetOutput", 0))

    def stream_step(self) -> GenerationResult:
        """``ComputeSingle``: one token, or the end of the sequence or of the context.

        A wasinn-host server pushes the stream's pieces as its tokens are sampled (``StreamSingle``,
        :mod:`.stream_push`): a step takes the next one, waiting only for a token not sampled yet, and no
        call is made per token.  A server without it answers ``ComputeSingleOutput`` with the token's
        piece too, so the guest's ``get_output_single`` that follows costs no second round trip, and with
        the pieces of the tokens its stream has sampled beyond it: the steps that follow take those with
        no round trip at all, and the next call to the server reports them."""
        if self._push is not None or (self.endpoint.has_host and self.endpoint.has_push and not self._ready):
            try:
                piece = self._pushed_piece()
            except WasiNNError as err:
                return self._step_error(err)
            if piece is not None:
                self.revision += 1
                self.last_used = time.monotonic()
                self._cache["GetOutputSingle:0"] = (self.revision, piece)
                return GenerationResult(stop_reason=StopReason.TOKEN)
        if self._ready:
            self._taken += 1
            self.revision += 1
            self.last_used = time.monotonic()
            self._cache["GetOutputSingle:0"] = (self.revision, self._ready.popleft())
            return GenerationResult(stop_reason=StopReason.TOKEN)
        try:
            if self.endpoint.has_host and self.endpoint.has_step:
                self._step_with_piece()
            else:
                self._compute("ComputeSingle")
        except WasiNNError as err:
            return self._step_error(err)
        return GenerationResult(stop_reason=StopReason.TOKEN)

    @staticmethod
    def _step_error(err: WasiNNError) -> GenerationResult:
        """The end of a stream as a step's result; any other error raised."""
        if err.kind is ErrorKind.END_OF_SEQUENCE:
            return GenerationResult(stop_reason=StopReason.EOS)
        if err.kind is ErrorKind.CONTEXT_FULL:
            return GenerationResult(stop_reason=StopReason.CONTEXT_FULL)
        raise err

    def _pushed_piece(self) -> bytes | None:
        """The next pushed piece (opening the push at a stream's step); None when the stream's end comes
        next or the server cannot push: the step is then a plain call (the push closed first)."""
        push = self._push
        if push is None:
            if self._taken:  # steps answered from pieces sent ahead: the server makes them first
                self._sync()
            self._push = push = PushReceiver(self.handle, self._open_push)
        self.busy = True
        try:
            piece = push.next_piece()
        except WasiNNError as err:
            self._push = None
            self._future = None
            push.abandon()
            if err.kind is not ErrorKind.UNSUPPORTED:
                raise
            self.endpoint.has_push = False  # an older server, or one whose contexts cannot push
            return None
        finally:
            self.busy = False
        if piece is None:
            self._close_push()
        return piece

    def _open_push(self, reports: Iterator[Any]) -> Iterator[Any]:
        return self.endpoint.stream(self.endpoint.host.StreamSingle, reports, "compute_single", self._started)

    def _close_push(self) -> None:
        """Report the steps the guest took from pushed pieces and end the push (the server is then where
        the guest is)."""
        push, self._push = self._push, None
        if push is None:
            return
        try:
            push.close()
        except WasiNNError as err:  # the call failed on the way: the next call meets the same failure
            log.info("stream of pieces from %s: %s", self.endpoint.target, err.message)
        finally:
            self._future = None

    def _step_with_piece(self) -> None:
        taken, self._taken = self._taken, 0
        request = host.StepRequest(ctx_handle=self.handle, taken=taken, ahead=READY_AHEAD)
        try:
            result = self._compute("ComputeSingleOutput", self.endpoint.host.ComputeSingleOutput, request)
        except WasiNNError as err:
            if err.kind is not ErrorKind.UNSUPPORTED:
                raise
            self.endpoint.has_step = False  # an older wasinn-host server: two calls per token
            self._compute("ComputeSingle")
            return
        self._cache["GetOutputSingle:0"] = (self.revision, bytes(result.piece))
        self._ready.extend(bytes(piece) for piece in result.ready)

    def ready_pieces(self, limit: int) -> list[bytes]:
        """None: a server in front of this one answers each step of its own clients through here."""
        return []

    def end_stream(self) -> None:
        """``FiniSingle``."""
        self._compute("FiniSingle")

    @property
    def output(self) -> bytearray:
        """The whole output (``GetOutput`` index 0)."""
        return bytearray(self._output("GetOutput", 0))

    @property
    def last_piece(self) -> bytes:
        """The last token's bytes (``GetOutputSingle`` index 0)."""
        return self._output("GetOutputSingle", 0)

    def metadata(self) -> dict[str, Any]:
        """The server's metadata JSON (``GetOutput`` index 1), parsed."""
        meta: dict[str, Any] = orjson.loads(self._output("GetOutput", 1))
        return meta

    def cancel(self) -> None:
        """Cancel the computing call in flight; the server cancels the computation."""
        future = self._future
        if future is not None:
            future.cancel()

    def close(self) -> None:
        """Free the context on the server (a WasmEdge server cannot: it keeps it)."""
        if self.closed:
            return
        self.closed = True
        if self._push is not None:  # the server ends the call and keeps the steps reported
            self._push.abandon()
            self._push = None
            if self._future is not None:
                self._future.cancel()
        self.endpoint.contexts -= 1
        if self.endpoint.closed:
            return  # the server frees the session's contexts itself
        request = host.FinalizeRequest(ctx_handle=self.handle)
        if self.endpoint.down_since is not None:
            self.endpoint.keeper.later("FinalizeExecutionContext", request)
            return
        try:
            self.endpoint.host_call("FinalizeExecutionContext", request)
        except WasiNNError as err:
            if err.kind is not ErrorKind.UNSUPPORTED:
                log.info("finalize of remote context %d on %s: %s", self.handle, self.endpoint.target, err.message)


class _SharedGraph:
    """One server-side graph handle shared by the graphs of this client with the same name and config."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.users = 0


class RemoteGraph:
    """A graph as a guest holds it: loaded on one backend, its contexts placed on any."""

    def __init__(
        self,
        backend: "RemoteBackend",
        name: str | None,
        config: ParsedConfig,
        home: Endpoint,
        handle: int,
        image_key: str | None = None,
    ) -> None:
        self.backend = backend
        self.name = name
        self.config = config
        self.image_key = image_key
        """The load config's ``image`` (kept here, see ``client_files.py``): the contexts' first image."""
        self.home = home
        self._handles: dict[str, int] = {home.target: handle}
        self._closed = False

    @property
    def stale(self) -> bool:
        """Never: a hot swap on the server is the server's business."""
        return False

    def handle_on(self, endpoint: Endpoint) -> int:
        """The handle of this graph on ``endpoint``, loading it there first if needed."""
        handle = self._handles.get(endpoint.target)
        if handle is None:
            assert self.name is not None
            handle = self._handles[endpoint.target] = self.backend.acquire(endpoint, self.name, self.config)
        return handle

    def open_context(self) -> RemoteContext:
        """A context on the least-loaded backend (the home one for a model sent as bytes)."""
        with self.backend.placing:
            endpoint = self.home if self.name is None else self.backend.place()
            request = nn.InitExecutionContextRequest(resource_handle=self.handle_on(endpoint))
            result = endpoint.call(endpoint.graph_resource.InitExecutionContext, request, "InitExecutionContext")
            endpoint.contexts += 1
        return RemoteContext(endpoint, int(result.ctx_handle), self)

    def close(self) -> None:
        """Let go of the server graphs (unloaded when no graph of this client uses them)."""
        if self._closed:
            return
        self._closed = True
        for target, handle in self._handles.items():
            self.backend.release(target, self.name, self.config, handle)


class RemoteBackend:
    """Models served by ``wasinn serve`` (or WasmEdge's ``wasi_nn_rpcserver``) at ``uris``."""

    def __init__(self, uris: Sequence[str], options: ClientOptions | None = None) -> None:
        if not uris:
            raise ValueError("RemoteBackend needs at least one --nn-rpc-uri")
        self.uris = list(uris)
        self.options = options or ClientOptions()
        self.session = uuid.uuid4().hex
        self.endpoints: dict[str, Endpoint] = {}
        self.placing = threading.RLock()
        self._shared: dict[tuple[str, str | None, bytes, int], _SharedGraph] = {}
        self._round_robin = itertools.count()
        self._resolved_at = 0.0
        self._refresh(force=True)
        if not self.endpoints:
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"--nn-rpc-uri {' '.join(self.uris)}: no backend address")

    def _refresh(self, force: bool = False) -> None:
        """Add backends that the URIs resolve to now (DNS names change as pods come and go)."""
        if not force and time.monotonic() - self._resolved_at < REFRESH_SECONDS:
            return
        self._resolved_at = time.monotonic()
        for target in all_backend_targets(self.uris):
            if target not in self.endpoints:
                endpoint = Endpoint(target, self.session, self.options)
                endpoint.on_lost = self._forget
                self.endpoints[target] = endpoint
                endpoint.attach()

    def _forget(self, endpoint: Endpoint) -> None:
        """A backend no longer holds this client's handles: its shared graph handles mean nothing there
        (called from the session keeper's thread too, hence the lock)."""
        with self.placing:
            for key in [key for key in self._shared if key[0] == endpoint.target]:
                del self._shared[key]

    def place(self) -> Endpoint:
        """The backend for a new graph or context: fewest open contexts, else round robin."""
        if any(uri.startswith("dns:") for uri in self.uris):
            self._refresh()
        candidates = [endpoint for endpoint in self.endpoints.values() if endpoint.usable()]
        if not candidates:
            targets = ", ".join(self.endpoints)
            raise WasiNNError(ErrorKind.RUNTIME_ERROR, f"no RPC backend is reachable ({targets})")
        loads = [endpoint.load() for endpoint in candidates]
        if all(load is not None for load in loads):
            order = sorted(range(len(candidates)), key=lambda i: (loads[i], candidates[i].contexts, i))
            return candidates[order[0]]
        return candidates[next(self._round_robin) % len(candidates)]

    def acquire(self, endpoint: Endpoint, name: str, config: ParsedConfig) -> int:
        """The server handle of ``name`` with ``config`` on ``endpoint`` (loaded once, shared)."""
        key = (endpoint.target, name, config.source, 0)
        with self.placing:
            shared = self._shared.get(key)
            if shared is None:
                if config.source.strip():
                    request = nn.LoadByNameWithConfigRequest(name=name, config=config.source.decode())
                    rpc, method = endpoint.graph.LoadByNameWithConfig, "LoadByNameWithConfig"
                else:
                    request, rpc, method = nn.LoadByNameRequest(name=name), endpoint.graph.LoadByName, "LoadByName"
                shared = self._shared[key] = _SharedGraph(int(endpoint.call(rpc, request, method).graph_handle))
            shared.users += 1
            return shared.handle

    def release(self, target: str, name: str | None, config: ParsedConfig, handle: int) -> None:
        """One user fewer of a server graph; unload it after the last."""
        with self.placing:
            key = (target, name, config.source, 0 if name is not None else handle)
            shared = self._shared.get(key)
            if shared is None or shared.handle != handle:
                return
            shared.users -= 1
            if shared.users > 0:
                return
            del self._shared[key]
        endpoint = self.endpoints.get(target)
        if endpoint is None or endpoint.closed:
            return
        request = host.UnloadRequest(graph_handle=handle)
        if endpoint.down_since is not None:
            endpoint.keeper.later("Unload", request)
            return
        try:
            endpoint.host_call("Unload", request)
        except WasiNNError as err:
            if err.kind is not ErrorKind.UNSUPPORTED:
                log.info("unload of remote graph %d on %s: %s", handle, target, err.message)

    def load_by_name(self, name: str, config: ParsedConfig) -> RemoteGraph:
        """``name`` loaded on the least-loaded backend (errors such as ModelNotFound come from it)."""
        config, image = without_client_keys(config)
        with self.placing:
            endpoint = self.place()
            return RemoteGraph(self, name, config, endpoint, self.acquire(endpoint, name, config), image)

    def load_bytes(self, data: bytes, config: ParsedConfig) -> RemoteGraph:
        """A model sent as bytes (this host's ``Load``; the server must allow it), pinned to one backend."""
        with self.placing:
            endpoint = self.place()
            target = config.model.get("target")
            request = host.LoadRequest(
                model=data, config=config.source.decode(), target=target.name.lower() if target is not None else ""
            )
            handle = int(endpoint.host_call("Load", request).graph_handle)
            self._shared[(endpoint.target, None, config.source, handle)] = _SharedGraph(handle)
            self._shared[(endpoint.target, None, config.source, handle)].users = 1
            return RemoteGraph(self, None, config, endpoint, handle)

    def status(self) -> dict[str, Any]:
        """Each backend: target, up or down, contexts this client holds there, its status JSON."""
        backends = []
        for endpoint in self.endpoints.values():
            entry: dict[str, Any] = {
                "target": endpoint.target,
                "up": endpoint.down_since is None,
                "contexts": endpoint.contexts,
            }
            if endpoint.down_since is None and endpoint.has_host is not False:
                try:
                    entry["status"] = orjson.loads(endpoint.host_call("Status", host.StatusRequest()).json)
                except WasiNNError as err:
                    entry["error"] = err.message
            backends.append(entry)
        return {"rpc": {"session": self.session, "backends": backends}}

    def close(self) -> None:
        """Close every channel (the servers free this session's contexts and graphs), the servers told
        together."""
        for endpoint in self.endpoints.values():
            endpoint.begin_close()
        for endpoint in self.endpoints.values():
            endpoint.close()
