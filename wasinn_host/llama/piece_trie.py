"""A vocabulary's tokens arranged by the byte prefixes of their pieces, so a grammar need not test every token.

llama.cpp's grammar judges a token by the characters of its piece: it is allowed when some parse of
the grammar's current state accepts those characters one after another.  So if a token whose piece
is a proper prefix of another token's piece (and ends on a character boundary) is refused, the
longer one is refused too: every parse that accepts the longer piece accepts its prefix first.
:meth:`PieceTrie.allowed` uses that to find every allowed token of the vocabulary: it tests the
tokens without such a prefix token (the roots), then only the children of the allowed ones, level by
level.  Where few tokens are allowed (inside a JSON number, between the fields of an object) it tests
a few thousand of Gemma 3's 262,144 tokens instead of all of them.

The rule holds on two conditions, which the caller checks: the grammar has no token elements
(``<[id]>``, ``<|name|>``: those judge a token by its id, not its characters), and the text the
grammar has accepted does not end inside a UTF-8 character (a pending partial character changes how
a piece's first bytes decode).  End-of-generation tokens are never pruned (the grammar judges them
apart) and never serve as prefixes; neither does a piece that is not complete, valid UTF-8.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

from .bindings import llama_cpp

if TYPE_CHECKING:
    import numpy as np


class PieceTrie:
    """Each token's parent (the token with the longest piece that is a proper prefix of its piece), in levels."""

    def __init__(self, pieces: list[bytes], eog: list[bool]) -> None:
        import numpy as np

        n = len(pieces)
        self.pieces = pieces
        prefixes: dict[bytes, int] = {}
        for token, piece in enumerate(pieces):
            if eog[token] or not piece or piece[0] == 0 or piece in prefixes:
                continue
            try:
                piece.decode("utf-8")
            except UnicodeDecodeError:
                continue
            prefixes[piece] = token
        parent = np.full(n, -1, dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        for token in sorted(range(n), key=lambda t: len(pieces[t])):  # parents have shorter pieces
            piece = pieces[token]
            if eog[token]:
                continue
            for length in range(len(piece) - 1, 0, -1):
                found = prefixes.get(piece[:length])
                if found is not None:
                    parent[token] = found
                    depth[token] = depth[found] + 1
                    break
        self.parent = parent
        order = np.argsort(depth, kind="stable")
        bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
        self.levels = [order[bounds[d] : bounds[d + 1]] for d in range(len(bounds) - 1)]
        """Token ids by depth: the roots first, then each token after its parent's level."""
        self.level_parents = [parent[ids] for ids in self.levels]
        """Each level's parents (``parent[ids]`` of its ids), gathered once instead of at every call."""

    @classmethod
    def of_vocab(cls, vocab: Any, n_vocab: int) -> PieceTrie:
        """The trie of a llama.cpp vocabulary (pieces as its grammar sees them: special tokens rendered)."""
        buf = ctypes.create_string_buffer(256)
        pieces = []
        for token in range(n_vocab):
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(vocab, token, big, len(big), 0, True)
                pieces.append(big.raw[:n])
            else:
                pieces.append(buf.raw[:n])
        eog = [bool(llama_cpp.llama_vocab_is_eog(vocab, token)) for token in range(n_vocab)]
        return cls(pieces, eog)

    def allowed(self, test: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Every token id ``test`` would allow, ascending, calling it on the roots and on the children of
        allowed tokens only (``test`` takes token ids and returns the allowed ones among them)."""
        import numpy as np

        passed = np.zeros(len(self.parent), dtype=bool)
        for level, (ids, parents) in enumerate(zip(self.levels, self.level_parents)):
            candidates = ids if level == 0 else ids[passed[parents]]
            if len(candidates):
                passed[test(candidates)] = True
        return np.flatnonzero(passed)

    @staticmethod
    def pending_after(pending: int, piece: bytes) -> int:
        """UTF-8 continuation bytes still expected after ``piece`` follows text expecting ``pending``."""
        for byte in piece:
            if pending > 0 and byte >> 6 == 2:
                pending -= 1
            elif byte >= 0xF0:
                pending = 3
            elif byte >= 0xE0:
                pending = 2
            elif byte >= 0xC0:
                pending = 1
            else:
                pending = 0
        return pending


_tries: weakref.WeakKeyDictionary[Any, PieceTrie] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def trie_of(model: Any) -> PieceTrie:
    """The trie of a loaded model's vocabulary (built once per model, on first use: about a second for
    262,144 tokens)."""
    with _lock:
        trie = _tries.get(model)
        if trie is None:
            trie = _tries[model] = PieceTrie.of_vocab(model.vocab, model.n_vocab)
        return trie


def has_token_elements(grammar: str) -> bool:
    """Whether a GBNF grammar may contain token elements (``<[id]>``, ``<|name|>``, ``!<...>``); a ``<``
    anywhere counts, inside a string literal or a character class too (the trie is then not used)."""
    return "<" in grammar
