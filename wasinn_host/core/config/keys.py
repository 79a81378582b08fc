"""Configuration JSON (WasmEdge's GGML key names) turned into typed parameter records.

The same parser serves ``load_by_name_with_config``, ``load``'s second builder and a
metadata ``set_input`` (index 1).  Rules, as in WasmEdge: invalid JSON is an invalid
encoding; a known key with the wrong JSON type an invalid argument; unknown keys are ignored.
In addition, numbers are range-checked (invalid argument) and each rejection names the key, the value and
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

from ..errors import ErrorKind, WasiNNError, invalid
from ..prompt_cache.cache import valid_entry_name
from .kv_types import ACCEPTED as KV_TYPES_ACCEPTED
from .kv_types import is_kv_type, kv_type
from .params import (  # noqa: F401
    DEFAULT_SEED,
    MAX_STREAM_INTERVAL,
    POOLING_RANK,
    SPEC_TYPES,
    ContextParams,
    ModelParams,
    PromptOptions,
    SamplingParams,
    StopParams,
)
from .preload import Target

log = logging.getLogger("wasinn_host")

Check = Callable[[Any], bool]


@dataclass(frozen=True)
class KeySpec:
    """One accepted configuration key."""

    name: str
    kind: type
    record: str  # "model", "sampling", "stopping", "options" or "logging"
    field: str
    check: Check | None = None
    accepted: str = ""
    clamp_min: float | None = None
    convert: Callable[[Any], Any] | None = None
    """Turns another accepted form of the value into the record's (before the type check)."""


def _at_least(low: float) -> Check:
    return lambda v: v >= low


def _between(low: float, high: float) -> Check:
    return lambda v: low <= v <= high


def _one_of(*values: str) -> Check:
    return lambda v: v in values


def _prob(name: str, record: str, field: str) -> KeySpec:
    return KeySpec(name, float, record, field, _between(0.0, 1.0), "0.0 to 1.0")


