"""Prompt-lookup speculation on the fake runtime: drafts, their verification, and the draft budget."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterator

import pytest

from wasinn_host.core.config.params import PromptOptions, SamplingParams, StopParams
from wasinn_host.core.generation import GenerationRequest, GenerationResult
from wasinn_host.core.scheduling.draft_budget import (
    DecodeCost,
    Offer,
    backoff,
    choose_drafts,
    draft_length,
    passes,
    updated_acceptance,
)
from wasinn_host.core.scheduling.ngram_drafts import DraftSettings, NgramDrafter, draft_settings, match_acceptance
from wasinn_host.core.scheduling.scheduler import ContextState, ModelWorker
from wasinn_host.testing.successor import successor_tokenize

from .test_engine import make_worker

pytestmark = pytest.mark.fast

GREEDY = SamplingParams(temp=0.0)


@pytest.fixture
def worker(fake_model: pathlib.Path) -> Iterator[ModelWorker]:
    w = make_worker(fake_model, n_ctx_seq=128)
    yield w
    w.close()


def run(worker: ModelWorker, prompt: str, limit: int, drafts: DraftSettings | None) -> GenerationResult:
    request = GenerationRequest(tuple(successor_tokenize(prompt)), limit, GREEDY, StopParams(), drafts=drafts)
    return worker.submit(request, ContextState())


def cells_match(worker: ModelWorker) -> None:
    """Every slot's token list says how many cells its sequence really holds."""
    for slot in worker.slots:
        assert worker.context.seq_length(slot.seq_id) == len(slot.kv), slot


# -- the drafter and the budget ------------------------------------------------------


def test_draft_is_what_followed_the_latest_earlier_occurrence() -> None:
    tokens = [1, 5, 6, 7, 8, 9, 5, 6, 7, 3, 4, 5, 6, 7]
    drafter = NgramDrafter(3)
    assert drafter.draft(tokens, 4) == ([3, 4, 5, 6], 3)  # the latest "5 6 7" is followed by 3 4 ...
    assert drafter.draft(tokens + [3], 2) == ([4, 5], 4)  # "6 7 3" after one more matching token
    assert drafter.draft([1, 2, 3], 4) == ([], 0)  # the suffix alone is no earlier occurrence
    assert drafter.draft(tokens, 0) == ([], 0)


def test_tokens_before_start_are_not_drafted_from() -> None:
    tokens = [5, 6, 7, 8, 0, 5, 6, 7]
    assert NgramDrafter(3, start=1).draft(tokens, 2) == ([], 0)
    assert NgramDrafter(3, start=0).draft(tokens, 2) == ([8, 0], 3)


def test_match_length_raises_the_estimated_acceptance() -> None:
    assert match_acceptance(3) == 0.75
    assert match_acceptance(9) == 0.9


def test_draft_length_follows_cost_and_acceptance() -> None:
    # a lone context where a token costs as much as the fixed part: worth it while a ** j >= 0.5
    assert draft_length(0.9, 0.5, 1, 0.0, 16) == 6
    assert draft_length(0.6, 0.5, 1, 0.0, 16) == 1
    assert draft_length(0.4, 0.5, 1, 0.0, 16) == 0
    assert draft_length(0.99, 0.5, 1, 0.0, 16) == 16
    assert draft_length(0.9, 0.5, 1, 0.8, 16) == 2  # draft-p-min cuts it shorter
    assert draft_length(0.9, 0.12, 8, 0.0, 16) == 0  # eight generating contexts: a draft must be near-certain
    assert draft_length(0.9, 0.0, 8, 0.0, 5) == 5  # free extra tokens (a GPU): the whole draft


def test_decode_cost_fit() -> None:
    cost = DecodeCost()
    assert cost.fit() == (1.0, 1.0)  # no fit yet: a token as dear as a pass
    for n, p in ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (1, 1), (3, 1), (9, 2), (12, 3)):
        cost.record(n, p, 0.004 * p + 0.006 * n)
    fixed, per_token = cost.fit()
    assert math.isclose(fixed, 0.004, rel_tol=1e-6) and math.isclose(per_token, 0.006, rel_tol=1e-6)
    cost.record(500, 1, 10.0)  # a prompt chunk does not count
    assert math.isclose(cost.seconds(8, 2), 0.056, rel_tol=1e-6)


def test_passes_follow_llama_cpp_split_of_one_stream_per_sequence() -> None:
    assert passes([(0, 1), (1, 1), (2, 1), (3, 1)]) == 1
    assert passes([(0, 9), (1, 1), (2, 1), (3, 1)]) == 2  # 4 x 1, then sequence 0's other 8
    assert passes([(0, 5), (1, 1), (2, 1), (3, 5)]) == 3  # sequences 0 and 3 are not consecutive
    assert passes([(0, 3), (1, 3), (2, 3)]) == 1
    assert passes([(0, 1), (2, 1), (4, 1)]) == 3  # gaps between sequence ids split the batch
    assert passes([(0, 1), (1, 2), (2, 3)]) == 3
    assert passes([]) == 0


