"""The successor table in pure Python: the vocabulary ids and what the successor model predicts.

Shared by the fake runtime (:mod:`wasinn_host.backend.fake`), the GGUF writer
(:mod:`wasinn_host.testing.gguf_models`) and tests that compute expected outputs (through
:mod:`wasinn_host.testing.successor`, which re-exports it); it needs neither
``gguf`` nor llama.cpp.
"""

from __future__ import annotations

from collections.abc import Iterator

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

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
BYTE_TOKEN_OFFSET = 3
"""Id of the byte-fallback token ``<0x00>``; byte ``b`` has id ``BYTE_TOKEN_OFFSET + b``."""
CHAR_TOKEN_OFFSET = 259
"""Id of the space character; printable ASCII ``c`` has id ``CHAR_TOKEN_OFFSET + ord(c) - 0x20``."""
FIRST_PRINTABLE = 0x20
LAST_PRINTABLE = 0x7E
SUCCESSOR_VOCAB_SIZE = CHAR_TOKEN_OFFSET + (LAST_PRINTABLE - FIRST_PRINTABLE + 1)
"""Number of tokens in the successor model's vocabulary (354)."""


def char_token_id(char: str) -> int:
    """Token id of one printable ASCII character (``' '`` .. ``'~'``)."""
    code = ord(char)
    if not FIRST_PRINTABLE <= code <= LAST_PRINTABLE:
        raise ValueError(f"not a printable ASCII character: {char!r}")
    return CHAR_TOKEN_OFFSET + code - FIRST_PRINTABLE


def byte_token_id(byte: int) -> int:
    """Token id of the byte-fallback token ``<0xNN>`` for ``byte`` (0..255)."""
    if not 0 <= byte <= 255:
        raise ValueError(f"not a byte: {byte}")
    return BYTE_TOKEN_OFFSET + byte


def successor_tokenize(text: str, *, add_bos: bool = True) -> list[int]:
    """Token ids llama.cpp gives ``text`` in this vocabulary (one per ASCII char, else UTF-8 bytes)."""
    ids = [BOS_ID] if add_bos else []
    for char in text:
        if FIRST_PRINTABLE <= ord(char) <= LAST_PRINTABLE:
            ids.append(char_token_id(char))
        else:
            ids.extend(byte_token_id(b) for b in char.encode("utf-8"))
    return ids


def _next_char(char: str) -> str | None:
    """The character that follows ``char`` in the table, or None when it maps to EOS."""
    if char in "abcdefghijklmnopqrstuvwxy" or char in "ABCDEFGHIJKLMNOPQRSTUVWXY":
        return chr(ord(char) + 1)
    if char in "012345678":
        return chr(ord(char) + 1)
    if char == "9":
        return "0"
    return None


def successor_of(token_id: int) -> int:
    """The token the successor model predicts (greedily) after ``token_id``."""
    if token_id == BOS_ID:
        return char_token_id("a")
    if CHAR_TOKEN_OFFSET <= token_id < SUCCESSOR_VOCAB_SIZE:
        nxt = _next_char(chr(token_id - CHAR_TOKEN_OFFSET + FIRST_PRINTABLE))
        if nxt is not None:
            return char_token_id(nxt)
    return EOS_ID


def successor_tokens(prompt: str, n: int | None = None) -> Iterator[int]:
    """Token ids greedy decoding yields after ``BOS + prompt``, EOS included, at most ``n`` of them.

    With ``n=None`` the iterator is endless for prompts that enter the digit cycle.
    """
    token = successor_tokenize(prompt)[-1]
    produced = 0
    while n is None or produced < n:
        token = successor_of(token)
        produced += 1
        yield token
        if token == EOS_ID:
            return


def successor_text(prompt: str, n: int | None = None) -> str:
    """The text greedy decoding produces after ``BOS + prompt``, without the EOS piece.

    ``n`` caps the number of generated tokens (EOS counts as one), like llama.cpp's ``n_predict`` or
    ``max_tokens``. ``n=None`` means "until EOS" and raises ValueError for prompts that never reach
    EOS (those ending in a digit). Use :func:`successor_ends_with_eos` to learn whether the
    generation stopped at EOS within ``n`` tokens.
    """
    if n is None and not successor_ends_with_eos(prompt):
        raise ValueError(f"greedy continuation of {prompt!r} never ends; pass n")
    return "".join(chr(t - CHAR_TOKEN_OFFSET + FIRST_PRINTABLE) for t in successor_tokens(prompt, n) if t != EOS_ID)


def successor_ends_with_eos(prompt: str, n: int | None = None) -> bool:
    """Whether greedy decoding of ``prompt`` emits EOS within ``n`` tokens (``None``: ever)."""
    if n is None:
        # Any chain reaches EOS or the digit cycle within 27 steps.
        n = 32
    return any(t == EOS_ID for t in successor_tokens(prompt, n))