_KEYS: tuple[KeySpec, ...] = (
    # load-time (model) keys
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
        "flash-attn",
        str,
        "model",
        "flash_attn",
        _one_of("on", "enabled", "off", "disabled", "auto"),
        "on, enabled, off, disabled or auto",
    ),
    KeySpec(
        "prefill-step-budget",
        float,
        "model",
        "prefill_step_budget",
        lambda v: v == 0 or 1.0 <= v <= 1000.0,
        "0 (off) or 1 to 1000 (times a decode step)",
    ),
    KeySpec("decode-logits-rows", int, "model", "decode_logits_rows", _between(0, 1 << 20), "0 (no cap) to 1048576"),
    KeySpec("mmproj", str, "model", "mmproj"),
    KeySpec("reranking", bool, "model", "reranking"),
    KeySpec(
        "pooling-type", int, "model", "pooling_type", _between(-1, 4), "-1 (model) to 4: none, mean, cls, last, rank"
    ),
    KeySpec("attention-type", int, "model", "attention_type", _between(-1, 1), "-1 (model), 0 causal, 1 non-causal"),
    KeySpec(
        "rope-scaling-type",
        int,
        "model",
        "rope_scaling_type",
        _between(-1, 3),
        "-1 (model), 0 none, 1 linear, 2 yarn, 3 longrope",
    ),
    KeySpec("rope-freq-base", float, "model", "rope_freq_base", _at_least(0.0), ">= 0.0 (0 = the model's)"),
    KeySpec("rope-freq-scale", float, "model", "rope_freq_scale", _at_least(0.0), ">= 0.0 (0 = the model's)"),
    KeySpec("yarn-ext-factor", float, "model", "yarn_ext_factor"),
    KeySpec("yarn-attn-factor", float, "model", "yarn_attn_factor"),
    KeySpec("yarn-beta-fast", float, "model", "yarn_beta_fast"),
    KeySpec("yarn-beta-slow", float, "model", "yarn_beta_slow"),
    KeySpec("yarn-orig-ctx", int, "model", "yarn_orig_ctx", _between(0, 1 << 24), "0 (the model's) to 16777216"),
    KeySpec("cpu-moe", bool, "model", "cpu_moe"),
    KeySpec("n-cpu-moe", int, "model", "n_cpu_moe", _between(0, 4096), "0 to 4096 (layers)"),
    KeySpec(
        "tensor-split",
        str,
        "model",
        "tensor_split",
        lambda v: parse_tensor_split(v) is not None,
        'comma-separated proportions >= 0, one per GPU ("3,2")',
    ),
    KeySpec("split-mode", str, "model", "split_mode", _one_of("none", "layer", "row"), "none, layer or row"),
    KeySpec("no-kv-offload", bool, "model", "no_kv_offload"),
    KeySpec("tts", bool, "model", "tts"),
    KeySpec("model-vocoder", str, "model", "vocoder"),
    KeySpec("type-k", str, "model", "type_k", is_kv_type, KV_TYPES_ACCEPTED, convert=kv_type),
    KeySpec("type-v", str, "model", "type_v", is_kv_type, KV_TYPES_ACCEPTED, convert=kv_type),
    # sampling
    KeySpec("temp", float, "sampling", "temp", clamp_min=0.0),
    KeySpec("dynatemp-range", float, "sampling", "dynatemp_range", _at_least(0.0), ">= 0.0"),
    KeySpec("dynatemp-exponent", float, "sampling", "dynatemp_exponent", _at_least(0.0), ">= 0.0"),
    KeySpec("top-k", int, "sampling", "top_k", _at_least(0), ">= 0 (0 = off)"),
    KeySpec("top-p", float, "sampling", "top_p", _between(0.0, 1.0), "0.0 to 1.0", clamp_min=0.0),
    _prob("min-p", "sampling", "min_p"),
    _prob("typ-p", "sampling", "typ_p"),
    _prob("xtc-probability", "sampling", "xtc_probability"),
    _prob("xtc-threshold", "sampling", "xtc_threshold"),
    KeySpec("mirostat", int, "sampling", "mirostat", _between(0, 2), "0 (off), 1 or 2"),
    KeySpec("mirostat-eta", float, "sampling", "mirostat_eta", _at_least(0.0), ">= 0.0"),
    KeySpec("mirostat-ent", float, "sampling", "mirostat_ent", _at_least(0.0), ">= 0.0"),
    KeySpec("repeat-penalty", float, "sampling", "repeat_penalty", clamp_min=0.0),
    KeySpec("presence-penalty", float, "sampling", "presence_penalty", clamp_min=0.0),
    KeySpec("frequency-penalty", float, "sampling", "frequency_penalty", clamp_min=0.0),
    KeySpec("last-n-penalty", int, "sampling", "last_n_penalty", _at_least(-1), ">= -1 (-1 = context size)"),
    KeySpec("dry-multiplier", float, "sampling", "dry_multiplier", _at_least(0.0), ">= 0.0 (0 = off)"),
    KeySpec("dry-base", float, "sampling", "dry_base", _at_least(1.0), ">= 1.0"),
    KeySpec("dry-allowed-length", int, "sampling", "dry_allowed_length", _at_least(0), ">= 0"),
    KeySpec("dry-last-n", int, "sampling", "dry_last_n", _at_least(-1), ">= -1 (-1 = context size)"),
    KeySpec("dry-sequence-breakers", list, "sampling", "dry_sequence_breakers"),
    KeySpec("min-keep", int, "sampling", "min_keep", _between(0, 1 << 20), "0 to 1048576"),
    KeySpec(
        "seed", int, "sampling", "seed", _between(0, DEFAULT_SEED), f"0 to {DEFAULT_SEED} ({DEFAULT_SEED} = random)"
    ),
    KeySpec("logit-bias", dict, "sampling", "logit_bias"),
    KeySpec("grammar", str, "sampling", "grammar"),
    KeySpec("json-schema", str, "sampling", "json_schema"),
    KeySpec("grammar-first", bool, "sampling", "grammar_first"),
    KeySpec("n-probs", int, "sampling", "n_probs", _between(0, 100), "0 to 100"),
    KeySpec("top-n-sigma", float, "sampling", "top_n_sigma"),
    KeySpec("n-prev", int, "sampling", "n_prev", _between(0, 1 << 20), "0 to 1048576"),
    # stop rules
    KeySpec("n-predict", int, "stopping", "n_predict", _at_least(-(2**63)), "any integer (< 0 = unlimited)"),
    KeySpec("reverse-prompt", str, "stopping", "reverse_prompt"),
    KeySpec("stop", list, "stopping", "stop"),
    KeySpec("max-time-ms", int, "stopping", "max_time_ms", _at_least(0), ">= 0 (0 = no limit)"),
    KeySpec("ignore-eos", bool, "stopping", "ignore_eos"),
    KeySpec("stream-stdout", bool, "stopping", "stream_stdout"),
    # prompt handling and scheduling
    KeySpec("chat-template", object, "options", "chat_template"),
    KeySpec("cache-prompt", bool, "options", "cache_prompt"),
    KeySpec("ctx-shift", bool, "options", "ctx_shift"),
    KeySpec("n-keep", int, "options", "n_keep", _at_least(-1), ">= -1 (-1 = the whole prompt)"),
    KeySpec("priority", int, "options", "priority", _between(-100, 100), "-100 to 100 (higher runs first)"),
    KeySpec(
        "queue-timeout-ms", int, "options", "queue_timeout_ms", _at_least(-1), ">= -1 (-1 = host default, 0 = none)"
    ),
    KeySpec(
        "stream-interval",
        int,
        "options",
        "stream_interval",
        _between(1, MAX_STREAM_INTERVAL),
        f"1 to {MAX_STREAM_INTERVAL} (tokens a streaming guest is woken for at once)",
    ),
    KeySpec(
        "embd-normalize",
        int,
        "options",
        "embd_normalize",
        _at_least(-1),
        ">= -1 (-1 none, 0 max-abs, 1 taxicab, 2 L2, >2 p-norm)",
    ),
    KeySpec("image", str, "options", "image"),
    KeySpec("always-regenerate-image-embd", bool, "options", "always_regenerate_image_embd"),
    KeySpec("tts-output-file", str, "options", "tts_output_file"),
    KeySpec("tts-speaker-file", str, "options", "tts_speaker_file"),
    KeySpec("spec-type", str, "options", "spec_type", _one_of(*SPEC_TYPES), " or ".join(SPEC_TYPES)),
    KeySpec("draft-max", int, "options", "draft_max", _between(0, 1024), "0 to 1024"),
    KeySpec("draft-min", int, "options", "draft_min", _between(0, 1024), "0 to 1024"),
    _prob("draft-p-min", "options", "draft_p_min"),
    KeySpec("spec-ngram-size-n", int, "options", "spec_ngram_size_n", _between(1, 1024), "1 to 1024"),
    KeySpec("spec-ngram-size-m", int, "options", "spec_ngram_size_m", _between(1, 1024), "1 to 1024"),
    KeySpec(
        "path-prompt-cache",
        str,
        "options",
        "path_prompt_cache",
        valid_entry_name,
        "a relative name inside the host's --nn-prompt-cache directory (no '..', not absolute)",
    ),
    # logging
    KeySpec("enable-log", bool, "logging", "enable_log"),
    KeySpec("enable-debug-log", bool, "logging", "enable_debug_log"),
)
KEYS: Mapping[str, KeySpec] = {spec.name: spec for spec in _KEYS}
MODEL_KEY_NAMES: Mapping[str, str] = {spec.field: spec.name for spec in _KEYS if spec.record == "model"}


