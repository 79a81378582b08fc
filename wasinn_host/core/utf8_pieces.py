"""Streamed pieces as whole UTF-8 characters.

A token of a real vocabulary may end inside a multi-byte character (byte-fallback tokens of an
emoji, half of a CJK character in a byte-level BPE).  A streaming front end that decodes each
piece on its own would show replacement characters, so :class:`PieceJoiner` holds back an
incomplete character at the end of a piece until the tokens that complete it arrive.  Only a
sequence that may still become valid is held; invalid bytes pass through at once, and whatever is
held is released with the stream's last piece.
"""

from __future__ import annotations


def complete_length(data: bytes) -> int:
    """The length of ``data`` without an unfinished (so far valid) UTF-8 sequence at its end."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte < 0x80:
            return n
        if byte >= 0xC0:  # a lead byte: how long its character is
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4 if byte < 0xF8 else 0
            return n - back if back < need else n
    return n  # only continuation bytes: invalid, pass them on


class PieceJoiner:
    """Turns token pieces into pieces that end on a character boundary."""

    def __init__(self) -> None:
        self.held = b""

    def push(self, piece: bytes, last: bool = False) -> bytes:
        """The bytes to show now for ``piece``: held bytes first, an unfinished character kept back
        (unless ``last``: the stream ends and everything is released)."""
        data = self.held + piece if self.held else piece
        cut = len(data) if last else complete_length(data)
        self.held = data[cut:]
        return data[:cut]

    def clear(self) -> None:
        """Forget held bytes (a new stream starts)."""
        self.held = b""
