"""The built-in test models by name: what each one is, what output to expect, and how to write it.

``successor`` and ``random`` are written by :mod:`wasinn_host.testing.gguf_models`, ``tts`` (an
OuteTTS-shaped model) and ``vocoder`` (the WavTokenizer decoder a TTS graph's ``model-vocoder`` names)
by :mod:`wasinn_host.testing.tts_models`; both need the ``gguf`` package (``pip install
'wasinn-host[models]'``; without it :class:`ModelToolsMissing` says so in one line).  ``demo`` is the
model shipped in :mod:`wasinn_host.models`, copied.  ``wasinn model`` writes them on the command line;
:class:`ModelFiles` gives the ``wasinn_run`` pytest fixture a file for a model name (and the
``wasinn_model_file`` fixture the same file, e.g. the vocoder to put in a guest's directory), writing
each built-in at most once and letting ``--wasinn-model NAME=PATH`` replace any name.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Union

from ..models import DEMO_MODEL_PATH

MODELS_EXTRA = "pip install 'wasinn-host[models]'"

ModelSpec = Union[str, "os.PathLike[str]"]
"""A built-in model's name, a name given a file with ``--wasinn-model``, or the path of a GGUF file."""


class ModelToolsMissing(RuntimeError):
    """The ``gguf`` package, which writes the successor, random, tts and vocoder models, is not installed."""


class UnknownModel(ValueError):
    """A model name that is neither built in, nor given a file, nor a path."""


@dataclass(frozen=True)
class BuiltinModel:
    """One built-in test model."""

    name: str
    summary: str
    """What it is."""
    expect: str
    """What output a guest gets from it."""
    write: Callable[..., Path]
    """``write(path, **options)`` writes it and returns the path."""


def _gguf_missing(name: str, exc: ModuleNotFoundError) -> ModelToolsMissing:
    """:class:`ModelToolsMissing` for a writer whose import failed for want of ``gguf``; anything else re-raised."""
    if exc.name != "gguf":
        raise exc
    return ModelToolsMissing(f"writing the {name} model needs the gguf package, which is not installed: {MODELS_EXTRA}")


def _gguf_models(name: str) -> ModuleType:
    """:mod:`.gguf_models`, or :class:`ModelToolsMissing` when the ``gguf`` package is not there."""
    try:
        from . import gguf_models
    except ModuleNotFoundError as exc:
        raise _gguf_missing(name, exc) from None
    return gguf_models


def _tts_models(name: str) -> ModuleType:
    """:mod:`.tts_models`, or :class:`ModelToolsMissing` when the ``gguf`` package is not there."""
    try:
        from . import tts_models
    except ModuleNotFoundError as exc:
        raise _gguf_missing(name, exc) from None
    return tts_models


def _write_successor(path: str | os.PathLike[str], **options: Any) -> Path:
    written: Path = _gguf_models("successor").write_successor_model(path, **options)
    return written


def _write_random(path: str | os.PathLike[str], **options: Any) -> Path:
    written: Path = _gguf_models("random").write_random_model(path, **options)
    return written


def _write_tts(path: str | os.PathLike[str], **options: Any) -> Path:
    written: Path = _tts_models("tts").write_outetts_model(path, **options)
    return written


def _write_vocoder(path: str | os.PathLike[str], **options: Any) -> Path:
    written: Path = _tts_models("vocoder").write_wavtokenizer_model(path, **options)
    return written


def _write_demo(path: str | os.PathLike[str]) -> Path:
    """Copy the embedded demo model to ``path`` (atomically, as the writers do)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.copyfile(DEMO_MODEL_PATH, tmp)
    os.replace(tmp, out)
    return out


TTS_WAV_SAMPLES = 320 * 40
"""Samples in the WAV of the ``tts`` model's 40 audio codes through the ``vocoder`` model (320 per code)."""

BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            "successor",
            "hand-built bigram model (354-token character vocabulary, 1 layer, about 4 MB): "
            "each character predicts its successor; built in well under a second",
            "greedy output known in advance: after 'a' comes 'bcdefghijklmnopqrstuvwxyz' and then end of "
            "sequence (a guest printing the EOG piece shows '</s>'); 'A'..'Z' likewise; digits cycle "
            "'7' -> '8901234567...' until n_predict or the context (512) ends it; any other character, "
            "and 'z' or 'Z', ends at once",
            _write_successor,
        ),
        BuiltinModel(
            "demo",
            "the embedded demo model (wasinn_host/models/demo-arith.gguf: 0.73 M parameters, 1.5 MB, "
            "trained on 1-3 digit addition and subtraction in ChatML conversations; a ChatML chat template)",
            "the number and '<|im_end|>' for a 1-3 digit sum or difference asked in the last user turn of a "
            "ChatML conversation: 'What is 12+30?' -> '42<|im_end|>' (the bare '12-30=' -> '-18<|im_end|>'); at "
            "least 97.5 % of held-out problems right; anything else gives arbitrary short text",
            _write_demo,
        ),
        BuiltinModel(
            "random",
            "seeded random-weight llama for load and throughput tests (default 12 layers, d=768, "
            "about 86 M parameters, 171 MB in F16, context 2048; a few seconds to write)",
            "arbitrary text, the same for the same options (greedy output is deterministic); "
            "a decode step costs milliseconds, so generation runs until n_predict or the context ends it",
            _write_random,
        ),
        BuiltinModel(
            "tts",
            "OuteTTS-shaped bigram llama for text-to-speech guests (OuteTTS's special tokens and 64 audio codes "
            '<|0|>..<|63|>, 1 layer, 5.1 MB, context 8192): load it with "tts": true and the vocoder model as '
            '"model-vocoder", as WasmEdge\'s tts example does',
            "whatever the text, speaker and seed, the 40 audio codes <|17|><|54|><|27|><|0|>... ((17 + 37 i) mod 64) "
            "and end of generation (output_tokens 40); with the vocoder model, compute gives a 24 kHz 16-bit mono "
            f"WAV of {TTS_WAV_SAMPLES:,} samples ({TTS_WAV_SAMPLES / 24000:.3f} s, {44 + 2 * TTS_WAV_SAMPLES:,} "
            "bytes), the first 6,000 (0.25 s) silent, the rest the vocoder's noise; the same bytes each run on one "
            "machine. Without a speaker file the prompt is about 7,300 tokens (WasmEdge's default speaker), so "
            "a short text fits a context of 8192",
            _write_tts,
        ),
        BuiltinModel(
            "vocoder",
            "tiny WavTokenizer decoder (wavtokenizer-dec, seeded random weights, 64-code book, 1282 outputs per "
            "code, 1.0 MB): the file a TTS graph's model-vocoder names, inside the guest's directories; not "
            "a model to preload",
            "noise, not speech: 320 samples per audio code, the same for the same codes and seed",
            _write_vocoder,
        ),
    )
}


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.endswith(".gguf")


class ModelFiles:
    """Model names to GGUF files for one test session.

    A name given a file in ``overrides`` (``--wasinn-model NAME=PATH``) gets that file; a built-in
    name is written into ``directory`` on first use and reused; anything that looks like a path
    (it contains ``/`` or ends in ``.gguf``) is taken as one, a missing file included (the guest's
    ``load_by_name`` then gets ModelNotFound, as with ``wasinn run``).
    """

    def __init__(self, directory: Path, overrides: Mapping[str, Path] | None = None) -> None:
        self.directory = directory
        self.overrides = dict(overrides or {})
        self._built: dict[str, Path] = {}
        self._lock = threading.Lock()

    def path(self, model: ModelSpec) -> Path:
        """The GGUF file serving ``model``."""
        if not isinstance(model, str):
            return Path(model)
        if model in self.overrides:
            return self.overrides[model]
        builtin = BUILTIN_MODELS.get(model)
        if builtin is not None:
            with self._lock:
                if model not in self._built:
                    self._built[model] = builtin.write(self.directory / f"{model}.gguf")
                return self._built[model]
        if _looks_like_path(model):
            return Path(model)
        raise UnknownModel(
            f"model {model!r} is not a built-in test model ({', '.join(BUILTIN_MODELS)}), a name given a file "
            f"with --wasinn-model {model}=PATH, or a path to a GGUF file"
        )


def parse_override(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` (``--wasinn-model``) to (name, path); ValueError with a one-line message."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--wasinn-model {spec!r}: expected NAME=PATH, e.g. demo=models/llama.gguf")
    if not Path(path).is_file():
        raise ValueError(f"--wasinn-model {spec!r}: {path!r} is not a file")
    return name, Path(path).resolve()
