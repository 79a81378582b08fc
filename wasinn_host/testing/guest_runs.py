"""Running the example guests of ``guest_examples/`` in tests: output, errors and exit code."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from ..host import RunOptions, WasiNN

GUESTS = pathlib.Path(__file__).resolve().parents[2] / "guest_examples"
"""The example guests (present in a source checkout, not in an installed wheel)."""


def run_guest(
    nn: WasiNN,
    tmp_path: pathlib.Path,
    name: str,
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    dirs: list[tuple[str, str]] | None = None,
) -> tuple[int, str, str]:
    """Run ``guest_examples/NAME.wasm``; its exit code, stdout and stderr."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    options = RunOptions(env=env or {}, dirs=dirs or [], stdout=str(out), stderr=str(err))
    if stdin is not None:
        (tmp_path / "stdin.txt").write_text(stdin)
        options.stdin = str(tmp_path / "stdin.txt")
    code = nn.run(GUESTS / f"{name}.wasm", args, options)
    return code, out.read_text(), err.read_text()


def wasinn_cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m wasinn_host run ARGS`` from the checkout's root (text output, undecodable bytes replaced)."""
    return subprocess.run(
        [sys.executable, "-m", "wasinn_host", "run", *args],
        capture_output=True,
        text=True,
        errors="replace",
        cwd=GUESTS.parent,
        timeout=timeout,
        input=stdin,
        env={**os.environ, **env} if env is not None else None,
        check=False,
    )
