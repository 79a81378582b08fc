"""Configuration JSON (WasmEdge's GGML key names) turned into typed parameter records.

The same parser serves ``load_by_name_with_config``, ``load``'s second builder and a
metadata ``set_input`` (index 1).  Rules, as in WasmEdge: invalid JSON is errno 2; a
known key with the wrong JSON type is errno 1; unknown keys are ignored.  In addition,
numbers are range-checked (errno 1) and each rejection names the key, the value and
what is accepted.

Keys have one of two scopes:

* ``model``: load-time parameters (context size, threads, GPU layers...).  They pick
  which loaded model instance serves a graph and are never applied by a metadata
  ``set_input`` (that would silently reload the model); a changed value there is
  logged and ignored.
* ``context``: sampling and stop rules, copied from the graph into each execution
  context and changed per context by a metadata ``set_input``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import orjson

from .errors import Errno, WasiNNError, invalid

log = logging.getLogger("wasinn_host")

DEFAULT_SEED = 0xFFFF_FFFF


@dataclass(frozen=True)
class ModelParams:
    """Load-time parameters: one llama.cpp model + context is created per distinct set."""

    n_gpu_layers: int = 0
    main_gpu: int = 0
    use_mmap: bool = True
    use_mlock: bool = False
    ctx_size: int = 0
    """Tokens per execution context (sequence); 0 = the model's training context, at most 4096."""
    batch_size: int = 2048
    ubatch_size: int = 512
    threads: int = 0
    """Generation threads; 0 = all CPU cores."""
    threads_batch: int = 0
    """Prompt-processing threads; 0 = same as ``threads``."""
    n_parallel: int = 4
    """Sequences decoded together (execution contexts that hold KV cache at once)."""
    embedding: bool = False
    flash_attn: str = "auto"


@dataclass(frozen=True)
class SamplingParams:
    """Per-context sampling parameters (llama.cpp sampler chain)."""

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    last_n_penalty: int = 64
    seed: int = DEFAULT_SEED

    @property
    def greedy(self) -> bool:
        """``temp <= 0`` means always take the most likely token."""
        return self.temp <= 0.0


@dataclass(frozen=True)
class StopParams:
    """Per-context stop rules and output options."""

    n_predict: int = -1
    reverse_prompt: str = ""
    ignore_eos: bool = False
    stream_stdout: bool = False


@dataclass(frozen=True)
class ContextParams:
    """Everything an execution context may change with a metadata ``set_input``."""

    sampling: SamplingParams = SamplingParams()
    stopping: StopParams = StopParams()


Check = Callable[[Any], bool]


@dataclass(frozen=True)
class KeySpec:
    """One accepted configuration key."""

    name: str
    kind: type
    record: str  # "model", "sampling" or "stopping"
    field: str
    check: Check | None = None
    accepted: str = ""
    clamp_min: float | None = None


def _at_least(low: float) -> Check:
    return lambda v: v >= low


def _between(low: float, high: float) -> Check:
    return lambda v: low <= v <= high


def _one_of(*values: str) -> Check:
    return lambda v: v in values


_KEYS: tuple[KeySpec, ...] = (
    KeySpec("n-gpu-layers", int, "model", "n_gpu_layers", _at_least(-1), ">= -1 (-1 = all)"),
    KeySpec("main-gpu", int, "model", "main_gpu", _at_least(0), ">= 0"),
    KeySpec("use-mmap", bool, "model", "use_mmap"),
    KeySpec("use-mlock", bool, "model", "use_mlock"),
    KeySpec("ctx-size", int, "model", "ctx_size", _between(0, 1 << 20), "0 (model default) to 1048576"),
    KeySpec("batch-size", int, "model", "batch_size", _between(1, 1 << 20), "1 to 1048576"),
    KeySpec("ubatch-size", int, "model", "ubatch_size", _between(1, 1 << 20), "1 to 1048576"),
    KeySpec("threads", int, "model", "threads", _between(-1, 1024), "-1 or 0 (all cores) to 1024"),
    KeySpec("threads-batch", int, "model", "threads_batch", _between(-1, 1024), "-1 or 0 (same as threads) to 1024"),
    KeySpec("n-parallel", int, "model", "n_parallel", _between(1, 256), "1 to 256"),
    KeySpec("embedding", bool, "model", "embedding"),
    KeySpec(
        "flash-attn", str, "model", "flash_attn",
        _one_of("on", "enabled", "off", "disabled", "auto"), "on, enabled, off, disabled or auto",
    ),
    KeySpec("temp", float, "sampling", "temp", clamp_min=0.0),
    KeySpec("top-k", int, "sampling", "top_k", _at_least(0), ">= 0 (0 = off)"),
    KeySpec("top-p", float, "sampling", "top_p", _between(0.0, 1.0), "0.0 to 1.0", clamp_min=0.0),
    KeySpec("min-p", float, "sampling", "min_p", _between(0.0, 1.0), "0.0 to 1.0"),
    KeySpec("repeat-penalty", float, "sampling", "repeat_penalty", clamp_min=0.0),
    KeySpec("presence-penalty", float, "sampling", "presence_penalty", clamp_min=0.0),
    KeySpec("frequency-penalty", float, "sampling", "frequency_penalty", clamp_min=0.0),
    KeySpec("last-n-penalty", int, "sampling", "last_n_penalty", _at_least(-1), ">= -1 (-1 = context size)"),
    KeySpec("seed", int, "sampling", "seed", _between(0, DEFAULT_SEED), f"0 to {DEFAULT_SEED} ({DEFAULT_SEED} = random)"),
    KeySpec("n-predict", int, "stopping", "n_predict", _at_least(-2**63), "any integer (< 0 = unlimited)"),
    KeySpec("reverse-prompt", str, "stopping", "reverse_prompt"),
    KeySpec("ignore-eos", bool, "stopping", "ignore_eos"),
    KeySpec("stream-stdout", bool, "stopping", "stream_stdout"),
)
KEYS: Mapping[str, KeySpec] = {spec.name: spec for spec in _KEYS}
MODEL_KEY_NAMES: Mapping[str, str] = {spec.field: spec.name for spec in _KEYS if spec.record == "model"}

