"""Token sequences compared: how many leading tokens two of them share."""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences (the usual cases, equal heads of two lists or
    two tuples, at C speed; a list and a tuple are compared as tuples)."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:  # most sequences another job holds differ at once: no copies of their heads
        return 0
    head_a, head_b = a[:n], b[:n]
    if head_a == head_b or (type(head_a) is not type(head_b) and tuple(head_a) == tuple(head_b)):
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
