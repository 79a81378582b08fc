"""Token sequences compared: how many leading tokens two of them share."""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences (the usual cases at C speed: most sequences
    differ within their first few tokens, found without copying their heads; equal heads of two lists or
    two tuples compared at once; a list and a tuple are compared as tuples)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and i < _FIRST and a[i] == b[i]:
        i += 1
    if i < n and i < _FIRST:
        return i
    if i == n:
        return n
    head_a, head_b = a[:n], b[:n]
    if head_a == head_b or (type(head_a) is not type(head_b) and tuple(head_a) == tuple(head_b)):
        return n
    while i < n and a[i] == b[i]:
        i += 1
    return i


def may_share(a: Sequence[int], b: Sequence[int], n: int) -> bool:
    """Whether ``a`` and ``b`` may share their first ``n`` tokens (a test of one token, not a proof): a
    scan over many sequences for a prefix of at least ``n`` skips with it the ones that cannot hold it."""
    return n <= 0 or (len(a) >= n and len(b) >= n and a[n - 1] == b[n - 1])


_FIRST = 4
"""Tokens compared one by one before two sequences' heads are compared whole."""
