"""OuteTTS text normalisation: a prompt's text as llama.cpp's ``tts`` tool and WasmEdge's GGML plugin give it.

Steps, on the UTF-8 bytes (as the C++ does on its ``std::string``):

1. Each number (``[0-9]+(\\.[0-9]+)?``) becomes English words: ``1234`` -> ``one thousand two hundred
   thirty-four``, ``3.14`` -> ``three point one four``; an integer part beyond 2,147,483,647 (where
   ``std::stoi`` throws) becomes a space.
2. ASCII letters are lower-cased.
3. ``- _ / , . \\`` become spaces; every other byte that is not ``a``-``z`` or white space is dropped
   (so are all non-ASCII characters: no romanisation, English only, as in llama.cpp).
4. Runs of white space become one space, the ends are trimmed, and each space becomes the version's word
   separator token: ``<|text_sep|>`` (OuteTTS 0.2) or ``<|space|>`` (0.3).
"""

from __future__ import annotations

import re

INT_MAX = 2**31 - 1
ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
TENS = {2: "twenty", 3: "thirty", 4: "forty", 5: "fifty", 6: "sixty", 7: "seventy", 8: "eighty", 9: "ninety"}
_NUMBER = re.compile(rb"[0-9]+(\.[0-9]+)?")
_SPECIAL = re.compile(rb"[-_/,.\\]")
_NON_ALPHA = re.compile(rb"[^a-z\s]")
_SPACES = re.compile(rb"\s+")


def _below_thousand(num: int) -> str:
    """``num`` (0..999) in words, as the tool writes it (``one hundred `` keeps its trailing space)."""
    result = ""
    if num >= 100:
        result += ONES[num // 100] + " hundred "
        num %= 100
    if num >= 20:
        result += TENS[num // 10]
        if num % 10:
            result += "-" + ONES[num % 10]
    elif num > 0:
        result += ONES[num]
    return result


def number_to_words(number: str) -> str:
    """A number (digits, optionally ``.`` and digits) in English words."""
    whole, dot, fraction = number.partition(".")
    value = int(whole)
    if value > INT_MAX:
        return " "
    if value == 0:
        result = "zero"
    else:
        result = ""
        for scale, word in ((1_000_000_000, "billion"), (1_000_000, "million"), (1000, "thousand")):
            if value >= scale:
                result += _below_thousand(value // scale) + f" {word} "
                value %= scale
        if value > 0:
            result += _below_thousand(value)
    if dot:
        result += " point" + "".join(" " + ONES[int(digit)] for digit in fraction)
    return result


def normalize_text(text: bytes, separator: bytes) -> bytes:
    """``text`` as OuteTTS reads it: words of ``a``-``z`` joined by ``separator`` (see the module docstring)."""
    out = _NUMBER.sub(lambda m: number_to_words(m.group().decode()).encode(), text).lower()
    out = _NON_ALPHA.sub(b"", _SPECIAL.sub(b" ", out))
    out = _SPACES.sub(b" ", out).strip(b" \t\n\r\f\v")
    return out.replace(b" ", separator)
