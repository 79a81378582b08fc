"""Speculation in the worker: which jobs get drafts, verifying a draft, dropping unkept cells."""

from __future__ import annotations

from typing import Any, cast

import pytest

from wasinn_host.core.generation import StopReason
from wasinn_host.core.scheduling import speculation
from wasinn_host.core.scheduling.draft_budget import DecodeCost
from wasinn_host.core.scheduling.ngram_drafts import DraftSettings

from .fakes import RecordingContext, job, slot

pytestmark = pytest.mark.fast

REPEATING = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]
"""A prompt whose last 3-gram occurred before: the prompt-lookup drafter offers ``4, 5, 6, 1, ...``."""


def generating(tokens: list[int], **request: Any) -> Any:
    """A job whose prompt is decoded but for its last token (it samples after this batch)."""
    made = job(tokens, **request)
    made.slot = slot(0, tokens[:-1])
    return made


def test_plan_drafts_offers_a_prompt_lookup_draft() -> None:
    made = generating(REPEATING, drafts=DraftSettings(n_max=4))
    speculation.plan_drafts([(made, 1)], 512, 100, DecodeCost())
    assert made.draft and made.draft == [4, 5, 6, 1][: len(made.draft)]


def test_plan_drafts_skips_streaming_no_settings_and_backing_off_jobs() -> None:
    plain = generating(REPEATING)
    streaming = generating(REPEATING, drafts=DraftSettings(), streaming=True)
    backing_off = generating(REPEATING, drafts=DraftSettings())
    backing_off.skip = 2
    for made in (plain, streaming, backing_off):
        speculation.plan_drafts([(made, 1)], 512, 100, DecodeCost())
        assert made.draft == []
    assert backing_off.skip == 1


def test_plan_drafts_never_drafts_past_n_predict_or_the_context() -> None:
    at_limit = generating(REPEATING, drafts=DraftSettings(), limit=1)
    full = generating(REPEATING, drafts=DraftSettings())
    speculation.plan_drafts([(at_limit, 1)], 512, 100, DecodeCost())
    speculation.plan_drafts([(full, 1)], 512, len(REPEATING), DecodeCost())
    assert at_limit.draft == [] and full.draft == []


def test_drop_cells_drops_after_keep() -> None:
    context = RecordingContext()
    made = job([1, 2, 3, 4])
    made.slot = slot(5, [1, 2, 3, 4])
    speculation.drop_cells(cast(Any, context), made, 2)
    speculation.drop_cells(cast(Any, context), made, 2)
    assert made.slot.kv == [1, 2] and context.calls == [("seq_rm", 5, 2)]


def verify(
    draft: list[int], sampled: list[int], stop_at: int = -1
) -> tuple[Any, RecordingContext, tuple[int, int], list[StopReason]]:
    """Verify ``draft`` (decoded after pending token 9) where the sampler picks ``sampled`` in turn."""
    context = RecordingContext()
    made = job([1, 9])
    made.slot = slot(0, [1, 9, *draft])
    made.draft, made.draft_indices = list(draft), list(range(len(draft) + 1))
    picks = iter(sampled)
    finished: list[StopReason] = []

    def stop_rule(_job: Any, token: int, _piece: bytes) -> StopReason | None:
        return StopReason.EOS if token == stop_at else None

    counts = speculation.verify_draft(
        cast(Any, context), made, lambda _j: (next(picks), b""), stop_rule, lambda _j, r: finished.append(r)
    )
    return made, context, counts, finished


def test_verify_keeps_the_matching_tokens_and_the_first_sampled_one_that_differs() -> None:
    made, context, counts, _ = verify([3, 4, 5], [3, 4, 7])
    assert counts == (3, 2)
    assert made.tokens == [1, 9, 3, 4, 7]
    assert made.slot.kv == [1, 9, 3, 4]  # the 7 is decoded next; the draft's 5 is dropped
    assert context.calls == [("seq_rm", 0, 4)]
    assert made.draft == [] and made.misses == 0 and made.result.accepted_tokens == 2


def test_verify_accepts_a_whole_draft_and_samples_one_more() -> None:
    made, context, counts, _ = verify([3, 4], [3, 4, 8])
    assert counts == (2, 2) and made.tokens == [1, 9, 3, 4, 8] and context.calls == []


def test_verify_stops_at_a_stop_rule_and_counts_a_miss() -> None:
    made, _, counts, finished = verify([3, 4], [0], stop_at=0)
    assert counts == (2, 0)
    assert finished == [StopReason.EOS]
    assert made.tokens == [1, 9] and made.slot.kv == [1, 9]
    assert made.misses == 1 and made.skip > 0
