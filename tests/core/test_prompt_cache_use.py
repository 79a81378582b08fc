"""Prompt-cache use: what the worker prefetches, restores and saves, against a recording cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from wasinn_host.core.prompt_cache import cache as prompt_cache_module
from wasinn_host.core.scheduling import prompt_cache_use

from .fakes import RecordingContext, Span, job, slot

pytestmark = pytest.mark.fast


@dataclass
class Found:
    common: int
    tokens: list[int]


@dataclass
class RecordingCache:
    """The ModelPromptCache calls the worker makes, recorded."""

    min_tokens: int = 4
    found: Found | None = None
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def prefetch(self, tokens: list[int], cacheable: int, have: int, name: str) -> Found | None:
        self.calls.append(("prefetch", cacheable, have, name))
        return self.found

    def restore(self, context: Any, seq_id: int, found: Found) -> list[int]:
        self.calls.append(("restore", seq_id))
        return found.tokens

    def save(self, context: Any, seq_id: int, tokens: list[int], fresh: int, name: str) -> None:
        self.calls.append(("save", seq_id, fresh, name))


def test_cacheable_is_all_but_the_last_token_and_nothing_from_the_first_image() -> None:
    assert prompt_cache_use.cacheable(job([1, 2, 3, 4])) == 3
    with_image = job([1, 2, 3, 4, 5])
    with_image.images = {2: Span(2, 2)}
    assert prompt_cache_use.cacheable(with_image) == 2


def test_prefetch_counts_the_own_sequence_as_saved() -> None:
    cache = RecordingCache(found=Found(3, [1, 2, 3]))
    made = job([1, 2, 3, 4], cache_name="chat")
    own = slot(0, [1, 2, 9])
    own.owner, made.state.slot = made.state, own
    prompt_cache_use.prefetch(cast(Any, cache), made)
    assert cache.calls == [("prefetch", 3, 2, "chat")]
    assert made.cached is cast(Any, cache.found)


def test_prefetch_skips_embeddings_and_no_cache_prompt() -> None:
    cache = RecordingCache()
    prompt_cache_use.prefetch(cast(Any, cache), job([1, 2], embed=True))
    prompt_cache_use.prefetch(cast(Any, cache), job([1, 2], cache_prompt=False))
    assert cache.calls == []


def test_prefetch_without_a_cache_logs_an_ignored_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prompt_cache_module, "_ignored_name_logged", False)  # said once per process
    made = job([1, 2], cache_name="chat")
    with caplog.at_level("INFO", logger="wasinn_host"):
        prompt_cache_use.prefetch(None, made)
    assert made.cached is None
    assert "chat" in caplog.text


def test_restore_only_when_the_entry_saves_enough() -> None:
    cache, context = RecordingCache(min_tokens=4), RecordingContext()
    small = job([1, 2, 3, 4, 5, 6])
    small.cached = cast(Any, Found(3, [1, 2, 3]))
    held = slot(2, [1])
    prompt_cache_use.restore_prefix(cast(Any, cache), cast(Any, context), small, held)
    assert small.cached is None and held.kv == [1] and cache.calls == []  # gains 2 < min_tokens
    named = job([1, 2, 3, 4, 5, 6], cache_name="chat")
    named.cached = cast(Any, Found(3, [1, 2, 3]))
    prompt_cache_use.restore_prefix(cast(Any, cache), cast(Any, context), named, held)
    assert held.kv == [1, 2, 3] and named.result.reused_tokens == 3 and cache.calls == [("restore", 2)]


def test_save_prefix_saves_decoded_text_prompts_only() -> None:
    cache, context = RecordingCache(), RecordingContext()
    made = job([1, 2, 3, 4], cache_name="chat")
    made.slot = slot(1, [1, 2, 3, 4])
    made.result.reused_tokens = 1
    prompt_cache_use.save_prefix(cast(Any, cache), cast(Any, context), made)
    assert cache.calls == [("save", 1, 3, "chat")]
    made.images = {0: Span(0, 1)}
    prompt_cache_use.save_prefix(cast(Any, cache), cast(Any, context), made)
    assert len(cache.calls) == 1
