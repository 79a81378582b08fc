"""KV sizing: sequences that fit the budget, growth, and the too-large error."""

from __future__ import annotations

import pytest

from wasinn_host.core.config.kv_sizing import MAX_SEQUENCES, grown_layout, kv_layout
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.core.runtime import DEFAULT_SEQUENCES, KvLayout

pytestmark = pytest.mark.fast


def test_default_sequences_when_the_budget_allows() -> None:
    layout = kv_layout(ModelParams(), 100, 10, lambda _w: 1 << 30, "m")
    assert layout == KvLayout(100, DEFAULT_SEQUENCES)


def test_fewer_sequences_when_the_budget_is_short_but_never_none() -> None:
    assert kv_layout(ModelParams(), 100, 10, lambda _w: 2500, "m") == KvLayout(100, 2)
    with pytest.raises(WasiNNError) as caught:
        kv_layout(ModelParams(), 100, 10, lambda _w: 999, "m")
    assert caught.value.kind is ErrorKind.TOO_LARGE
    assert "max_kv_bytes" in caught.value.message


def test_expected_guests_start_with_room_for_all_of_them_within_the_budget() -> None:
    """``wasinn run --instances N``: room for N sequences from the start (a power of two), fewer where
    the budget is short, never beyond llama.cpp's limit or the batch size; n-parallel still rules."""
    assert kv_layout(ModelParams(), 100, 10, lambda _w: 1 << 30, "m", expected=2) == KvLayout(100, DEFAULT_SEQUENCES)
    assert kv_layout(ModelParams(), 100, 10, lambda _w: 1 << 30, "m", expected=24) == KvLayout(100, 32)
    assert kv_layout(ModelParams(), 100, 10, lambda _w: 1 << 30, "m", expected=64) == KvLayout(100, 64)
    assert kv_layout(ModelParams(), 100, 10, lambda _w: 20_000, "m", expected=64) == KvLayout(100, 20)
    assert kv_layout(ModelParams(batch_size=16), 100, 10, lambda _w: 1 << 30, "m", expected=64) == KvLayout(100, 16)
    huge = kv_layout(ModelParams(batch_size=1 << 20), 100, 1, lambda _w: 1 << 40, "m", expected=10_000)
    assert huge == KvLayout(100, MAX_SEQUENCES)
    assert kv_layout(ModelParams(n_parallel=3), 100, 10, lambda _w: 1 << 30, "m", expected=64) == KvLayout(100, 3)


def test_asked_sequences_are_all_or_an_error() -> None:
    params = ModelParams(n_parallel=3)
    assert kv_layout(params, 100, 10, lambda _w: 3000, "m") == KvLayout(100, 3)
    with pytest.raises(WasiNNError, match="3 sequences x 100 tokens"):
        kv_layout(params, 100, 10, lambda _w: 2999, "m")


def test_growth_doubles_to_a_power_of_two_within_the_budget_and_the_limits() -> None:
    params = ModelParams()
    current = KvLayout(100, 4)
    assert grown_layout(params, current, 5, 10, lambda _w: 1 << 30) == KvLayout(100, 8)
    assert grown_layout(params, current, 5, 10, lambda _w: 2000) == KvLayout(100, 6)
    assert grown_layout(params, current, 5, 10, lambda _w: 999) is None
    assert grown_layout(params, KvLayout(100, 8), 63, 10, lambda _w: 1 << 30) == KvLayout(100, 64)
    assert grown_layout(params, KvLayout(100, 8), 65, 10, lambda _w: 1 << 30) == KvLayout(100, 128)
    huge = grown_layout(ModelParams(batch_size=1 << 20), current, 10_000, 1, lambda _w: 1 << 40)
    assert huge == KvLayout(100, MAX_SEQUENCES)
