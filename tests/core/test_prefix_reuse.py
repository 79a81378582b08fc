"""Prefix reuse: cells a job keeps, the sequence it copies from, whether it waits for a leader."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wasinn_host.core.scheduling import prefix_reuse
from wasinn_host.core.scheduling.prefix_reuse import MIN_SHARED_PREFIX

from .fakes import RecordingContext, Span, job, slot

pytestmark = pytest.mark.fast


def test_reusable_keeps_the_shared_prefix_but_never_the_last_token() -> None:
    assert prefix_reuse.reusable(job([1, 2, 3, 4]), slot(0, [1, 2, 9])) == 2
    assert prefix_reuse.reusable(job([1, 2, 3]), slot(0, [1, 2, 3])) == 2  # the last is decoded for logits


def test_reusable_is_none_without_cache_prompt_or_for_embeddings() -> None:
    assert prefix_reuse.reusable(job([1, 2, 3, 4], cache_prompt=False), slot(0, [1, 2, 3])) == 0
    assert prefix_reuse.reusable(job([1, 2, 3, 4], embed=True), slot(0, [1, 2, 3])) == 0


def test_reusable_never_keeps_part_of_an_image() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7]
    image_job = job(tokens)
    image_job.images = {2: Span(2, 3)}
    assert prefix_reuse.reusable(image_job, slot(0, [1, 2, 3, 4])) == 2  # inside the image: back to its start
    assert prefix_reuse.reusable(image_job, slot(0, [1, 2, 3, 4, 5, 6])) == 6  # past it: kept


def test_trim_kv_drops_the_cells_after_the_shared_prefix() -> None:
    context = RecordingContext()
    held = slot(3, [1, 2, 9, 9])
    assert prefix_reuse.trim_kv(cast(Any, context), job([1, 2, 3]), held) == 2
    assert held.kv == [1, 2]
    assert context.calls == [("seq_rm", 3, 2)]
    assert prefix_reuse.trim_kv(cast(Any, context), job([1, 2, 3]), held) == 2
    assert len(context.calls) == 1  # nothing more to drop


def test_donor_is_the_longest_holder_other_than_the_slot_and_not_a_copy_target() -> None:
    tokens = list(range(1, 101))
    own, short, long, target = slot(0, tokens[:10]), slot(1, tokens[:40]), slot(2, tokens[:80]), slot(3, tokens)
    slots = [own, short, long, target]
    assert prefix_reuse.donor(slots, job(tokens), own, 10, copy_targets={3}) == (long, 80)
    assert prefix_reuse.donor(slots, job(tokens), own, 10, copy_targets=()) == (target, 99)
    assert prefix_reuse.donor(slots, job(tokens), own, 99, copy_targets=()) == (None, 99)


def test_copy_source_only_beyond_min_shared_prefix() -> None:
    tokens = list(range(1, 201))
    own = slot(0, tokens[:10])
    near = slot(1, tokens[: 10 + MIN_SHARED_PREFIX - 1])
    assert prefix_reuse.copy_source([own, near], job(tokens), own, ()) is None
    far = slot(2, tokens[: 10 + MIN_SHARED_PREFIX])
    assert prefix_reuse.copy_source([own, near, far], job(tokens), own, ()) == (far, 10 + MIN_SHARED_PREFIX)


def test_follows_waits_for_a_leader_decoding_a_shared_prefix_then_lets_go() -> None:
    tokens = list(range(1, 101))
    leader = job(tokens + [500])
    leader.slot = slot(1, tokens[:8])  # decoding: holds 8 of the shared 100
    follower, free = job(tokens + [600]), slot(0)
    assert prefix_reuse.follows(follower, free, [free, leader.slot], [leader], ())
    assert follower.follows == (leader, 100)
    leader.slot.kv[:] = tokens  # decoded: the follower starts and copies
    assert not prefix_reuse.follows(follower, free, [free, leader.slot], [leader], ())
    assert follower.follows is None


def test_follows_does_not_wait_for_a_short_shared_prefix_or_without_cache_prompt() -> None:
    tokens = list(range(1, 101))
    leader = job(tokens)
    leader.slot = slot(1)
    short = job(tokens[: MIN_SHARED_PREFIX - 1] + [700, 701])
    assert not prefix_reuse.follows(short, slot(0), [leader.slot], [leader], ())
    assert not prefix_reuse.follows(job(tokens + [1], cache_prompt=False), slot(0), [leader.slot], [leader], ())


def test_common_prefix_of_lists_tuples_and_arrays() -> None:
    from array import array

    from wasinn_host.core.tokens import common_prefix

    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], (1, 2, 4)) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5, 2], [1, 2]) == 0
    assert common_prefix(array("i", [1, 2, 3]), [1, 2, 3]) == 3
    assert common_prefix([1] * 500 + [2], [1] * 500 + [3]) == 500


def naive_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# token lists over a small alphabet, often sharing a long head (one list made from another)
tokens_lists = st.lists(st.integers(0, 3), max_size=80)


@given(tokens_lists, tokens_lists, st.integers(0, 80), st.booleans())
def test_common_prefix_and_may_share_agree_with_a_token_by_token_count(
    a: list[int], tail: list[int], cut: int, as_tuple: bool
) -> None:
    from wasinn_host.core.tokens import common_prefix, may_share

    b = a[:cut] + tail
    shared = naive_prefix(a, b)
    assert common_prefix(a, tuple(b) if as_tuple else b) == shared
    for n in range(0, shared + 1):  # never rules out a prefix the two share
        assert may_share(a, b, n)
    assert not may_share(a, b, max(len(a), len(b)) + 1)


@given(tokens_lists, st.lists(st.tuples(tokens_lists, st.integers(0, 80)), max_size=12), st.integers(0, 60))
def test_donor_is_the_longest_usable_prefix_any_other_sequence_holds(
    tokens: list[int], others: list[tuple[list[int], int]], have: int
) -> None:
    wanted = job(tokens + [9])
    own = slot(0, tokens[: have // 2])
    slots = [own] + [slot(i + 1, tokens[:cut] + tail) for i, (tail, cut) in enumerate(others)]
    best, best_len = None, have
    for other in slots[1:]:  # every sequence's usable prefix, one by one
        shared = min(naive_prefix(other.kv, wanted.tokens), len(wanted.tokens) - 1)
        if shared > best_len:
            best, best_len = other, shared
    assert prefix_reuse.donor(slots, wanted, own, have, ()) == (best, best_len)