# Other spellings of the same keys: the original wasi_nn_backend design's names (after
# "_" -> "-"), llama.cpp server names (``speculative.n_max`` as its request field), WasmEdge's names
# and misspelling.
ALIASES: Mapping[str, str] = {
    "temperature": "temp",
    "penalty-last-n": "last-n-penalty",
    "repeat-last-n": "last-n-penalty",
    "penalty-repeat": "repeat-penalty",
    "penalty-present": "presence-penalty",
    "penalty-freq": "frequency-penalty",
    "typical-p": "typ-p",
    "mirostat-tau": "mirostat-ent",
    "dry-multipier": "dry-multiplier",
    "dry-penalty-last-n": "dry-last-n",
    "dry-last-n-penalty": "dry-last-n",
    "max-tokens": "n-predict",
    "n-ctx": "ctx-size",
    "n-threads": "threads",
    "n-batch": "batch-size",
    "n-ubatch": "ubatch-size",
    "context-shifting": "ctx-shift",
    "context-shift": "ctx-shift",
    "embeddings": "embedding",
    "cache-type-k": "type-k",
    "cache-type-v": "type-v",
    "draft": "draft-max",
    "draft-n": "draft-max",
    "draft-n-min": "draft-min",
    "speculative.n-max": "draft-max",
    "speculative.n-min": "draft-min",
    "speculative.p-min": "draft-p-min",
    "n-max-speculative": "draft-max",
    "n-min-speculative": "draft-min",
    "p-min-speculative": "draft-p-min",
}
# The nested form: {"sampling": {...}, "stopping": {...}, "memory": {...}}
SECTIONS = ("sampling", "stopping", "memory", "model")

