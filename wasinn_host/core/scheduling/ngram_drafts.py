"""Prompt-lookup drafts (llama.cpp's ``ngram-simple``): the tokens that followed the last n-gram before.

A :class:`NgramDrafter` indexes a sequence's tokens (prompt and output) by the n-grams ending at each
position, keeping the latest occurrence of each.  Its draft for the next tokens is what followed the
latest earlier occurrence of the sequence's last ``n`` tokens: text the answer repeats from the prompt
(a rewrite, an extraction, a list continued) or from itself.  The engine verifies the draft in its next
batch (see ``scheduler.py``), so a wrong draft costs decode time, never a wrong token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config.params import PromptOptions

MATCH_CAP = 64
"""Tokens compared backwards from a match (the estimate of :func:`match_acceptance` stops there)."""


@dataclass(frozen=True)
class DraftSettings:
    """A context's speculation keys (``spec-type`` other than ``none``)."""

    n_max: int = 16
    """``draft-max``: most tokens drafted per step."""
    n_min: int = 0
    """``draft-min``: a shorter draft is not tried."""
    p_min: float = 0.0
    """``draft-p-min``: a draft token is tried only while the estimated chance that it is accepted
    (the context's acceptance rate to the power of its place in the draft) is at least this."""
    ngram_n: int = 3
    """``spec-ngram-size-n``: tokens of the n-gram looked up."""
    ngram_m: int = 48
    """``spec-ngram-size-m``: most tokens taken after a match (``draft-max`` caps it too)."""


def draft_settings(options: PromptOptions) -> DraftSettings | None:
    """A context's speculation keys, or None when ``spec-type`` is ``none`` or ``draft-max`` is 0."""
    if options.spec_type == "none" or options.draft_max <= 0:
        return None
    return DraftSettings(
        options.draft_max, options.draft_min, options.draft_p_min, options.spec_ngram_size_n, options.spec_ngram_size_m
    )


class NgramDrafter:
    """The n-gram index of one sequence's tokens, kept up to date as tokens are appended."""

    def __init__(self, n: int, start: int = 0) -> None:
        self.n = n
        self.start = start
        """Tokens before this index are not indexed (an image's placeholder ids)."""
        self._latest: dict[tuple[int, ...], int] = {}
        self._done = start + n - 1
        """n-grams ending before this index are in ``_latest``."""

    def draft(self, tokens: Sequence[int], limit: int) -> tuple[list[int], int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of ``tokens``' last n-gram,
        and how many tokens before them match (at least n, at most :data:`MATCH_CAP`): the longer, the
        likelier the draft goes on matching."""
        n, end = self.n, len(tokens)
        latest = self._latest
        for stop in range(self._done + 1, end):  # index the n-grams ending before the last token
            latest[tuple(tokens[stop - n : stop])] = stop
        self._done = max(self._done, end - 1)
        if limit <= 0 or end - self.start < n:
            return [], 0
        found = latest.get(tuple(tokens[end - n : end]))
        if found is None:
            return [], 0
        matched = n
        while (
            matched < MATCH_CAP
            and found - matched > self.start
            and tokens[found - matched - 1] == tokens[end - matched - 1]
        ):
            matched += 1
        return list(tokens[found : found + limit]), matched


def match_acceptance(matched: int) -> float:
    """The chance that a draft token after a match of ``matched`` tokens is accepted, as estimated
    before the context's own record: 0.75 after 3, 0.9 after 9, 0.98 after :data:`MATCH_CAP`."""
    return 1.0 - 1.0 / (matched + 1)
