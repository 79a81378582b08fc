"""The ``tensor`` resource's host side: dimensions, type and bytes, and their checks.

A tensor is immutable once built.  Its type is the WIT ``tensor-type`` case name; the data must
hold exactly as many bytes as the dimensions and the element size say (an LLM prompt may also
use the dimensions ``[1]``, as WasmEdge's and Hayride's guests do).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

from ..core.errors import invalid

ELEMENT_SIZE = {"FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2, "U8": 1, "I32": 4, "I64": 8}
"""Bytes per element of each ``tensor-type``."""


@dataclass(frozen=True)
class HostTensor:
    """One ``tensor`` resource."""

    dimensions: tuple[int, ...]
    ty: str
    data: bytes

    @classmethod
    def u8(cls, data: bytes) -> HostTensor:
        """A U8 tensor of ``data`` with the dimensions ``[len(data)]``."""
        return cls((len(data),), "U8", data)

    @classmethod
    def f32(cls, values: Sequence[float]) -> HostTensor:
        """An FP32 tensor (little-endian) of ``values`` with the dimensions ``[len(values)]``."""
        return cls((len(values),), "FP32", struct.pack(f"<{len(values)}f", *values))

    def check_bytes(self, name: str) -> bytes:
        """The data of a tensor that must be text or JSON: U8, dimensions ``[1]`` or matching its length."""
        if self.ty != "U8":
            raise invalid(f"input {name!r} is {self.ty}; prompt, metadata and options tensors are U8")
        count = 1
        for d in self.dimensions:
            count *= d
        if self.dimensions and count not in (1, len(self.data)):
            raise invalid(
                f"input {name!r}: dimensions {list(self.dimensions)} do not describe "
                f"{len(self.data)} bytes; use [1] or [{len(self.data)}]"
            )
        return self.data
