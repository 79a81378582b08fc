"""Stop rules: why a generation or a streaming step ends, the context shift, stop strings cut."""

from __future__ import annotations

from typing import Any, cast

import pytest

from wasinn_host.core.config.params import StopParams
from wasinn_host.core.generation import StopReason
from wasinn_host.core.scheduling import stop_rules

from .fakes import EogModel, RecordingContext, Span, job, slot

pytestmark = pytest.mark.fast

MODEL = cast(Any, EogModel())


def rule(made: Any, token: int, piece: bytes, n_ctx_seq: int = 100, context: Any = None) -> StopReason | None:
    """Sample ``token`` into the job's result as the worker does, then apply the stop rules."""
    made.result.generated.append(token)
    made.result.text += piece
    return stop_rules.stop_rule(MODEL, cast(Any, context or RecordingContext()), made, token, piece, n_ctx_seq, "m")


def test_cut_at_stop_cuts_where_the_stop_string_starts() -> None:
    text = bytearray(b"hello wor")
    assert not stop_rules.cut_at_stop(text, ("world",), 3)
    text += b"ld!"
    assert stop_rules.cut_at_stop(text, ("", "world"), 3)
    assert text == b"hello "


def test_cut_at_stop_looks_only_where_the_new_bytes_can_complete_a_match() -> None:
    text = bytearray(b"stop then more")
    assert not stop_rules.cut_at_stop(text, ("stop",), 4)  # the old occurrence was seen before


def test_is_eog_unless_ignore_eos() -> None:
    assert stop_rules.is_eog(MODEL, job([1]), 0)
    assert not stop_rules.is_eog(MODEL, job([1]), 5)
    assert not stop_rules.is_eog(MODEL, job([1], stopping=StopParams(ignore_eos=True)), 0)


def test_stream_stop_always_ends_the_step() -> None:
    assert stop_rules.stream_stop(MODEL, job([1, 2]), 0, 10) is StopReason.EOS
    assert stop_rules.stream_stop(MODEL, job([1, 2]), 5, 2) is StopReason.CONTEXT_FULL
    assert stop_rules.stream_stop(MODEL, job([1, 2]), 5, 10) is StopReason.TOKEN


def test_stop_rule_order_and_reasons() -> None:
    pieces: list[bytes] = []
    assert rule(job([1], on_piece=pieces.append), 5, b"a") is None
    assert pieces == [b"a"]
    assert rule(job([1], stopping=StopParams(reverse_prompt="User:")), 5, b"User:") is StopReason.REVERSE_PROMPT
    stopped = job([1], stopping=StopParams(stop=("END",)))
    assert rule(stopped, 5, b"xEND") is StopReason.STOP
    assert stopped.result.text == b"x"
    assert rule(job([1]), 0, b"") is StopReason.EOS
    assert rule(job([1], limit=1), 5, b"a") is StopReason.N_PREDICT
    assert rule(job([1], max_output_bytes=2), 5, b"abc") is StopReason.OUTPUT_LIMIT
    assert rule(job([1, 2, 3]), 5, b"a", n_ctx_seq=3) is StopReason.CONTEXT_FULL


def test_stop_rule_shifts_a_full_context_when_asked() -> None:
    made = job(list(range(1, 11)), ctx_shift=True, n_keep=2)
    made.slot = slot(4, list(range(1, 11)))
    context = RecordingContext()
    assert rule(made, 5, b"a", n_ctx_seq=10, context=context) is None
    assert context.calls == [("seq_shift", 4, 2, 4)]
    assert made.tokens == [1, 2, 7, 8, 9, 10]
    assert made.slot.kv == [1, 2, 7, 8, 9, 10]


def test_shift_refuses_when_the_context_cannot_or_positions_are_not_indices() -> None:
    made = job(list(range(1, 11)), n_keep=2)
    made.slot = slot(0, list(range(1, 11)))
    assert not stop_rules.shift(cast(Any, RecordingContext(shiftable=False)), made)
    made.images = {3: Span(3, 4, n_pos=1)}  # M-RoPE: 4 tokens, 1 position
    assert not stop_rules.shift(cast(Any, RecordingContext()), made)
    assert made.tokens == list(range(1, 11))
