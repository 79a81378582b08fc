"""``--nn-preload NAME:ENCODING:TARGET:PATH[:PATH...]`` parsed exactly as WasmEdge does.

The value is split on ``:``; the encoding and target are matched case-insensitively; for
GGML every remaining segment is re-joined with ``:`` into one path (so Windows drive
letters and colons in file names survive).  The file is not opened here: models load
lazily on the first ``load_by_name``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path


class Encoding(enum.IntEnum):
    """Graph encodings (``load``'s ``encoding`` argument), WasmEdge numbering."""

    OPENVINO = 0
    ONNX = 1
    TENSORFLOW = 2
    PYTORCH = 3
    TENSORFLOWLITE = 4
    AUTODETECT = 5
    GGML = 6
    NEURALSPEED = 7
    BURN = 8
    WHISPER = 9
    MLX = 10
    PIPER = 11
    CHATTTS = 12
    OPENVINOGENAI = 13
    BITNET = 14


class Target(enum.IntEnum):
    """Execution targets; ``load`` accepts CPU, GPU and TPU, ``--nn-preload`` also AUTO."""

    CPU = 0
    GPU = 1
    TPU = 2
    AUTO = 3


_ENCODING_NAMES = {
    "openvino": Encoding.OPENVINO,
    "onnx": Encoding.ONNX,
    "tensorflow": Encoding.TENSORFLOW,
    "pytorch": Encoding.PYTORCH,
    "pytorchaoti": Encoding.PYTORCH,
    "tensorflowlite": Encoding.TENSORFLOWLITE,
    "autodetect": Encoding.AUTODETECT,
    "ggml": Encoding.GGML,
    "neuralspeed": Encoding.NEURALSPEED,
    "whisper": Encoding.WHISPER,
    "mlx": Encoding.MLX,
    "piper": Encoding.PIPER,
    "chattts": Encoding.CHATTTS,
    "openvinogenai": Encoding.OPENVINOGENAI,
    "bitnet": Encoding.BITNET,
}
_TARGET_NAMES = {"cpu": Target.CPU, "gpu": Target.GPU, "tpu": Target.TPU, "auto": Target.AUTO}


class PreloadError(ValueError):
    """A malformed ``--nn-preload`` string; the message says what is accepted."""


@dataclass(frozen=True)
class Preload:
    """One preloaded model name."""

    name: str
    path: Path
    encoding: Encoding = Encoding.GGML
    target: Target = Target.AUTO
    mmproj: Path | None = None
    """The multimodal projector GGUF served with this name (host configuration only)."""

    def __str__(self) -> str:
        return f"{self.name}:{self.encoding.name}:{self.target.name}:{self.path}"


def parse_preload(spec: str) -> Preload:
    """Parse one ``NAME:ENCODING:TARGET:PATH`` string (see the module docstring)."""
    parts = spec.split(":")
    if len(parts) < 4:
        raise PreloadError(
            f"--nn-preload {spec!r}: expected NAME:ENCODING:TARGET:PATH, e.g. default:GGML:AUTO:model.gguf"
        )
    name, encoding_name, target_name = parts[0], parts[1].lower(), parts[2].lower()
    path = ":".join(parts[3:])
    if not name:
        raise PreloadError(f"--nn-preload {spec!r}: the NAME field is empty")
    if encoding_name not in _ENCODING_NAMES:
        raise PreloadError(
            f"--nn-preload {spec!r}: unknown encoding {parts[1]!r}; accepted: {', '.join(_ENCODING_NAMES)}"
        )
    if target_name not in _TARGET_NAMES:
        raise PreloadError(f"--nn-preload {spec!r}: unknown target {parts[2]!r}; accepted: cpu, gpu, tpu, auto")
    encoding = _ENCODING_NAMES[encoding_name]
    if encoding is not Encoding.GGML:
        raise PreloadError(f"--nn-preload {spec!r}: encoding {parts[1]!r} is not supported; this host runs GGML only")
    if not path:
        raise PreloadError(f"--nn-preload {spec!r}: the PATH field is empty")
    return Preload(name, Path(path), encoding, _TARGET_NAMES[target_name])
