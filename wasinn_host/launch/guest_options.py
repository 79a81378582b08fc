"""What a guest is launched with, from the words ``wasinn run`` and the ``wasinn_run`` fixture take:
``--dir`` mappings, ``--env`` pairs, and the warning for a preloaded model file that is not there."""

from __future__ import annotations

import json
import logging
import os

from ..core.config.model_path import path_problem
from ..core.config.preload import Preload
from ..core.errors import ErrorKind


def parse_dir(spec: str) -> tuple[str, str]:
    """``--dir`` value to (host path, guest path)."""
    if "::" in spec:
        host, guest = spec.split("::", 1)
    elif ":" in spec:
        guest, host = spec.split(":", 1)
    else:
        host = guest = spec
    if not host or not guest:
        raise ValueError(f"--dir {spec!r}: expected PATH, GUEST:HOST or HOST::GUEST")
    if not os.path.isdir(host):
        raise ValueError(f"--dir {spec!r}: host directory {host!r} does not exist")
    return host, guest


def parse_env(spec: str) -> tuple[str, str]:
    """``--env`` value to (key, value)."""
    key, sep, value = spec.partition("=")
    if not sep or not key:
        raise ValueError(f"--env {spec!r}: expected KEY=VALUE")
    return key, value


def warn_missing_models(preloads: list[Preload]) -> None:
    """As WasmEdge: a missing model file is one warning; the guest runs and gets ModelNotFound (a
    directory: InvalidArgument)."""
    for preload in preloads:
        problem = path_problem(preload.path)
        if problem is not None:
            logging.getLogger("wasinn_host").warning(
                "--nn-preload %s: model file %s %s; load_by_name(%s) will fail with %s",
                preload.name,
                json.dumps(str(preload.path)),
                problem[1],
                json.dumps(preload.name),
                "ModelNotFound" if problem[0] is ErrorKind.MODEL_NOT_FOUND else "InvalidArgument",
            )