_RECORDS = ("model", "sampling", "stopping", "options", "logging")


@dataclass(frozen=True)
class ParsedConfig:
    """The recognised keys of one configuration JSON, grouped by record (field name -> value)."""

    model: Mapping[str, Any]
    sampling: Mapping[str, Any]
    stopping: Mapping[str, Any]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    logging: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    source: bytes = dataclasses.field(default=b"", compare=False)
    """The JSON text these keys were parsed from (a remote backend forwards it as sent)."""

    def apply_model(self, params: ModelParams) -> ModelParams:
        """``params`` with this config's load-time keys applied."""
        return dataclasses.replace(params, **self.model) if self.model else params

    def with_target(self, target: Target) -> ParsedConfig:
        """The config with the execution target a caller passed to ``load`` (a load-time parameter)."""
        return dataclasses.replace(self, model={**self.model, "target": target})

    def apply_context(self, params: ContextParams) -> ContextParams:
        """``params`` with this config's sampling, stop and prompt keys applied."""
        sampling = dataclasses.replace(params.sampling, **self.sampling) if self.sampling else params.sampling
        stopping = dataclasses.replace(params.stopping, **self.stopping) if self.stopping else params.stopping
        options = dataclasses.replace(params.options, **self.options) if self.options else params.options
        return ContextParams(sampling, stopping, options)


EMPTY_CONFIG = ParsedConfig({}, {}, {})


