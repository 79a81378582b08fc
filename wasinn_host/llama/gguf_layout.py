"""Read a GGUF file's header (metadata and tensor table) to size a model before loading it.

Only what fitting layers to GPU memory needs: the architecture's layer count and attention shape,
and the bytes of each tensor, grouped into repeating layers (``blk.N.*``), the output layer
(``output*``; the token embedding when the output matrix is tied) and the rest.  Nothing but the
header is read (memory-mapped), so it is quick even for large models.  Tensor byte sizes need
ggml's block sizes: the caller passes ``type_size(ggml_type) -> (block elements, block bytes)``.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.errors import ErrorKind, WasiNNError

TypeSize = Callable[[int], tuple[int, int]]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class GgufLayout:
    """A model's size as its GGUF header describes it."""

    metadata: dict[str, Any]
    """Scalar and string keys (arrays are skipped: the vocabulary is not needed)."""
    layer_bytes: dict[int, int]
    """Weight bytes per repeating layer."""
    output_bytes: int
    """The output layer; with a tied output matrix this includes the copy of the embedding it uses."""
    other_bytes: int
    """The rest (token embedding, which stays on the CPU, and any other tensors)."""
    tied_bytes: int = 0
    """The embedding bytes counted in ``output_bytes`` as well when the output matrix is tied."""
    has_classifier: bool = False
    """A classification head (``cls.*`` tensors): what rank pooling (a reranker) scores with."""
    weight_types: frozenset[int] = frozenset()
    """The ggml types of its tensors (quantized ones may go into llama.cpp's extra CPU layouts)."""

    @property
    def architecture(self) -> str:
        """``general.architecture``."""
        return str(self.metadata.get("general.architecture", ""))

    def key(self, name: str, default: Any = None) -> Any:
        """The architecture-specific key ``{arch}.{name}``."""
        return self.metadata.get(f"{self.architecture}.{name}", default)

    @property
    def total_bytes(self) -> int:
        """Every tensor's bytes (the tied output counted once)."""
        return sum(self.layer_bytes.values()) + self.output_bytes + self.other_bytes - self.tied_bytes

    def kv_bytes_per_cell_per_layer(self) -> int:
        """F16 K and V of one cell in one layer (llama.cpp's default cache type)."""
        n_embd = int(self.key("embedding_length", 0))
        n_head = _largest(self.key("attention.head_count", 1)) or 1
        n_head_kv = _largest(self.key("attention.head_count_kv", n_head)) or n_head
        k_len = int(self.key("attention.key_length", n_embd // n_head))
        v_len = int(self.key("attention.value_length", n_embd // n_head))
        return (k_len + v_len) * n_head_kv * 2


def _largest(value: Any) -> int:
    return max(value) if isinstance(value, list) else int(value)


class _Reader:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALARS and count <= 4096:  # per-layer values (head counts) are kept
                return [self.value(item_type) for _ in range(count)]
            for _ in range(count):
                if item_type in _SCALARS:
                    self.pos += struct.calcsize(_SCALARS[item_type])
                else:
                    self.value(item_type)
            return None
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_layout(path: Path, type_size: TypeSize) -> GgufLayout:
    """The layout of the GGUF file at ``path`` (invalid argument if it is not a readable GGUF file)."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Reader(data), type_size)
    except (OSError, ValueError, struct.error, IndexError) as exc:
        raise WasiNNError(ErrorKind.INVALID_ARGUMENT, f"cannot read the GGUF header of {str(path)!r}: {exc}") from None


def _parse(r: _Reader, type_size: TypeSize) -> GgufLayout:
    if bytes(r.data[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    r.pos = 4
    version = r.unpack("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        value = r.value(r.unpack("<I"))
        if value is not None:
            metadata[key] = value
    layers: dict[int, int] = {}
    output = other = embedding = 0
    has_output_matrix = has_classifier = False
    types: set[int] = set()
    for _ in range(n_tensors):
        name = r.string()
        has_classifier = has_classifier or name.startswith("cls.")
        dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        ggml_type = r.unpack("<I")
        types.add(ggml_type)
        block, block_bytes = type_size(ggml_type)
        r.unpack("<Q")  # offset
        elements = 1
        for d in dims:
            elements *= d
        size = elements // max(block, 1) * block_bytes
        match = _LAYER.match(name)
        if match:
            layers[int(match.group(1))] = layers.get(int(match.group(1)), 0) + size
        elif name.startswith("output"):
            output += size
            has_output_matrix = has_output_matrix or name == "output.weight"
        else:
            other += size
            if name == "token_embd.weight":
                embedding = size
    tied = 0 if has_output_matrix else embedding  # llama.cpp puts a copy on the output layer's device
    return GgufLayout(metadata, layers, output + tied, other, tied, has_classifier, frozenset(types))
