"""A text-to-speech graph (``tts: true``): what the core does around an ordinary generation.

As in WasmEdge's GGML plugin (and llama.cpp's ``tts`` tool):

* **load**: ``tts`` needs ``model-vocoder``, a WavTokenizer GGUF the guest names inside its preopened
  directories (the front end resolves it: ``guest/files.py``); the backend loads it with the model
  (:func:`tts_model_params` checks the keys first; an invalid argument otherwise, as WasmEdge's load fails).
* **set_input**: the prompt is the OuteTTS prompt of the text (``prompt.py``), with the speaker of
  ``tts-speaker-file`` (read through the front end's :class:`FileAccess`) or the default one.
* **compute**: the model generates as for any prompt (sampling keys, ``n-predict``, stop rules); then the
  audio codes among the generated tokens go through the vocoder, the spectra become a 24 kHz WAV
  (``audio.py``) that replaces the output, and the file is written to ``tts-output-file``.  The
  output's token count becomes the number of codes, as WasmEdge reports it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol, Sequence

from ..config.params import ModelParams, PromptOptions
from ..errors import ErrorKind, WasiNNError, invalid
from .prompt import MAX_SPEAKER_BYTES, audio_codes, code_token_base, tts_prompt_tokens

log = logging.getLogger("wasinn_host")


class FileAccess(Protocol):
    """Files a guest names, resolved inside the directories it was given (``guest/files.py``)."""

    def read(self, path: str, limit: int, key: str) -> bytes:
        """The bytes of guest ``path`` (at most ``limit``); invalid argument if not mapped or unreadable."""

    def write(self, path: str, data: bytes, key: str) -> None:
        """Write guest ``path``; invalid argument if not mapped or unwritable."""


def tts_model_params(params: ModelParams) -> ModelParams:
    """``params`` checked for a TTS load: the vocoder must be a guest file; without ``tts`` it is ignored."""
    if not params.tts:
        return dataclasses.replace(params, vocoder="", vocoder_from_guest=False) if params.vocoder else params
    if not params.vocoder:
        raise invalid(
            "config key 'tts': text-to-speech needs 'model-vocoder', a WavTokenizer GGUF file inside the guest's "
            "preopened directories"
        )
    if not params.vocoder_from_guest:
        raise invalid(
            f"config key 'model-vocoder': {params.vocoder!r} is not a file inside the guest's preopened "
            "directories; map its directory with --dir"
        )
    return dataclasses.replace(params, vocoder_from_guest=False)


def _tokenizer(weights: Any) -> Any:
    return lambda text, add_special, parse_special: weights.tokenize(text, add_special, parse_special)


def tts_prompt(weights: Any, text: bytes, options: PromptOptions, files: FileAccess | None, label: str) -> list[int]:
    """The OuteTTS prompt tokens of ``text`` (the speaker file read through ``files``)."""
    speaker = None
    path = options.tts_speaker_file
    if path:
        if files is None:
            raise invalid(f"config key 'tts-speaker-file' {path!r}: this front end cannot read files")
        speaker = (files.read(path, MAX_SPEAKER_BYTES, "tts-speaker-file"), path)
    return tts_prompt_tokens(_tokenizer(weights), weights.chat_template(), text, speaker, label)


def speak(weights: Any, tokens: Sequence[int], label: str) -> tuple[bytes, list[int]]:
    """The WAV bytes of the audio codes among generated ``tokens``, and those codes' tokens; a runtime
    error if there are none or the vocoder fails."""
    from .audio import speech_wav  # numpy, for the graphs that speak

    base = code_token_base(_tokenizer(weights), label)
    codes = audio_codes(tokens, base)
    return speech_wav(weights.vocoder.frames(codes)), [code + base for code in codes]


def save_speech(wav: bytes, options: PromptOptions, files: FileAccess | None) -> None:
    """Write ``wav`` to ``tts-output-file`` (nothing without ``files``: a front end with no guest files); a
    runtime error if it cannot be written, as WasmEdge's compute fails then."""
    if files is None or not options.tts_output_file:
        return
    try:
        files.write(options.tts_output_file, wav, "tts-output-file")
    except WasiNNError as err:
        raise WasiNNError(ErrorKind.RUNTIME_ERROR, err.message) from None
