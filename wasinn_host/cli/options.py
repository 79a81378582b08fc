"""Command-line options and helpers shared by ``wasinn run`` and ``wasinn serve``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from ..core.config.limits import Limits
from ..core.config.preload import Preload, PreloadError, parse_preload
from ..launch.runner import EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, as every other ``wasinn`` error (argparse
    prints its whole usage first); subcommand parsers made from it are of this class too."""

    def error(self, message: str) -> NoReturn:
        """``wasinn: error: MESSAGE (see 'wasinn COMMAND --help')`` and the usage exit code."""
        say(f"wasinn: error: {message} (see '{self.prog} --help')")
        sys.exit(EXIT_USAGE)


def say(line: str) -> None:
    """Write one whole line on stderr (one write, so nothing another thread writes lands inside it)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--nn-preload`` and ``--nn-allow`` (``run`` and ``serve``)."""
    parser.add_argument(
        "--nn-preload",
        action="append",
        default=[],
        metavar="NAME:ENCODING:TARGET:PATH",
        help="make a GGUF model available to load_by_name(NAME); ENCODING is GGML, TARGET "
        "cpu|gpu|tpu|auto (gpu and auto offload the layers that fit on a GPU build, see wasinn info; "
        "the n-gpu-layers config key overrides); repeatable",
    )
    parser.add_argument(
        "--nn-mmproj",
        action="append",
        default=[],
        metavar="NAME:PATH",
        help="serve the preloaded NAME with this multimodal projector GGUF (images in prompts); repeatable",
    )
    parser.add_argument(
        "--nn-allow",
        action="append",
        metavar="NAME",
        help="only these preloaded names may be loaded by the guest (repeatable; default: all)",
    )


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level``, ``--log-file``, ``--log-format`` (``run`` and ``serve``)."""
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="host log level (default: WARNING); DEBUG also shows llama.cpp's own log",
    )
    parser.add_argument("--log-file", metavar="PATH", help="write the host log to PATH instead of stderr")
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text lines, or JSON lines with timestamp, level, event, graph, context and message",
    )


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """``--status``, ``--metrics-port`` and ``--metrics-address`` (``run`` and ``serve``)."""
    parser.add_argument(
        "--status",
        action="store_true",
        help="print the status JSON (queue, memory, sessions, performance) on stderr at exit",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on ADDRESS:PORT while running (needs prometheus-client)",
    )
    parser.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address --metrics-port listens on (default: 127.0.0.1; 0.0.0.0 for a scrape from "
        "another machine or pod: the metrics name models and count requests, so keep it on a private network)",
    )


def add_token_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, meaning: str) -> None:
    """``--nn-rpc-token`` (default ``$WASINN_RPC_TOKEN``): ``meaning`` says what the command does with it."""
    parser.add_argument(
        "--nn-rpc-token",
        metavar="TOKEN",
        default=os.environ.get("WASINN_RPC_TOKEN"),
        help=f"{meaning} (default: $WASINN_RPC_TOKEN)",
    )


def read_pem(path: str | None, option: str) -> bytes | None:
    """The PEM file an option names (None when not given); OSError with a one-line message."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise OSError(f"{option} {path!r}: {exc.strerror}") from None


def add_limit_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """One option per :class:`Limits` field; returns the group for command-specific additions."""
    limits = parser.add_argument_group("limits (defaults protect the host without getting in the way)")
    for field, help_text in _LIMIT_HELP.items():
        default = getattr(Limits(), field)
        limits.add_argument(
            "--" + field.replace("_", "-"),
            type=int,
            default=default,
            metavar="N",
            help=f"{help_text} (default: {default})",
        )
    return limits


_LIMIT_HELP = {
    "max_contexts_per_store": "execution contexts one guest may hold",
    "max_contexts_total": "execution contexts in the whole process",
    "max_graphs_per_store": "graphs one guest may hold",
    "max_queue": "requests waiting per model before new ones get Busy",
    "queue_timeout_ms": "ms a request may wait for a free sequence before Busy (0 = no limit)",
    "idle_timeout_ms": "ms after which an unused execution context is finalised (0 = never)",
    "max_prompt_bytes": "bytes of one prompt's text (inline <img> images are counted apart, up to 20 MiB)",
    "max_output_bytes": "bytes of one output",
    "max_n_predict": "largest n-predict accepted",
    "max_load_bytes": "bytes of a model sent with load()",
    "max_kv_bytes": "bytes of KV cache of all loaded models together (0 = half the machine's memory)",
}


def limits_from(ns: argparse.Namespace, allow_load_bytes: bool) -> Limits:
    """The :class:`Limits` the limit options name."""
    values = {field: getattr(ns, field) for field in _LIMIT_HELP}
    return Limits(allow_load_bytes=allow_load_bytes, **values)


SERVER_LIMITS = ("max_queue", "queue_timeout_ms", "max_output_bytes", "max_n_predict", "max_kv_bytes")
"""Limits the model's engine applies: with ``--nn-rpc-uri`` that engine is the server's."""


def warn_server_limits(ns: argparse.Namespace) -> None:
    """With ``--nn-rpc-uri``, one warning naming the limit options given that only a server applies."""
    given = [f"--{field.replace('_', '-')}" for field in SERVER_LIMITS if getattr(ns, field) != getattr(Limits, field)]
    if given:
        logging.getLogger("wasinn_host").warning(
            "%s: with --nn-rpc-uri the server's engine applies %s; set %s on `wasinn serve`",
            ", ".join(given),
            "this limit" if len(given) == 1 else "these limits",
            "it" if len(given) == 1 else "them",
        )


def fail(message: str) -> int:
    """Print a one-line user error and return the usage exit code."""
    say(f"wasinn: error: {message}")
    return EXIT_USAGE


def preloads_from(ns: argparse.Namespace) -> list[Preload]:
    """The ``--nn-preload`` models with their ``--nn-mmproj`` projectors (PreloadError if malformed)."""
    return with_projectors([parse_preload(spec) for spec in ns.nn_preload], ns.nn_mmproj)


def with_projectors(preloads: list[Preload], specs: list[str]) -> list[Preload]:
    """``preloads`` with the ``--nn-mmproj NAME:PATH`` projectors attached (PreloadError if malformed)."""
    by_name = {p.name: p for p in preloads}
    for spec in specs:
        name, sep, path = spec.partition(":")
        if not sep or not name or not path:
            raise PreloadError(f"--nn-mmproj {spec!r}: expected NAME:PATH, e.g. default:mmproj.gguf")
        if name not in by_name:
            raise PreloadError(f"--nn-mmproj {spec!r}: {name!r} is not a --nn-preload name")
        by_name[name] = dataclasses.replace(by_name[name], mmproj=Path(path))
    return [by_name[p.name] for p in preloads]
