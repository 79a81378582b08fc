"""The OuteTTS prompt of a TTS graph (``tts: true``), as llama.cpp's ``tts`` tool and WasmEdge's plugin build it.

The prompt is five pieces, each tokenized on its own with special tokens parsed (only the first adds the
model's BOS, if it has one)::

    <|im_start|>\\n
    <|text_start|>WORD<sep>WORD<sep>...            the speaker's words
    the guest's text, normalised (text.py)
    <|text_end|>\\n
    <|audio_start|>\\nWORD<|t_D.DD|>[<|code_start|>]<|C|><|C|>...<end>\\n ...   the speaker's words and codes

OuteTTS 0.2 separates words with ``<|text_sep|>`` and wraps each word's codes in ``<|code_start|>`` ...
``<|code_end|>``; 0.3 uses ``<|space|>`` for both and has no ``<|code_start|>``.  The version is the speaker
file's ``version`` (``"0.2"`` or ``"0.3"``), else ``0.3`` for a model whose chat template is ``outetts-0.3``,
else 0.2 (the tool's rule).  Without a speaker file the speaker is WasmEdge's default (``speaker.py``).

A speaker file is OuteTTS's JSON: ``{"words": [{"word": "the", "duration": 0.08, "codes": [257, 740]}, ...]}``
(other keys are ignored).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import orjson

from ..errors import invalid
from .speaker import default_speaker_words
from .text import normalize_text

MAX_SPEAKER_BYTES = 4 << 20
"""The largest speaker file read (OuteTTS's are about 20 KB)."""
FIRST_CODE_TOKEN = b"<|0|>"
N_CODE_TOKENS = 4101
"""Tokens ``<|0|>`` .. ``<|4100|>``: the ids 151672..155772 that llama.cpp's tool and WasmEdge keep as audio codes."""

Word = tuple[str, float, tuple[int, ...]]


def parse_speaker(data: bytes, path: str) -> tuple[tuple[Word, ...], str | None]:
    """A speaker file's words and its ``version`` (None if absent or not 0.2/0.3); invalid argument if malformed."""
    expected = 'expected OuteTTS speaker JSON {"words": [{"word": str, "duration": number, "codes": [int, ...]}]}'
    try:
        doc = orjson.loads(data)
        words = doc["words"]
        if not isinstance(words, list):
            raise TypeError("words is not an array")
        out = tuple(_word(item) for item in words)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise invalid(f"tts-speaker-file {path!r} is not a speaker profile ({exc}); {expected}") from None
    version = doc.get("version")
    return out, version if version in ("0.2", "0.3") else None


def _word(item: Any) -> Word:
    word, duration, codes = item["word"], item["duration"], item["codes"]
    if not isinstance(word, str) or isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise TypeError(f"entry {str(item)[:60]} has no string word and numeric duration")
    if not isinstance(codes, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
        raise TypeError(f"word {word!r}: codes is not an array of integers")
    return word, float(duration), tuple(codes)


def tts_version(speaker_version: str | None, chat_template: str | None) -> str:
    """``"0.2"`` or ``"0.3"``: the speaker file's, else the model's (chat template ``outetts-0.3``), else 0.2."""
    if speaker_version is not None:
        return speaker_version
    return "0.3" if chat_template == "outetts-0.3" else "0.2"


def prompt_pieces(text: bytes, words: Sequence[Word], version: str) -> list[bytes]:
    """The five prompt pieces for ``text`` spoken by the speaker of ``words`` (see the module docstring)."""
    separator = b"<|space|>" if version == "0.3" else b"<|text_sep|>"
    code_start, code_end = (b"", b"<|space|>") if version == "0.3" else (b"<|code_start|>", b"<|code_end|>")
    audio_text = b"<|text_start|>" + b"".join(word.encode() + separator for word, _, _ in words)
    audio_data = b"<|audio_start|>\n" + b"".join(
        word.encode()
        + f"<|t_{duration:.2f}|>".encode()
        + code_start
        + b"".join(b"<|%d|>" % code for code in codes)
        + code_end
        + b"\n"
        for word, duration, codes in words
    )
    return [b"<|im_start|>\n", audio_text, normalize_text(text, separator), b"<|text_end|>\n", audio_data]


def code_token_base(tokenize: Callable[[bytes, bool, bool], list[int]], label: str) -> int:
    """The id of ``<|0|>`` in the model's vocabulary; invalid argument if it has no such single token."""
    ids = tokenize(FIRST_CODE_TOKEN, False, True)
    if len(ids) != 1:
        raise invalid(
            f"config key 'tts': model {label} is not an OuteTTS model: its vocabulary has no "
            f"{FIRST_CODE_TOKEN.decode()} audio-code token"
        )
    return ids[0]


def tts_prompt_tokens(
    tokenize: Callable[[bytes, bool, bool], list[int]],
    chat_template: str | None,
    text: bytes,
    speaker: tuple[bytes, str] | None,
    label: str,
) -> list[int]:
    """The prompt's tokens; ``speaker`` is the speaker file's (bytes, guest path), None for the default."""
    code_token_base(tokenize, label)
    words, version = parse_speaker(*speaker) if speaker is not None else (default_speaker_words(), None)
    pieces = prompt_pieces(text, words, tts_version(version, chat_template))
    tokens: list[int] = []
    for index, piece in enumerate(pieces):
        tokens += tokenize(piece, index == 0, True)
    return tokens


def audio_codes(tokens: Sequence[int], base: int) -> list[int]:
    """The audio codes among generated ``tokens`` (ids ``base`` .. ``base + 4100``, minus ``base``), in order."""
    return [token - base for token in tokens if base <= token < base + N_CODE_TOKENS]