def _cost(fixed: float, per_token: float) -> DecodeCost:
    cost = DecodeCost()
    for n, p in ((1, 1), (4, 1), (8, 1), (9, 2)):
        cost.record(n, p, fixed * p + per_token * n)
    return cost


def test_a_lone_context_drafts_what_pays_for_its_tokens() -> None:
    cost = _cost(0.004, 0.006)  # plain step 10 ms, a token 6 ms: worth it while 0.95 ** j >= 0.6
    assert choose_drafts([(0, 1)], [Offer(0, 0.95, 16)], 1, cost, 64) == {0: 9}
    assert choose_drafts([(0, 1)], [Offer(0, 0.5, 16)], 1, cost, 64) == {}
    assert choose_drafts([(0, 1)], [Offer(0, 0.99, 16)], 1, cost, 10) == {0: 10}  # the budget
    assert choose_drafts([(0, 1)], [Offer(0, 0.95, 16, n_min=12)], 1, cost, 64) == {}  # draft-min


def test_drafts_of_many_contexts_keep_the_batch_in_few_passes() -> None:
    cost = _cost(0.020, 0.006)  # Gemma 3 on 2 cores: a pass costs about three tokens
    base = [(s, 1) for s in range(8)]
    # one context with a sure draft: a second pass pays for itself only with a long draft
    assert choose_drafts(base, [Offer(3, 0.99, 2)], 8, cost, 64) == {}
    assert choose_drafts(base, [Offer(3, 0.99, 16)], 8, cost, 64) == {3: 16}
    # every context drafts: one common length keeps one pass
    offers = [Offer(s, 0.99, 3 + s % 3) for s in range(8)]
    assert choose_drafts(base, offers, 8, cost, 64) == {s: 3 for s in range(8)}
    # free tokens (a GPU): whole drafts, as long as they add no pass
    gpu = _cost(0.010, 0.0)
    assert choose_drafts(base, [Offer(s, 0.9, 5) for s in range(8)], 8, gpu, 64) == {s: 5 for s in range(8)}
    assert choose_drafts(base, [Offer(2, 0.9, 5)], 8, gpu, 64) == {}  # a pass makes 8 tokens


def test_acceptance_and_backoff() -> None:
    assert updated_acceptance(0.5, 4, 4) > updated_acceptance(0.5, 4, 2) > 0.5 > updated_acceptance(0.5, 4, 0)
    assert [backoff(m) for m in (0, 1, 2, 3, 10)] == [0, 1, 3, 7, 63]


def test_settings_from_keys() -> None:
    assert draft_settings(PromptOptions()) is None
    assert draft_settings(PromptOptions(spec_type="ngram-simple", draft_max=0)) is None
    assert draft_settings(PromptOptions(spec_type="ngram-simple", draft_max=8, spec_ngram_size_n=2)) == DraftSettings(
        n_max=8, ngram_n=2
    )


# -- verification in the engine --------------------------------------------------------


def test_drafts_that_match_give_the_plain_output(worker: ModelWorker) -> None:
    prompt = "0123456789012"  # the successor model continues the digits: the prompt repeats
    plain = run(worker, prompt, 40, None)
    fast = run(worker, prompt, 40, DraftSettings())
    assert fast.generated == plain.generated and fast.text == plain.text == b"3456789012" * 4
    assert fast.accepted_tokens > 20 and fast.drafted_tokens >= fast.accepted_tokens
    assert (plain.drafted_tokens, plain.accepted_tokens) == (0, 0)
    assert worker.decode_calls > 0 and worker.accepted_draft_tokens == fast.accepted_tokens
    cells_match(worker)


def test_draft_that_never_matches(worker: ModelWorker) -> None:
    prompt = "bcd!cde!def!efg!fgh!ghi!hij!ijk!jkl!abc"  # every 3-gram of the answer was followed by "!"
    plain = run(worker, prompt, 30, None)
    spec = run(worker, prompt, 30, DraftSettings(n_max=1))  # one token a draft: drafted = drafts tried
    assert spec.text == plain.text == b"defghijklmnopqrstuvwxyz</s>"
    # eight steps find a match ("bcd" .. "jkl"); after each miss the context passes over 1, 3, 7 ... of them
    assert (spec.drafted_tokens, spec.accepted_tokens) == (3, 0)
    cells_match(worker)


def test_partial_acceptance_and_stop_inside_a_draft(worker: ModelWorker) -> None:
    prompt = "abcdefgh!abc"  # the draft "defgh!abc" matches up to "h", then the model says "i"
    plain = run(worker, prompt, 12, None)
    spec = run(worker, prompt, 12, DraftSettings(n_max=9))
    assert spec.text == plain.text == b"defghijklmno"
    assert 0 < spec.accepted_tokens < spec.drafted_tokens
    short = run(worker, prompt, 3, DraftSettings(n_max=9))  # n-predict ends inside an accepted draft
    assert short.text == b"def" and short.stop_reason.value == "n-predict"
    cells_match(worker)
