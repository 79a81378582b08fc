"""``wasinn info``: what this installation can run on.

Versions (wasinn-host, llama-cpp-python, the linked llama.cpp commit and its release tag, ggml,
wasmtime), the ggml backends compiled in (CPU, CUDA, Metal, Vulkan ...), every device with its
free and total memory, whether layers can be offloaded to a GPU, and which of llama.cpp's extra CPU
weight layouts are in use (AMX turned off where the CPU probe found it crashes, :mod:`..llama.cpu_probe`);
as text, or as one JSON object with ``--json``.  A llama.cpp that cannot be loaded is one error line and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from typing import Any

from .. import __version__
from ..core.errors import WasiNNError
from ..llama.cpu_probe import POLICY_ENV
from .options import fail

INFO_EPILOG = """\
On a build without GPU offload, a guest's GPU target runs on the CPU (one warning says so).
To install a CUDA build (Metal: -DGGML_METAL=on, Vulkan: -DGGML_VULKAN=on):

  CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36
"""


def add_info_parser(commands: Any) -> None:
    """The ``info`` subcommand."""
    info = commands.add_parser(
        "info",
        help="show versions, compiled-in backends, devices and whether GPU offload works",
        description="Show the llama-cpp-python and llama.cpp versions, the ggml backends compiled in, "
        "the devices with their free memory, whether layers can be offloaded to a GPU, and the wasmtime version.",
        epilog=INFO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    info.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def collect_info() -> dict[str, Any]:
    """Everything ``wasinn info`` reports, JSON-ready."""
    import llama_cpp

    from ..llama import cpu_probe, devices
    from ..llama.log import init_backend
    from ..llama.offload import GPU_BUILD_HINT
    from ..llama.version import LLAMA_BUILD_NUMBER, LLAMA_COMMIT

    init_backend()
    offload = devices.can_offload()
    info: dict[str, Any] = {
        "wasinn_host": __version__,
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp": {"commit": LLAMA_COMMIT, "build_number": LLAMA_BUILD_NUMBER, "ggml": devices.ggml_version()},
        "wasmtime": importlib.metadata.version("wasmtime"),
        "backends": devices.backends(),
        "devices": [
            {
                "name": d.name,
                "description": d.description,
                "type": d.type,
                "backend": d.backend,
                "free_bytes": d.free_bytes,
                "total_bytes": d.total_bytes,
            }
            for d in devices.devices()
        ],
        "gpu_offload": offload,
        "multimodal": _has_libmtmd(),
        "cpu_layouts": cpu_probe.current().as_json(),
        "system_info": (llama_cpp.llama_print_system_info() or b"").decode("utf-8", "replace").strip(),
    }
    if not offload:
        info["gpu_hint"] = GPU_BUILD_HINT
    return info


def _has_libmtmd() -> bool:
    """Whether llama-cpp-python's libmtmd (images through a projector) loads."""
    try:
        from llama_cpp import mtmd_cpp

        return bool(mtmd_cpp.mtmd_default_marker())
    except (ImportError, OSError, AttributeError):
        return False


def _layouts_text(verdict: dict[str, Any]) -> str:
    """llama.cpp's extra CPU weight layouts: those in use, those turned off and why."""
    used = [n for n in verdict["available"] if n not in verdict["disabled"]]
    text = ", ".join(used) or "none"
    if verdict["disabled"]:
        text += f"; {' and '.join(verdict['disabled'])} off: {verdict['reason']}"
    elif verdict["source"] != "none":
        text += f" ({verdict['reason']})"
    return text + f" [{POLICY_ENV}=on|off forces AMX]" if verdict["available"] else text


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def format_text(info: dict[str, Any]) -> str:
    """The human-readable form of :func:`collect_info`'s result."""
    llama = info["llama_cpp"]
    lines = [
        f"wasinn-host       {info['wasinn_host']}",
        f"llama-cpp-python  {info['llama_cpp_python']}",
        f"llama.cpp         commit {llama['commit']}, build b{llama['build_number']}, ggml {llama['ggml']}",
        f"wasmtime          {info['wasmtime']}",
        f"backends          {', '.join(info['backends']) or '(none)'}",
        "devices:",
    ]
    for d in info["devices"]:
        lines.append(
            f"  {d['name']} ({d['type']}, {d['backend']}): {d['description']}; "
            f"{_gib(d['free_bytes'])} free of {_gib(d['total_bytes'])}"
        )
    if not info["devices"]:
        lines.append("  (none)")
    if info["gpu_offload"]:
        lines.append("GPU offload       yes: targets GPU and AUTO offload the layers that fit")
    else:
        lines.append("GPU offload       no: this build runs on the CPU only")
        lines.append(f"                  to use a GPU, {info['gpu_hint']}")
    lines.append(f"multimodal        {'yes (libmtmd)' if info['multimodal'] else 'no: libmtmd is missing'}")
    lines.append(f"CPU layouts       {_layouts_text(info['cpu_layouts'])}")
    lines.append(f"system info       {info['system_info']}")
    return "\n".join(lines)


def info_command(ns: argparse.Namespace) -> int:
    """Run ``wasinn info``; exit code 0, or 2 with one error line if llama.cpp cannot be loaded."""
    try:
        info = collect_info()
    except (ImportError, OSError, AttributeError) as exc:
        return fail(f"cannot load llama.cpp through llama-cpp-python: {type(exc).__name__}: {exc}")
    except WasiNNError as exc:
        return fail(str(exc))
    print(json.dumps(info, indent=2) if ns.json else format_text(info))
    sys.stdout.flush()
    return 0
