"""Whether a path can be a model file, checked before any backend opens it.

As WasmEdge: a path where nothing is is ModelNotFound (103); anything else that is not a regular
file (a directory, a device) is an invalid argument (1).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ErrorKind, WasiNNError


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
