"""The ``wasinn`` command line: one module per command, the options they share in :mod:`.options`.

``wasinn run`` (:mod:`.run`) launches guests, ``wasinn serve`` (:mod:`.serve`) serves models over
gRPC, ``wasinn info`` (:mod:`.info`) and ``wasinn model`` (:mod:`.model`) describe the build and write
the built-in test models, ``wasinn bench`` (:mod:`.bench`) measures serving against llama.cpp alone.
User-facing errors are one line on stderr (``wasinn: error: ...``) and exit code 2, never a traceback.
"""

from __future__ import annotations

from typing import Sequence

from .. import __version__
from .bench import add_bench_parser, bench_command
from .info import add_info_parser, info_command
from .model import add_model_parser, model_command
from .options import EXIT_USAGE, OneLineParser, say
from .run import add_run_parser, run_command
from .serve import add_serve_parser, serve_command

__all__ = ["build_parser", "main"]


def build_parser() -> OneLineParser:
    """The ``wasinn`` argument parser, one subcommand per command."""
    parser = OneLineParser(
        prog="wasinn",
        description="Run WebAssembly guests that use WASI-NN (WasmEdge GGML dialect) on wasmtime, "
        "with llama.cpp doing the inference.",
    )
    parser.add_argument("--version", action="version", version=f"wasinn-host {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_run_parser(commands)
    add_serve_parser(commands)
    add_info_parser(commands)
    add_model_parser(commands)
    add_bench_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``wasinn`` console script."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if ns.command == "info":
            return info_command(ns)
        if ns.command == "model":
            return model_command(ns)
        if ns.command == "bench":
            return bench_command(ns)
        return serve_command(ns) if ns.command == "serve" else run_command(ns)
    except KeyboardInterrupt:
        say("wasinn: interrupted")  # after every guest has stopped writing (launch.runner.run_instances)
        return 130
