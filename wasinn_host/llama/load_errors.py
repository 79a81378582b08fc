"""Why llama.cpp could not load a model file, in whole words: its own log lines turned into one
readable cause (the path itself is checked before, by :mod:`wasinn_host.core.config.model_path`).

As WasmEdge: a file llama.cpp cannot load (not GGUF, truncated) is an invalid argument (1).
"""

from __future__ import annotations

import re
from typing import Sequence

CAUSE_LIMIT = 300
"""Most characters of llama.cpp's cause kept in a message (whole lines; one long line is cut at a word)."""
_PREFIX = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|error loading model): ")
"""A function name or llama.cpp's wrapper before the reason itself."""
_GENERIC = "failed to load model"
"""llama.cpp's closing lines: they add nothing to "could not load model file"."""


def load_failure_cause(lines: Sequence[str], limit: int = CAUSE_LIMIT) -> str:
    """llama.cpp's warnings and errors of a failed load as one readable cause: function-name prefixes
    and generic wrapper lines dropped, repeats removed, whole lines up to ``limit`` characters."""
    reasons: list[str] = []
    for line in lines:
        text = line.strip()
        while _PREFIX.match(text):
            text = _PREFIX.sub("", text, count=1)
        if text and text not in reasons and not text.startswith(_GENERIC):
            reasons.append(text)
    if not reasons:
        return "not a valid GGUF model"
    cause = reasons[0]
    if len(cause) > limit:
        cut = cause.rfind(" ", 0, limit - 3)
        return cause[: cut if cut > 0 else limit - 3] + "..."
    for reason in reasons[1:]:
        if len(cause) + 2 + len(reason) > limit:
            break
        cause += "; " + reason
    return cause
