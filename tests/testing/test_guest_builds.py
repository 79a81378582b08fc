"""The committed guest_examples/*.wasm must match a fresh build of their C sources."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "tools" / "build_guests.py"


def test_committed_guest_wasm_matches_sources() -> None:
    # The first build on a machine compiles zig's wasi-libc (about 30 s or more).
    proc = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, (
        "guest_examples/*.wasm are stale; run `python scripts/tools/build_guests.py`\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
