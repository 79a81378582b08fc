"""Why a model file cannot be loaded, in whole words: the path checked before llama.cpp, and
llama.cpp's own log lines turned into one readable cause.

As WasmEdge: a path where nothing is is ModelNotFound (103); anything else llama.cpp cannot
load (a directory, a file that is not GGUF) is an invalid argument (1).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from .errors import ErrorKind, WasiNNError

CAUSE_LIMIT = 300
"""Most characters of llama.cpp's cause kept in a message (whole lines; one long line is cut at a word)."""
_PREFIX = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|error loading model): ")
"""A function name or llama.cpp's wrapper before the reason itself."""
_GENERIC = "failed to load model"
"""llama.cpp's closing lines: they add nothing to "could not load model file"."""


def path_problem(path: Path) -> tuple[ErrorKind, str] | None:
    """What is wrong with ``path`` as a model file, with the kind of error it is, or None for a file."""
    if path.is_file():
        return None
    if not path.exists():
        return ErrorKind.MODEL_NOT_FOUND, "does not exist"
    what = "a directory" if path.is_dir() else "not a regular file"
    return ErrorKind.INVALID_ARGUMENT, f"is {what}, not a GGUF model file"


def check_model_path(path: Path, what: str = "") -> None:
    """Raise if ``path`` cannot be a model file; ``what`` follows the path in the message (``" for name 'x'"``)."""
    problem = path_problem(path)
    if problem is not None:
        raise WasiNNError(problem[0], f"model file {str(path)!r}{what} {problem[1]}")


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
