"""Embedding vector normalisation, as llama.cpp's ``common_embd_normalize`` (``embd-normalize``)."""

from __future__ import annotations

import math


def normalize(vector: list[float], mode: int) -> list[float]:
    """-1: none; 0: max absolute value scaled to int16 range; 1: taxicab; 2: Euclidean; >2: p-norm."""
    if mode < 0:
        return list(vector)
    if mode == 0:
        total = max((abs(v) for v in vector), default=0.0) / 32760.0
    elif mode == 2:
        total = math.sqrt(sum(v * v for v in vector))
    else:
        total = sum(abs(v) ** mode for v in vector) ** (1.0 / mode)
    scale = 1.0 / total if total > 0.0 else 0.0
    return [v * scale for v in vector]