# Keys WasmEdge's GGML plugin accepts that this host does not implement: warned once.
_NOT_IMPLEMENTED = frozenset(
    {
        "mmproj", "image", "always-regenerate-image-embd", "tensor-split", "split-mode",
        "cpu-moe", "n-cpu-moe", "grammar", "json-schema", "reranking", "embd-normalize",
        "pooling-type", "attention-type", "rope-scaling-type", "tts", "model-vocoder",
        "tts-output-file", "tts-speaker-file", "enable-log", "enable-debug-log",
    }
)
_warned: set[str] = set()


@dataclass(frozen=True)
class ParsedConfig:
    """The recognised keys of one configuration JSON, grouped by record."""

    model: Mapping[str, Any]
    sampling: Mapping[str, Any]
    stopping: Mapping[str, Any]

    def apply_model(self, params: ModelParams) -> ModelParams:
        """``params`` with this config's load-time keys applied."""
        return dataclasses.replace(params, **self.model) if self.model else params

    def apply_context(self, params: ContextParams) -> ContextParams:
        """``params`` with this config's sampling and stop keys applied."""
        sampling = dataclasses.replace(params.sampling, **self.sampling) if self.sampling else params.sampling
        stopping = dataclasses.replace(params.stopping, **self.stopping) if self.stopping else params.stopping
        return ContextParams(sampling, stopping)


EMPTY_CONFIG = ParsedConfig({}, {}, {})


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _coerce(spec: KeySpec, value: Any) -> Any:
    """Check one value's JSON type and range; return it as the record's Python type."""
    expected = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[spec.kind]
    if spec.kind is bool:
        ok = isinstance(value, bool)
    elif spec.kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif spec.kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise invalid(f"config key {spec.name!r}: {value!r} is not finite; expected a finite number")
    else:
        ok = isinstance(value, str)
    if not ok:
        raise invalid(f"config key {spec.name!r}: got {_json_type(value)} {value!r}; expected {expected}")
    if spec.kind is float:
        value = float(value)
    if spec.clamp_min is not None and value < spec.clamp_min:
        value = spec.clamp_min
    if spec.check is not None and not spec.check(value):
        raise invalid(f"config key {spec.name!r}: {value!r} is out of range; accepted: {spec.accepted}")
    return value


def parse_config(text: bytes | str) -> ParsedConfig:
    """Parse configuration JSON; raise errno 2 for bad JSON and errno 1 for bad values."""
    if isinstance(text, str):
        text = text.encode()
    if not text.strip():
        return EMPTY_CONFIG
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise WasiNNError(Errno.INVALID_ENCODING, f"config is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WasiNNError(Errno.INVALID_ENCODING, f"config must be a JSON object, got {_json_type(doc)}")
    groups: dict[str, dict[str, Any]] = {"model": {}, "sampling": {}, "stopping": {}}
    for key, value in doc.items():
        spec = KEYS.get(key)
        if spec is None:
            if key in _NOT_IMPLEMENTED and key not in _warned:
                _warned.add(key)
                log.warning("config key %r is not implemented by wasinn-host and is ignored", key)
            continue
        groups[spec.record][spec.field] = _coerce(spec, value)
    return ParsedConfig(groups["model"], groups["sampling"], groups["stopping"])
