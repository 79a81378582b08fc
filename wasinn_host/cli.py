"""The ``wasinn`` command line: ``wasinn run`` launches WASI-NN guests like ``wasmedge`` does.

User-facing errors are one line on stderr (``wasinn: error: ...``) and exit code 2,
never a traceback; a guest's own exit code is passed through.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from . import __version__
from .host import GuestError, RunOptions, WasiNN
from .log_setup import configure_logging
from .preload import PreloadError, parse_preload

EXIT_USAGE = 2
EXIT_TRAP = 134  # as wasmtime's CLI: 128 + SIGABRT

RUN_EPILOG = """\
examples:
  wasinn run --nn-preload default:GGML:AUTO:model.gguf guest_examples/complete.wasm default 'abc'
  wasinn run --dir .:. --env n_predict=32 --nn-preload default:GGML:AUTO:model.gguf chat.wasm default

--dir forms: PATH (the same path in the guest), GUEST:HOST (WasmEdge), HOST::GUEST (wasmtime).
"""


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wasinn",
        description="Run WebAssembly guests that use WASI-NN (WasmEdge GGML dialect) on wasmtime, "
                    "with llama.cpp doing the inference.",
    )
    parser.add_argument("--version", action="version", version=f"wasinn-host {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run a .wasm guest (WASI command) with the wasi_ephemeral_nn imports",
        description="Run a WASI command module with the wasi_ephemeral_nn imports. Models are named with "
                    "--nn-preload and load lazily on the guest's first load_by_name.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--nn-preload", action="append", default=[], metavar="NAME:ENCODING:TARGET:PATH",
                     help="make a GGUF model available to load_by_name(NAME); ENCODING is GGML, TARGET "
                          "cpu|gpu|tpu|auto (GPU offload is the n-gpu-layers config key); repeatable")
    run.add_argument("--dir", action="append", default=[], metavar="DIR",
                     help="preopen a host directory for the guest: PATH, GUEST:HOST or HOST::GUEST; repeatable")
    run.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="set an environment variable in the guest; repeatable")
    run.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                     help="host log level (default: WARNING); DEBUG also shows llama.cpp's own log")
    run.add_argument("--log-file", metavar="PATH", help="write the host log to PATH instead of stderr")
    run.add_argument("--log-format", default="text", choices=["text", "json"],
                     help="text lines, or JSON lines with timestamp, level, event, graph, context and message")
    run.add_argument("module", metavar="MODULE.wasm", help="the guest module")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to the guest")
    return parser


def _fail(message: str) -> int:
    print(f"wasinn: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def run_command(ns: argparse.Namespace) -> int:
    """``wasinn run``: returns the guest's exit code."""
    try:
        configure_logging(ns.log_level, ns.log_file, ns.log_format)
    except OSError as exc:
        return _fail(f"--log-file {ns.log_file!r}: {exc.strerror}")
    try:
        preloads = [parse_preload(spec) for spec in ns.nn_preload]
        dirs = [parse_dir(spec) for spec in ns.dir]
        env = dict(parse_env(spec) for spec in ns.env)
    except (PreloadError, ValueError) as exc:
        return _fail(str(exc))
    for preload in preloads:
        if not preload.path.is_file():
            return _fail(f"--nn-preload {preload.name}: model file {str(preload.path)!r} does not exist")
    nn = WasiNN(preload=preloads)
    try:
        return nn.run(ns.module, ns.args, RunOptions(env=env, dirs=dirs, program_name=ns.module))
    except GuestError as exc:
        print(f"wasinn: error: {exc}", file=sys.stderr)
        return EXIT_TRAP if "trapped" in str(exc) else EXIT_USAGE
    finally:
        sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``wasinn`` console script."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return run_command(ns)
    except KeyboardInterrupt:
        print("wasinn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
