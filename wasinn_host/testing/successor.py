"""The successor model's table, for tests and benchmarks: re-exported from :mod:`wasinn_host.backend.successor`,
where the fake runtime (:mod:`wasinn_host.backend.fake`) that computes it lives."""

from __future__ import annotations

from ..backend.successor import (
    BOS_ID,
    BYTE_TOKEN_OFFSET,
    CHAR_TOKEN_OFFSET,
    EOS_ID,
    FIRST_PRINTABLE,
    LAST_PRINTABLE,
    SUCCESSOR_VOCAB_SIZE,
    UNK_ID,
    byte_token_id,
    char_token_id,
    successor_ends_with_eos,
    successor_of,
    successor_text,
    successor_tokenize,
    successor_tokens,
)

__all__ = [
    "BOS_ID",
    "BYTE_TOKEN_OFFSET",
    "CHAR_TOKEN_OFFSET",
    "EOS_ID",
    "FIRST_PRINTABLE",
    "LAST_PRINTABLE",
    "SUCCESSOR_VOCAB_SIZE",
    "UNK_ID",
    "byte_token_id",
    "char_token_id",
    "successor_ends_with_eos",
    "successor_of",
    "successor_text",
    "successor_tokenize",
    "successor_tokens",
]
