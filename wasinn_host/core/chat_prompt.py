"""Host-side chat templating for a loaded model (the opt-in ``chat-template`` key).

The guest sends a JSON list of ``{"role", "content"}`` messages as its prompt; this
renders them with the model's GGUF ``tokenizer.chat_template`` (``chat-template: true``)
or with a template the guest gives (``chat-template: "<jinja>"``), ready to tokenize.
"""

from __future__ import annotations

import functools

from .chat_template import ChatTemplate, parse_messages, resolve_template
from .runtime import Model


@functools.lru_cache(maxsize=64)
def _compiled(source: str, bos: str, eos: str) -> ChatTemplate:
    return ChatTemplate(source, bos_token=bos, eos_token=eos)


def render_chat_prompt(model: Model, setting: bool | str, data: bytes) -> bytes:
    """Messages JSON -> prompt text; an invalid-argument error for bad messages or a template that fails."""
    source = resolve_template(setting, model.chat_template() if setting is True else None)
    assert source is not None
    bos = model.piece(model.bos).decode("utf-8", "replace") if model.bos >= 0 else ""
    eos = model.piece(model.eos).decode("utf-8", "replace") if model.eos >= 0 else ""
    text = _compiled(source, bos, eos).render(parse_messages(data), add_generation_prompt=True)
    if bos and text.startswith(bos) and adds_bos(model):
        text = text[len(bos) :]  # tokenizing adds BOS itself
    return text.encode()


def adds_bos(model: Model) -> bool:
    """Whether tokenizing adds the BOS token (not every vocabulary does: SmolLM2's BOS is ``<|im_start|>``,
    which its ChatML template writes itself, and tokenizing adds none)."""
    return model.tokenize(b"", add_special=True, parse_special=True)[:1] == [model.bos]
