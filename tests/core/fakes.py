"""Small stand-ins for the scheduler's helpers' unit tests: jobs, slots, a context that records calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wasinn_host.core.config.params import SamplingParams, StopParams
from wasinn_host.core.generation import GenerationRequest
from wasinn_host.core.scheduling.slot_state import ContextState, Job, Slot


@dataclass
class Span:
    """An image in a prompt, as the scheduler sees one (``start``, ``n_tokens``, ``n_pos``)."""

    start: int
    n_tokens: int
    n_pos: int = -1

    def __post_init__(self) -> None:
        if self.n_pos < 0:
            self.n_pos = self.n_tokens


def job(tokens: list[int], **request: Any) -> Job:
    """A job for ``tokens``; ``request`` overrides GenerationRequest fields (``limit`` defaults to 16)."""
    request.setdefault("limit", 16)
    request.setdefault("sampling", SamplingParams())
    request.setdefault("stopping", StopParams())
    made = Job(GenerationRequest(tokens=tuple(tokens), **request), ContextState())
    made.tokens = list(tokens)
    return made


def slot(seq_id: int, kv: list[int] | None = None) -> Slot:
    """A slot holding ``kv``."""
    return Slot(seq_id, list(kv or []))


@dataclass
class RecordingContext:
    """The few Context calls the helpers make, recorded; ``shiftable`` answers ``can_shift``."""

    shiftable: bool = True
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def seq_rm(self, seq_id: int, start: int) -> None:
        self.calls.append(("seq_rm", seq_id, start))

    def seq_copy(self, source: int, target: int) -> None:
        self.calls.append(("seq_copy", source, target))

    def can_shift(self) -> bool:
        return self.shiftable

    def seq_shift(self, seq_id: int, keep: int, discard: int) -> None:
        self.calls.append(("seq_shift", seq_id, keep, discard))


class EogModel:
    """A model whose only end-of-generation token is 0."""

    def is_eog(self, token: int) -> bool:
        return token == 0
