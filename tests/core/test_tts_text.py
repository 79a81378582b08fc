"""OuteTTS text normalisation, prompt pieces, speaker files and the WAV writer (issue 32), without a model.

The expected strings are what llama.cpp's ``tts`` tool (``process_text``, ``number_to_words``,
``audio_text_from_speaker``, ``audio_data_from_speaker``) produces for the same input.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from wasinn_host.core.errors import WasiNNError
from wasinn_host.core.tts.audio import MUTED, speech_wav, wav_bytes
from wasinn_host.core.tts.prompt import audio_codes, parse_speaker, prompt_pieces, tts_version
from wasinn_host.core.tts.speaker import default_speaker_words
from wasinn_host.core.tts.text import normalize_text, number_to_words

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("number", "words"),
    [
        ("0", "zero"),
        ("7", "seven"),
        ("42", "forty-two"),
        ("100", "one hundred "),
        ("1234", "one thousand two hundred thirty-four"),
        ("2000000001", "two billion one"),
        ("3.14", "three point one four"),
        ("2147483648", " "),  # beyond std::stoi: the tool's fallback
    ],
)
def test_number_to_words(number: str, words: str) -> None:
    assert number_to_words(number) == words


def test_normalize_text_as_the_tool_does() -> None:
    text = "Hello, World! It's 3.5 m/s -- café_bar\tok.".encode()
    expected = b"hello world its three point five m s caf bar ok"
    assert normalize_text(text, b" ") == expected
    assert normalize_text(text, b"<|text_sep|>") == expected.replace(b" ", b"<|text_sep|>")
    assert normalize_text(b"  \n ", b"<|space|>") == b""


def test_prompt_pieces_02_and_03() -> None:
    words = (("hi", 0.125, (1, 22)),)
    assert prompt_pieces(b"Go 2", words, "0.2") == [
        b"<|im_start|>\n",
        b"<|text_start|>hi<|text_sep|>",
        b"go<|text_sep|>two",
        b"<|text_end|>\n",
        b"<|audio_start|>\nhi<|t_0.12|><|code_start|><|1|><|22|><|code_end|>\n",
    ]
    assert prompt_pieces(b"Go 2", words, "0.3")[1:] == [
        b"<|text_start|>hi<|space|>",
        b"go<|space|>two",
        b"<|text_end|>\n",
        b"<|audio_start|>\nhi<|t_0.12|><|1|><|22|><|space|>\n",
    ]


def test_version_from_speaker_then_template() -> None:
    assert tts_version("0.3", None) == "0.3"
    assert tts_version("0.2", "outetts-0.3") == "0.2"
    assert tts_version(None, "outetts-0.3") == "0.3"
    assert tts_version(None, None) == tts_version(None, "chatml") == "0.2"


def test_speaker_files() -> None:
    words, version = parse_speaker(b'{"version": "0.3", "words": [{"word": "a", "duration": 1, "codes": [4]}]}', "s")
    assert (words, version) == ((("a", 1.0, (4,)),), "0.3")
    for bad in (b"[]", b"{", b'{"words": {}}', b'{"words": [{"word": "a", "duration": 1, "codes": ["4"]}]}'):
        with pytest.raises(WasiNNError, match="tts-speaker-file 's' is not a speaker profile"):
            parse_speaker(bad, "s")


def test_default_speaker_is_wasmedges_en_female_1() -> None:
    words = default_speaker_words()
    assert len(words) == 40 and words[0][:2] == ("uhm", 0.36) and words[-1][0] == "itself"
    assert words[0][2][:3] == (447, 223, 967) and words[-1][2][-1] == 733


def test_audio_codes_are_the_4101_tokens_from_the_first_code() -> None:
    assert audio_codes([5, 100, 101, 4200, 4201, 99], 100) == [0, 1, 4100]


def test_wav_header_and_samples() -> None:
    wav = wav_bytes(np.array([0.0, 0.5, -1.0, 2.0, -2.0, np.nan]))
    assert wav[:4] == b"RIFF" and struct.unpack("<I", wav[4:8]) == (36 + 12,)
    assert struct.unpack("<HHIIHH", wav[20:36]) == (1, 1, 24000, 48000, 2, 16)
    assert struct.unpack("<6h", wav[44:]) == (0, 16383, -32767, 32767, -32768, 0)


def test_speech_has_320_samples_per_code_and_a_muted_start() -> None:
    frames = np.random.default_rng(0).standard_normal((30, 1282)).astype(np.float32)
    samples = np.frombuffer(speech_wav(frames)[44:], dtype="<i2")
    assert len(samples) == 30 * 320 and not samples[:MUTED].any() and samples[MUTED:].any()
