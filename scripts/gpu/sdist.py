#!/usr/bin/env python3
"""llama-cpp-python's source distribution, made fit for the GPU builds of ``scripts/gpu/``.

The pinned release's sdist (0.3.36: 76.6 MB) carries a git pack of llama.cpp's history, its test
vocabularies, documentation and benchmark results, none of which a build reads, and which would take most
of ``prepare_device.sh``'s size limit. ``slim`` rewrites it without them (9.2 MB) and, with
``--vulkan-guard``, guards the one block of ``ggml-vulkan.cpp`` that needs ``VK_EXT_layer_settings``
(used only to switch on validation layers) so that Debian 12's Vulkan headers (1.3.239), which lack
that extension, build it. The guard is applied to the unpacked copy only, never to the product's own
CPU build.

Usage::

    python3 scripts/gpu/sdist.py fetch DIR                 # pip download the pinned sdist into DIR (cached)
    python3 scripts/gpu/sdist.py slim SRC DEST [--vulkan-guard]
"""

from __future__ import annotations

import argparse
import io
import pathlib
import subprocess
import sys
import tarfile

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
TOP = f"llama_cpp_python-{VERSION}/"
VENDOR = TOP + "vendor/llama.cpp/"
DROPPED = (
    TOP + ".git/",  # llama.cpp's history (39 MB): the commit is known from the version table instead
    VENDOR + "models/",  # tokenizer test vocabularies (78 MB)
    VENDOR + "docs/",  # per-backend op tables (39 MB)
    VENDOR + "benches/",
    VENDOR + "media/",
    VENDOR + "tools/ui/",  # the server's web UI (not built: LLAMA_BUILD_TOOLS is off under llama-cpp-python)
    VENDOR + ".github/",
)
VULKAN_SOURCE = VENDOR + "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
GUARD_START = "    VkBool32 enable_best_practice = layer_settings;\n"
GUARD_END = (
    "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, "
    "&layer_setting_info);\n"
)
FALLBACK = (
    "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n"
)


def fetch(directory: pathlib.Path) -> pathlib.Path:
    """The pinned sdist in ``directory``, downloaded by pip unless it is there already."""
    path = directory / SDIST
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
            + ["-d", str(directory), f"llama-cpp-python=={VERSION}"],
            check=True,
        )
    return path


def guard_vulkan(source: str) -> str:
    """``ggml-vulkan.cpp`` with its ``VK_EXT_layer_settings`` block under ``#if defined(...)``."""
    start, end = source.find(GUARD_START), source.find(GUARD_END)
    if start < 0 or end < start:
        raise SystemExit(f"{VULKAN_SOURCE}: the layer-settings block was not found (another llama.cpp?)")
    end += len(GUARD_END)
    return (
        source[:start]
        + "#if defined(VK_EXT_layer_settings)\n"
        + source[start:end]
        + "#else\n"
        + FALLBACK
        + "#endif\n"
        + source[end:]
    )


def slim(src: pathlib.Path, dest: pathlib.Path, vulkan_guard: bool) -> None:
    """Copy ``src`` to ``dest`` without :data:`DROPPED`, the Vulkan guard applied if asked."""
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(src, "r:gz") as tin, tarfile.open(tmp, "w:gz", compresslevel=6) as tout:
        for member in tin:
            if member.name.startswith(DROPPED) or member.name + "/" in DROPPED:
                continue
            data = tin.extractfile(member) if member.isfile() else None
            if data is not None and member.name == VULKAN_SOURCE and vulkan_guard:
                patched = guard_vulkan(data.read().decode()).encode()
                member.size = len(patched)
                data = io.BytesIO(patched)
            tout.addfile(member, data)
    tmp.replace(dest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fetch_p = sub.add_parser("fetch", help="download the pinned sdist into DIR (once)")
    fetch_p.add_argument("directory", type=pathlib.Path)
    slim_p = sub.add_parser("slim", help="write SRC without what no build reads to DEST")
    slim_p.add_argument("src", type=pathlib.Path)
    slim_p.add_argument("dest", type=pathlib.Path)
    slim_p.add_argument("--vulkan-guard", action="store_true", help="guard the VK_EXT_layer_settings block")
    args = parser.parse_args()
    if args.command == "fetch":
        print(fetch(args.directory))
    else:
        slim(args.src, args.dest, args.vulkan_guard)
    return 0


if __name__ == "__main__":
    sys.exit(main())