def as_json(value: Any) -> str:
    """A value as JSON writes it (``false``, ``"x"``), for messages; ``repr`` if it is not JSON."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_EXPECTED = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list: "an array of strings",
    dict: "an object of token id -> bias",
    object: "true, false or a template string",
}


def _type_ok(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind is dict:
        return isinstance(value, (dict, list))
    if kind is object:
        return isinstance(value, (bool, str))
    return isinstance(value, str)


def _logit_bias(name: str, value: Any) -> tuple[tuple[int, float], ...]:
    """``{"15": -1.5}`` or ``[[15, -1.5]]`` to ((15, -1.5),); false/-inf bans a token."""
    pairs = value.items() if isinstance(value, dict) else value
    out = []
    for pair in pairs:
        try:
            token, bias = pair
            token_id = int(token)
            if bias is False:
                bias = -math.inf
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or token_id < 0:
                raise ValueError
        except (TypeError, ValueError):
            raise invalid(
                f"config key {name!r}: entry {as_json(pair)} is not accepted; expected "
                f"token id (integer >= 0) -> bias (number, or false to ban the token)"
            ) from None
        out.append((token_id, float(bias)))
    return tuple(out)


def _coerce(spec: KeySpec, value: Any) -> Any:
    """Check one value's JSON type and range; return it as the record's Python type."""
    if spec.convert is not None:
        value = spec.convert(value)
    if not _type_ok(spec.kind, value):
        raise invalid(
            f"config key {spec.name!r}: got {json_type(value)} {as_json(value)}; expected {_EXPECTED[spec.kind]}"
        )
    if spec.kind is float:
        if not math.isfinite(value):
            raise invalid(f"config key {spec.name!r}: {as_json(value)} is not finite; expected a finite number")
        value = float(value)
    elif spec.kind is list:
        value = tuple(value)
    elif spec.kind is dict:
        return _logit_bias(spec.name, value)
    if spec.clamp_min is not None and value < spec.clamp_min:
        value = spec.clamp_min
    if spec.check is not None and not spec.check(value):
        raise invalid(f"config key {spec.name!r}: {as_json(value)} is out of range; accepted: {spec.accepted}")
    return value


def canonical_key(key: str) -> str:
    """A key in WasmEdge's spelling: ``_`` becomes ``-`` and known aliases are resolved."""
    key = key.replace("_", "-")
    return ALIASES.get(key, key)


def _flatten(doc: Mapping[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in doc.items():
        if key in SECTIONS and isinstance(value, dict):
            items.extend((canonical_key(k), v) for k, v in value.items())
        elif key in SECTIONS:
            raise invalid(f"config key {key!r}: got {json_type(value)}; expected an object of {key} keys")
        else:
            items.append((canonical_key(key), value))
    return items


def parse_config(text: bytes | str) -> ParsedConfig:
    """Parse configuration JSON; bad JSON is an invalid encoding, bad values an invalid argument."""
    if isinstance(text, str):
        text = text.encode()
    if not text.strip():
        return EMPTY_CONFIG
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise WasiNNError(ErrorKind.INVALID_ENCODING, f"config is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WasiNNError(ErrorKind.INVALID_ENCODING, f"config must be a JSON object, got {json_type(doc)}")
    groups: dict[str, dict[str, Any]] = {record: {} for record in _RECORDS}
    items = _flatten(doc)
    for key, value in items:
        spec = KEYS.get(key)
        if spec is None:  # every key WasmEdge's plugin reads is implemented; others are not WasmEdge's either
            continue
        groups[spec.record][spec.field] = _coerce(spec, value)
    model = groups["model"]
    if model.get("reranking"):  # as WasmEdge: a reranker is an embedding model with rank pooling
        model.update(embedding=True, pooling_type=POOLING_RANK)
    if "tensor_split" in model:
        model["tensor_split"] = parse_tensor_split(model["tensor_split"])
    sampling = groups["sampling"]
    if sampling.get("json_schema"):
        check_json_schema(sampling["json_schema"])
        sampling["grammar"] = ""  # the schema's grammar (the backend converts it) replaces the grammar
    else:
        sampling.pop("json_schema", None)  # "" leaves an earlier schema in force, as it always left its grammar
        if "grammar" in sampling:
            sampling["json_schema"] = ""  # a grammar replaces an earlier schema
    return ParsedConfig(**groups, source=text)


def parse_tensor_split(text: str) -> tuple[float, ...] | None:
    """``"3,2"`` (WasmEdge's and llama.cpp's ``--tensor-split``) as proportions; None if it is not a
    comma-separated list of finite numbers >= 0."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        return None
    return values if all(math.isfinite(v) and v >= 0.0 for v in values) else None


def check_json_schema(schema: str) -> None:
    """Refuse (invalid argument, with the reason) a ``json-schema`` that is not JSON.  The schema is kept as
    given: the backend turns it into the constraint it enforces (llama.cpp's backend: a GBNF grammar,
    which replaces ``grammar``) and refuses one it cannot convert when it checks the sampling parameters."""
    try:
        orjson.loads(schema)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"config key 'json-schema': not valid JSON: {exc}") from None
