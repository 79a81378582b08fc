#!/usr/bin/env python3
"""Build the C example guests in ``guest_examples/`` into wasm32-wasi modules.

Every ``guest_examples/*.c`` is compiled on its own (the ``.h`` files next to
it are included, not built) into ``<out-dir>/<name>.wasm`` with zig's bundled
clang and wasi-libc::

    python -m ziglang cc --target=wasm32-wasi -O2 -s -Wall -Wextra -Werror -o OUT SRC

The build runs from the repository root with repository-relative source paths
and strips all custom sections (``-s``), so the output does not depend on where
the checkout lives and is byte-identical from one build to the next for a given
ziglang version (pinned as ``PINNED_ZIG_VERSION``; keep it in sync with
pyproject.toml, since another zig gives other bytes).

Usage::

    python scripts/tools/build_guests.py                 # build into guest_examples/
    python scripts/tools/build_guests.py --out-dir DIR   # build elsewhere
    python scripts/tools/build_guests.py --check         # verify committed .wasm files

``--check`` builds into a temporary directory and compares each result with
the ``.wasm`` in the output directory; it exits 1 listing every module that
differs or is missing, and every ``.wasm`` there that has no ``.c`` source.
The first build per machine takes ~30 s while zig builds its libc (cached in
zig's global cache afterwards).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUEST_DIR = ROOT / "guest_examples"
PINNED_ZIG_VERSION = "0.17.0"
CFLAGS: tuple[str, ...] = (
    "--target=wasm32-wasi",
    "-O2",
    "-s",
    "-Wall",
    "-Wextra",
    "-Werror",
)


def zig_cmd() -> list[str]:
    """The command prefix that runs zig from the ziglang wheel."""
    return [sys.executable, "-m", "ziglang"]


def zig_version() -> str | None:
    """The installed ziglang's version, or None when ziglang is missing."""
    proc = subprocess.run([*zig_cmd(), "version"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def guest_sources(src_dir: Path = GUEST_DIR) -> list[Path]:
    """All guest C sources, sorted by name."""
    return sorted(src_dir.glob("*.c"))


def build_one(src: Path, out: Path) -> None:
    """Compile one guest source into ``out``; raise CalledProcessError on failure."""
    try:
        rel_src = src.resolve().relative_to(ROOT)
    except ValueError:
        rel_src = src
    subprocess.run(
        [*zig_cmd(), "cc", *CFLAGS, "-o", str(out.resolve()), str(rel_src)],
        cwd=ROOT,
        check=True,
    )


def build_all(out_dir: Path, quiet: bool = False) -> list[Path]:
    """Build every guest into ``out_dir``; return the module paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs: list[Path] = []
    for src in guest_sources():
        out = out_dir / f"{src.stem}.wasm"
        build_one(src, out)
        outputs.append(out)
        if not quiet:
            print(f"{out.name}: {out.stat().st_size} bytes")
    return outputs


def compare_builds(out_dir: Path, fresh: list[Path]) -> list[str]:
    """What differs between the committed ``.wasm`` files in ``out_dir`` and a fresh build of them
    (printing the ones that match); also used by ``build_components.py``."""
    problems: list[str] = []
    for new in fresh:
        committed = out_dir / new.name
        if not committed.is_file():
            problems.append(f"{committed}: missing")
        elif committed.read_bytes() != new.read_bytes():
            problems.append(
                f"{committed}: differs from a fresh build ({committed.stat().st_size} vs {new.stat().st_size} bytes)"
            )
        else:
            print(f"{new.name}: ok ({new.stat().st_size} bytes)")
    expected = {p.name for p in fresh}
    problems += [f"{p}: no matching .c source" for p in sorted(out_dir.glob("*.wasm")) if p.name not in expected]
    return problems


def check(out_dir: Path) -> int:
    """Rebuild into a temp dir and compare with ``out_dir``; return an exit status."""
    with tempfile.TemporaryDirectory(prefix="build_guests_") as tmp:
        problems = compare_builds(out_dir, build_all(Path(tmp), quiet=True))
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        version = zig_version()
        if version != PINNED_ZIG_VERSION:
            print(
                f"note: ziglang {version} is installed, the modules are built with {PINNED_ZIG_VERSION}",
                file=sys.stderr,
            )
        print("rebuild with: python scripts/tools/build_guests.py", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build guest_examples/*.c into wasm32-wasi modules with zig cc.",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=GUEST_DIR,
        help="where the .wasm files go (default: guest_examples/)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="rebuild into a temp dir and fail if any .wasm in --out-dir differs",
    )
    args = parser.parse_args(argv)

    version = zig_version()
    if version is None:
        print(
            f"error: ziglang is not installed (pip install ziglang=={PINNED_ZIG_VERSION})",
            file=sys.stderr,
        )
        return 2
    if version != PINNED_ZIG_VERSION:
        print(
            f"warning: ziglang {version} != pinned {PINNED_ZIG_VERSION}; output will not match the committed modules",
            file=sys.stderr,
        )
    try:
        if args.check:
            return check(args.out_dir)
        build_all(args.out_dir)
    except subprocess.CalledProcessError as exc:
        print(f"error: build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
