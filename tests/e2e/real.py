"""What the real-model tests share: load and greedy settings, a JSON schema, the two models as a parameter,
and one greedy completion through a session."""

from __future__ import annotations

from typing import Any

import pytest

from wasinn_host import WasiNN
from wasinn_host.core.inference import InferenceContext
from wasinn_host.session import Session

CTX = 256
"""Tokens per sequence for most tests (host and native alike)."""
LOAD = {"ctx-size": CTX, "threads": 2}
GREEDY = {"temp": 0, **LOAD}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
}


BOTH = pytest.mark.parametrize("name", ["smollm2", "gemma3"])


def inner(session: Session) -> InferenceContext:
    """The engine-side context of a local session (its tokens, sampler and worker)."""
    context = session._context
    assert isinstance(context, InferenceContext)
    return context


def complete(nn: WasiNN, name: str, prompt: bytes | str, **config: Any) -> tuple[bytes, dict[str, Any]]:
    """The whole output bytes of one compute and its metadata."""
    with nn.session(name, {**GREEDY, **config}) as session:
        session.complete(prompt)
        return bytes(inner(session).output), session.metadata
