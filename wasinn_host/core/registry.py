"""The process-wide model registry: preloaded names, loaded models, reference counts.

A model is identified by its file (or content hash, for guest bytes) and its load-time
:class:`ModelParams`; every Store and execution context asking for the same pair shares
one :class:`LoadedModel` (weights in memory once, one worker thread).  Preloaded names
load lazily on the first ``load_by_name`` and then stay loaded while unused, so guests
that come and go never pay for a reload; at most ``max_idle_models`` unused ones are kept
(least recently used go first), and unused ones are also freed when a new model needs
their share of ``max_kv_bytes``.  Models loaded from guest bytes are freed with their
last user.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, ClassVar, Iterable

from . import heap_trim
from .config.kv_sizing import MAX_SEQUENCES, grown_layout, kv_layout
from .config.kv_types import cache_layout
from .config.limits import physical_memory
from .config.model_path import check_model_path
from .config.params import ModelParams
from .config.preload import Preload, parse_preload
from .errors import ErrorKind, WasiNNError
from .prompt_cache.cache import PromptCache, model_identity
from .runtime import MAX_DEFAULT_CTX, KvLayout, Model, Runtime
from .scheduling.context_growth import Growth, spare_core
from .scheduling.scheduler import WARM_CONTEXTS, ModelWorker

log = logging.getLogger("wasinn_host")

__all__ = ["MAX_SEQUENCES", "LoadedModel", "ModelRegistry", "default_registry", "grown_layout", "kv_layout"]

GGUF_MAGIC = b"GGUF"


@dataclass(eq=False)
class LoadedModel:
    """Weights, a multi-sequence inference context and the worker thread that drives it."""

    key: tuple[object, ...]
    label: str
    params: ModelParams
    weights: Model
    worker: ModelWorker
    keep_loaded: bool
    name: str | None = None
    path: Path | None = None
    refs: int = 0
    last_used: float = field(default_factory=time.monotonic)
    stale: bool = False
    """Replaced by a hot swap: running contexts finish on it, new loads get the new model."""
    loaded_at: float = field(default_factory=time.time)

    @property
    def n_ctx_seq(self) -> int:
        """Tokens each execution context may hold."""
        return self.worker.n_ctx_seq


def _projector(preload: Preload, asked: str, from_guest: bool) -> str:
    """The projector file for a load of ``preload``.

    With a projector configured by the host, that one, whether or not the guest's ``mmproj`` key names
    it (a key naming another file is refused: the host fixed it).  Without one, the file the guest
    named inside its preopened directories (``from_guest``: the front end resolved it, as WasmEdge's
    command lines expect: ``--dir .:. --env mmproj=mmproj.gguf``); any other key is refused, since a
    guest never chooses a host file it was not given.
    """
    configured = preload.mmproj
    if asked and configured is None and from_guest:
        if not Path(asked).is_file():
            raise WasiNNError(
                ErrorKind.MODEL_NOT_FOUND, f"projector file {asked!r} for {preload.name!r} does not exist"
            )
        return asked
    names = (str(configured), configured.name) if configured is not None else ()
    same_file = configured is not None and from_guest and Path(asked).resolve() == configured.resolve()
    if asked and asked not in names and not same_file:
        shown = configured.name if configured is not None else "none"
        log.warning(
            "model %s: config key 'mmproj' %r refused: %s",
            preload.name,
            asked,
            f"the host configured {shown} for this name"
            if configured is not None
            else "it is not a file inside the guest's preopened directories (--dir)",
        )
        raise WasiNNError(
            ErrorKind.INVALID_ARGUMENT,
            f"config key 'mmproj': {asked!r} is not the projector configured for {preload.name!r} ({shown})"
            if configured is not None
            else f"config key 'mmproj': {asked!r} is not a file inside the guest's preopened directories; map "
            f"its directory with --dir (or configure the projector with --nn-mmproj {preload.name}:PATH)",
        )
    if configured is not None and not configured.is_file():
        raise WasiNNError(
            ErrorKind.MODEL_NOT_FOUND, f"projector file {str(configured)!r} for {preload.name!r} does not exist"
        )
    return str(configured) if configured is not None else ""


def _open_model(
    runtime: Runtime,
    path: Path,
    params: ModelParams,
    label: str,
    key: tuple[object, ...],
    keep: bool,
    make_room: Callable[[int], int],
    prompt_cache: PromptCache | None = None,
    expected: int = 0,
) -> LoadedModel:
    started = time.perf_counter()
    cache = None
    if prompt_cache is not None:  # before loading: the identity is the file as it is now
        try:
            identity = model_identity(str(key[0]), str(key[1]), runtime.commit, cache_layout(params))
            cache = prompt_cache.for_model(identity)
        except OSError:  # the file went away: the load below says so
            cache = None
    weights = runtime.load_model(path, params)
    try:
        n_ctx_seq = params.ctx_size or min(weights.n_ctx_train or MAX_DEFAULT_CTX, MAX_DEFAULT_CTX)
        cell_bytes = runtime.kv_cache_bytes(weights, 1, params)
        layout = kv_layout(params, n_ctx_seq, cell_bytes, make_room, label, expected)
        context = runtime.new_context(weights, params, layout)
        heap_trim.trim_heap()  # what the load freed (the vocabulary's working memory) goes back to the system
    except BaseException:
        weights.close()
        raise

    def grow(wanted: int) -> Growth | None:
        bigger = grown_layout(params, KvLayout(n_ctx_seq, worker.context.n_seq), wanted, cell_bytes, make_room)
        if bigger is None:
            return None
        # beside the running context (whose bytes the room counts) if the budget holds both as it is (no
        # idle model is freed for that: make_room(0) frees none) and a core is free to make it on
        beside = make_room(0) >= bigger.n_cells * cell_bytes and spare_core(worker.context)
        return Growth(functools.partial(runtime.new_context, weights, params, bigger), beside)

    worker = ModelWorker(
        weights,
        context,
        label,
        grow=None if params.n_parallel else grow,
        prompt_cache=cache,
        prefill_step_budget=params.prefill_step_budget,
        logits_rows=params.decode_logits_rows,
        warm_contexts=max(WARM_CONTEXTS, min(expected, layout.n_seq)),
    )
    log.info(
        "loaded model %s from %s in %.0f ms (%s; %d sequences x %d tokens%s; %d threads)",
        label,
        path,
        (time.perf_counter() - started) * 1000,
        weights.description,
        layout.n_seq,
        n_ctx_seq,
        ", more when more contexts compute at once" if not params.n_parallel else "",
        context.threads,
    )
    return LoadedModel(key, label, params, weights, worker, keep, path=path)


class ModelRegistry:
    """Name → model table shared by every Store of a process (thread-safe).

    ``runtime`` loads the models (default: :attr:`default_runtime`'s, llama.cpp's); ``max_idle_models``
    unused models stay loaded for the next user.  The KV budget of a load is the caller's
    ``Limits.max_kv_bytes``.  ``prompt_cache`` keeps prompt prefixes on disk for models loaded from then
    on (settable later).
    """

    default_runtime: ClassVar[Callable[[], Runtime] | None] = None
    """Makes the runtime of a registry given none.  The core knows no backend: :mod:`wasinn_host.backend.local`
    sets llama.cpp's here (importing ``wasinn_host`` imports it), which loads llama.cpp on first call."""

    def __init__(
        self,
        preloads: Iterable[Preload | str] = (),
        *,
        runtime: Runtime | None = None,
        max_idle_models: int = 4,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        if runtime is None:
            if ModelRegistry.default_runtime is None:
                raise RuntimeError("ModelRegistry: no runtime given and no default runtime set")
            runtime = ModelRegistry.default_runtime()
        self.runtime: Runtime = runtime
        self.max_idle_models = max_idle_models
        self.prompt_cache = prompt_cache
        self.expected_sequences = 0
        """Contexts expected to compute at once (``wasinn run --instances N`` sets it): a model loaded from
        then on starts with room for that many sequences (:func:`~.config.kv_sizing.kv_layout`), so the
        guests arriving together never wait for its context to grow."""
        self._lock = threading.RLock()
        self._preloads: dict[str, Preload] = {}
        self._models: dict[tuple[object, ...], LoadedModel] = {}
        self._rejected: dict[str, str] = {}  # sha256 of guest bytes -> why they were refused
        for spec in preloads:
            self.add_preload(spec)

    # -- preloads ------------------------------------------------------------------

    def add_preload(self, spec: Preload | str) -> Preload:
        """Register a name (``Preload`` or ``NAME:ENCODING:TARGET:PATH``); the file is opened lazily."""
        preload = parse_preload(spec) if isinstance(spec, str) else spec
        with self._lock:
            self._preloads[preload.name] = preload
        return preload

    def preloads(self) -> dict[str, Preload]:
        """A copy of the preload table."""
        with self._lock:
            return dict(self._preloads)

    def has_preload(self, name: str) -> bool:
        """Whether ``name`` is preloaded."""
        with self._lock:
            return name in self._preloads

    # -- loading -------------------------------------------------------------------

    def acquire_named(self, name: str, params: ModelParams, kv_budget: int = 0) -> LoadedModel:
        """The model served under ``name`` with these load-time parameters (loaded if needed).

        A new load must fit its KV cache within ``kv_budget`` bytes for all models together
        (0: half the machine's memory), freeing idle models if that makes room.
        """
        with self._lock:
            preload = self._preloads.get(name)
        if preload is None:
            raise WasiNNError(
                ErrorKind.NOT_FOUND,
                f"model name {name!r} is not preloaded; known names: {', '.join(sorted(self.preloads())) or '(none)'}",
            )
        # the file checks ask the file system, which lets other threads take the interpreter: done outside
        # the lock, so that guests starting together do not queue behind one waiting to run again (seen:
        # 8 guests' contexts opened 11-23 ms after their models, each waiting for the lock)
        if params.target is None:  # load_by_name carries no target: the preload's applies
            params = replace(params, target=preload.target)
        params = replace(
            params, mmproj=_projector(preload, params.mmproj, params.mmproj_from_guest), mmproj_from_guest=False
        )
        path = preload.path
        check_model_path(path, f" for name {name!r}")
        key = ("file", str(path.resolve()), params)
        with self._lock:
            model = self._models.get(key)
            if model is None:
                model = _open_model(
                    self.runtime,
                    path,
                    params,
                    name,
                    key,
                    keep=True,
                    make_room=functools.partial(self._make_room, kv_budget),
                    prompt_cache=self.prompt_cache,
                    expected=self.expected_sequences,
                )
                model.name = name
                self._models[key] = model
            model.refs += 1
            return model

    def acquire_bytes(self, data: bytes, params: ModelParams, kv_budget: int = 0) -> LoadedModel:
        """A model from GGUF bytes a guest sent; identical bytes share one model.  No file is left behind."""
        if params.mmproj:
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                "load: config key 'mmproj' is refused for models sent as bytes; a projector is served only "
                "with a preloaded name the host configured it for",
            )
        if not data.startswith(GGUF_MAGIC):
            raise WasiNNError(
                ErrorKind.INVALID_ARGUMENT,
                f"load: builders[0] is not a GGUF model (starts with {data[:4]!r}, expected {GGUF_MAGIC!r})",
            )
        digest = hashlib.sha256(data).hexdigest()
        key = ("bytes", digest, params)
        with self._lock:
            if digest in self._rejected:
                raise WasiNNError(ErrorKind.INVALID_ARGUMENT, self._rejected[digest])
            model = self._models.get(key)
            if model is None:
                fd, name = tempfile.mkstemp(prefix="wasinn-", suffix=".gguf")
                try:
                    with os.fdopen(fd, "wb") as handle:
                        handle.write(data)
                    try:
                        self.runtime.check_model_file(Path(name))  # untrusted bytes: llama.cpp may abort on some
                    except WasiNNError as err:
                        if len(self._rejected) < 1024:
                            self._rejected[digest] = err.message
                        raise
                    model = _open_model(
                        self.runtime,
                        Path(name),
                        params,
                        f"bytes:{digest[:12]}",
                        key,
                        keep=False,
                        make_room=functools.partial(self._make_room, kv_budget),
                        prompt_cache=self.prompt_cache,
                        expected=self.expected_sequences,
                    )
                finally:
                    os.unlink(name)
                self._models[key] = model
            model.refs += 1
            return model

    def _make_room(self, budget: int, kv_bytes: int) -> int:
        """Free idle models, least recently used first, until ``kv_bytes`` fit in ``budget``; return the room left."""
        budget = budget or physical_memory() // 2
        with self._lock:  # a worker growing its context calls this from its own thread
            return self._make_room_locked(budget, kv_bytes)

    def _make_room_locked(self, budget: int, kv_bytes: int) -> int:

        def room() -> int:
            return budget - sum(m.worker.context.kv_bytes for m in self._models.values())

        for model in sorted(self._idle_models(), key=lambda m: m.last_used):
            if room() >= kv_bytes:
                break
            self._evict(model)
        return room()

    def _idle_models(self) -> list[LoadedModel]:
        return [m for m in self._models.values() if m.refs <= 0]

    def _evict(self, model: LoadedModel) -> None:
        if self._models.get(model.key) is model:
            del self._models[model.key]
        self._close(model)

    def retain(self, model: LoadedModel) -> None:
        """Add a reference to a model already acquired."""
        with self._lock:
            model.refs += 1

    def release(self, model: LoadedModel) -> None:
        """Drop one reference; models from guest bytes are freed with their last reference."""
        with self._lock:
            model.refs -= 1
            model.last_used = time.monotonic()
            if model.refs > 0:
                return
            if model.keep_loaded:  # stays warm for the next guest, within max_idle_models
                idle = sorted(self._idle_models(), key=lambda m: m.last_used)
                for old in idle[: max(0, len(idle) - self.max_idle_models)]:
                    self._evict(old)
                return
            if self._models.get(model.key) is model:
                del self._models[model.key]
        self._close(model)

    def swap(self, name: str, path: str | os.PathLike[str] | None = None) -> Preload:
        """Hot swap: serve ``name`` from ``path`` (or re-read its file) for every new load.

        Models already loaded under the name are marked stale: contexts using them finish
        their work there, and each is freed when its last user lets go.  No request fails.
        """
        with self._lock:
            old = self._preloads.get(name)
            if old is None:
                raise WasiNNError(ErrorKind.NOT_FOUND, f"model name {name!r} is not preloaded")
            new_path = Path(path) if path is not None else old.path
            preload = Preload(name, new_path, old.encoding, old.target, old.mmproj)
            check_model_path(preload.path)
            self._preloads[name] = preload
            idle = []
            for key, model in list(self._models.items()):
                if model.name == name:
                    model.stale = True
                    model.keep_loaded = False
                    del self._models[key]
                    if model.refs <= 0:
                        idle.append(model)
        for model in idle:
            self._close(model)
        log.info("model name %s now serves %s; %d idle old model(s) freed", name, preload.path, len(idle))
        return preload

    def loaded(self) -> list[LoadedModel]:
        """The models in memory now."""
        with self._lock:
            return list(self._models.values())

    def unload_unused(self) -> int:
        """Free every model nobody uses (preloaded names load again on demand); return how many."""
        with self._lock:
            idle = [m for m in self._models.values() if m.refs <= 0]
            for model in idle:
                del self._models[model.key]
        for model in idle:
            self._close(model)
        return len(idle)

    def close(self) -> None:
        """Free every model (at shutdown)."""
        with self._lock:
            models = list(self._models.values())
            self._models.clear()
        for model in models:
            self._close(model)
        if self.prompt_cache is not None:
            self.prompt_cache.flush()  # the states saved by this run reach the disk before exit

    @staticmethod
    def _close(model: LoadedModel) -> None:
        model.worker.close()
        model.weights.close()
        log.info("freed model %s", model.label)


_default: ModelRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> ModelRegistry:
    """The registry shared by every :class:`~wasinn_host.WasiNN` that is not given its own."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ModelRegistry()
        return _default
