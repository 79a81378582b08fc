"""How named tensors carry an LLM request and its answer (the README's "Components" section).

Inputs of ``compute``:

* the prompt: the U8 tensor named ``prompt``, or else the only U8 input that is not one of the
  two below;
* ``metadata`` (optional, U8): configuration JSON with any of this host's keys, applied to the
  execution context as a ``set_input`` metadata tensor is for a core module;
* ``options`` (optional, U8): Hayride's JSON (``temperature``, ``num_context``, ``num_batch``,
  ``max_predict``, ``top_k``, ``top_p``, ``seed``; zero means "default" for all but the two
  floats, as in Hayride), translated to this host's keys; other keys in it are read as ours.

Outputs: ``output`` (the text as U8, or an embedding model's vector as FP32) and ``metadata``
(the same JSON as a core module's ``get_output`` index 1).  A request that used ``options`` is
Hayride's, whose guests expect exactly one output: it gets the single tensor ``Output``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from ..core.config.keys import EMPTY_CONFIG, ParsedConfig, parse_config
from ..core.config.limits import Limits
from ..core.errors import ErrorKind, WasiNNError, invalid
from .tensors import HostTensor

PROMPT = "prompt"
METADATA = "metadata"
OPTIONS = "options"
OUTPUT = "output"
HAYRIDE_OUTPUT = "Output"

# Hayride's option -> this host's key, and whether 0 means "not set"
HAYRIDE_KEYS: dict[str, tuple[str, bool]] = {
    "temperature": ("temp", False),
    "top_p": ("top-p", False),
    "top_k": ("top-k", True),
    "seed": ("seed", True),
    "max_predict": ("n-predict", True),
    "num_context": ("ctx-size", True),
    "num_batch": ("batch-size", True),
}


@dataclass(frozen=True)
class LlmRequest:
    """What one ``compute`` asks for."""

    prompt: bytes
    config: ParsedConfig | None
    hayride: bool


def read_request(inputs: Sequence[tuple[str, HostTensor]], limits: Limits) -> LlmRequest:
    """The prompt and configuration carried by ``inputs``; invalid argument if there is no prompt."""
    by_name: dict[str, HostTensor] = {}
    for name, tensor in inputs:
        if name in by_name:
            raise invalid(f"two input tensors are named {name!r}")
        by_name[name] = tensor
    prompt_tensor = by_name.get(PROMPT)
    if prompt_tensor is None:
        others = [(n, t) for n, t in inputs if n not in (METADATA, OPTIONS) and t.ty == "U8"]
        if len(others) != 1:
            names = ", ".join(repr(n) for n, _ in inputs) or "none"
            raise invalid(
                f"no prompt: name the U8 prompt tensor {PROMPT!r} (or send exactly one U8 tensor "
                f"besides {METADATA!r}/{OPTIONS!r}); inputs: {names}"
            )
        prompt_name, prompt_tensor = others[0]
    else:
        prompt_name = PROMPT
    prompt = prompt_tensor.check_bytes(prompt_name)
    limits.check_prompt_bytes("prompt", len(prompt), prompt)
    configs: list[ParsedConfig] = []
    if METADATA in by_name:
        configs.append(parse_config(by_name[METADATA].check_bytes(METADATA)))
    if OPTIONS in by_name:
        configs.append(hayride_config(by_name[OPTIONS].check_bytes(OPTIONS)))
    return LlmRequest(prompt, _merge(configs), OPTIONS in by_name)


def hayride_config(data: bytes) -> ParsedConfig:
    """Hayride's ``options`` JSON as this host's configuration."""
    try:
        doc = orjson.loads(data) if data.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise WasiNNError(ErrorKind.INVALID_ENCODING, f"options is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WasiNNError(ErrorKind.INVALID_ENCODING, "options must be a JSON object")
    ours: dict[str, Any] = {}
    for key, value in doc.items():
        mapped = HAYRIDE_KEYS.get(key)
        if mapped is None:
            ours[key] = value
        elif not (mapped[1] and value == 0):
            ours[mapped[0]] = value
    return parse_config(orjson.dumps(ours)) if ours else EMPTY_CONFIG


def _merge(configs: list[ParsedConfig]) -> ParsedConfig | None:
    if not configs:
        return None
    merged = configs[0]
    for extra in configs[1:]:
        merged = ParsedConfig(
            {**merged.model, **extra.model},
            {**merged.sampling, **extra.sampling},
            {**merged.stopping, **extra.stopping},
            {**merged.options, **extra.options},
            {**merged.logging, **extra.logging},
        )
    return merged


def answer_tensors(
    request: LlmRequest, text: bytes, embedding: list[float] | None, metadata: bytes
) -> list[tuple[str, HostTensor]]:
    """The named output tensors of one ``compute``."""
    output = HostTensor.f32(embedding) if embedding is not None else HostTensor.u8(text)
    if request.hayride:
        return [(HAYRIDE_OUTPUT, output)]
    return [(OUTPUT, output), (METADATA, HostTensor.u8(metadata))]
