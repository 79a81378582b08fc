"""Check an untrusted GGUF file in a child process before this process loads it.

Some malformed files (a duplicate token string, for example) make llama.cpp abort the
whole process, which no Python ``try`` can catch.  Models that guests send as bytes are
therefore first loaded by ``python -m wasinn_host.llama.model_check FILE`` in a child: if the
child dies, the guest gets an invalid-argument error and this process goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..core.errors import ErrorKind, WasiNNError

CHECK_TIMEOUT_S = 120


def check_model_file(path: Path) -> None:
    """Raise an invalid-argument error naming the cause if llama.cpp cannot load ``path`` (tried in a child process)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "wasinn_host.llama.model_check", str(path)],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise WasiNNError(
            ErrorKind.INVALID_ARGUMENT, f"model check of {str(path)!r} took over {CHECK_TIMEOUT_S} s"
        ) from None
    if proc.returncode == 0:
        return
    detail = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-1:]
    cause = detail[0] if detail else f"exit status {proc.returncode}"
    if proc.returncode < 0:
        cause = f"llama.cpp aborted (signal {-proc.returncode}) while loading it: {cause}"
    raise WasiNNError(ErrorKind.INVALID_ARGUMENT, f"model rejected: {cause}")


def _main(path: str) -> int:
    from .bindings import llama_cpp
    from .load_errors import load_failure_cause
    from .log import capture_llama_log, init_backend

    init_backend()
    params = llama_cpp.llama_model_default_params()
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
    with capture_llama_log() as lines:
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        print(load_failure_cause(lines))
        return 1
    llama_cpp.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
