"""wasmtime's errors in one line: what a user or a guest's trap message shows of them."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The informative line of a wasmtime error: its cause, not the backtrace header."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if "Caused by:" in lines and lines.index("Caused by:") + 1 < len(lines):
        return lines[lines.index("Caused by:") + 1]
    for line in lines:
        if line.startswith("wasm trap:"):
            return line
    return lines[0] if lines else type(exc).__name__
