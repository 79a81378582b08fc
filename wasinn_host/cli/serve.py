"""``wasinn serve``: this process's models over WASI-NN RPC (WasmEdge's protocol and ours).

It runs until SIGINT or SIGTERM, then drains: the health service says NOT_SERVING, new calls
are refused, calls in flight finish (up to ``--drain-seconds``), and it exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from typing import Any

from ..backend.local import LocalBackend
from ..core.config.preload import Preload, PreloadError
from ..core.registry import ModelRegistry
from ..launch.guest_options import warn_missing_models
from ..models import DEMO_MODEL_PATH
from ..observability.log_setup import configure_logging
from ..observability.metrics import serve_metrics
from ..rpc.targets import TargetError, parse_listen
from .options import (
    add_limit_options,
    add_log_options,
    add_model_options,
    add_report_options,
    add_token_option,
    fail,
    limits_from,
    preloads_from,
    read_pem,
)
from .prompt_cache import add_prompt_cache_options, prompt_cache_from

log = logging.getLogger("wasinn_host")

SERVE_EPILOG = """\
Clients: wasinn run --nn-rpc-uri URI guest.wasm ..., WasiNN(rpc=URI) in Python, or WasmEdge
(wasmedge --nn-rpc-uri URI). Every client's requests are batched together on one copy of each model.

security: a unix socket is created mode 0600; HOST:PORT on a loopback address needs nothing
more; any other address needs --nn-rpc-token or --tls-cert/--tls-key, else serve refuses to start.
Config keys naming server files (image, mmproj, tts files) are refused from clients;
stream-stdout never prints on the server. Without --nn-preload, "default" is the demo model.

examples:
  wasinn serve --nn-rpc-uri unix:///tmp/nn.sock --nn-preload default:GGML:AUTO:model.gguf
  WASINN_RPC_TOKEN=secret wasinn serve --nn-rpc-uri 0.0.0.0:50051 --nn-preload default:GGML:AUTO:model.gguf
"""


MAX_SECONDS = 10_000_000
"""The longest ``--session-grace`` accepted (about 116 days)."""


def _seconds(text: str) -> float:
    """A number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 to {MAX_SECONDS:,} seconds")
    return value


def add_serve_parser(commands: Any) -> None:
    """The ``serve`` subcommand and its options."""
    serve = commands.add_parser(
        "serve",
        help="serve models to WASI-NN RPC clients (wasinn run --nn-rpc-uri, WasmEdge)",
        description="Serve the preloaded models over gRPC: WasmEdge's wasi_ephemeral_nn protocol, "
        "wasinn-host's own service (sessions, load from bytes, status) and the gRPC health service.",
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--nn-rpc-uri",
        required=True,
        metavar="URI",
        help="where to listen: unix:PATH, unix:///abs/path or HOST:PORT (port 0: any free port, printed)",
    )
    add_model_options(serve)
    add_log_options(serve)
    add_token_option(serve, "require this token on every call but health checks")
    serve.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain (needs --tls-key)")
    serve.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long calls in flight may take to finish (default: 30)",
    )
    serve.add_argument(
        "--session-grace",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long a client session whose keep-alive stream ended is kept for its client to attach again "
        "(a client that closes is freed at once; 0: freed when the stream ends; default: 30)",
    )
    add_report_options(serve)
    add_prompt_cache_options(serve)
    limits = add_limit_options(serve)
    limits.add_argument(
        "--allow-load-bytes",
        action="store_true",
        help="let clients send models as bytes (this host's Load call; within --max-load-bytes); off by default",
    )


def _listen_problem(uri: str) -> str | None:
    """Why ``wasinn serve`` cannot listen on ``uri``, where it can tell before binding, or None."""
    try:
        address = parse_listen(uri)
    except TargetError as exc:
        return str(exc)
    if address.unix_path is None:
        return None
    directory = os.path.dirname(address.unix_path)
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        return f"--nn-rpc-uri {uri}: the socket's directory {directory} {what}"
    return None


def serve_command(ns: argparse.Namespace) -> int:
    """``wasinn serve``: 0 after a clean drain, 2 when it cannot start."""
    try:
        configure_logging(ns.log_level, ns.log_file, ns.log_format)
    except OSError as exc:
        return fail(f"--log-file {ns.log_file!r}: {exc.strerror}")
    try:
        preloads = preloads_from(ns)
    except PreloadError as exc:
        return fail(str(exc))
    if not preloads and DEMO_MODEL_PATH.is_file():
        preloads = [Preload("default", DEMO_MODEL_PATH)]  # the embedded demo model
    if bool(ns.tls_cert) != bool(ns.tls_key):
        return fail("--tls-cert and --tls-key go together")
    problem = _listen_problem(ns.nn_rpc_uri)
    if problem is not None:
        return fail(problem)
    warn_missing_models(preloads)
    limits = limits_from(ns, ns.allow_load_bytes)
    try:
        prompt_cache = prompt_cache_from(ns)
    except OSError as exc:
        return fail(str(exc))
    backend = LocalBackend(ModelRegistry(preloads, prompt_cache=prompt_cache), limits)
    # gRPC's C core logs its own line for a failed bind (and more) on stderr, where wasinn's one line
    # says it already; its verbosity is read once, when grpc is first imported.  GRPC_VERBOSITY=debug shows it.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from ..rpc.server import NNServer, ServeOptions  # gRPC: imported by the command that serves it

    try:
        options = ServeOptions(
            token=ns.nn_rpc_token,
            tls_cert=read_pem(ns.tls_cert, "--tls-cert"),
            tls_key=read_pem(ns.tls_key, "--tls-key"),
            drain_seconds=ns.drain_seconds,
            session_grace_s=ns.session_grace,
            allow_load_bytes=ns.allow_load_bytes,
        )
        server = NNServer(ns.nn_rpc_uri, backend, ns.nn_allow, options)
    except (TargetError, OSError) as exc:
        backend.close()
        return fail(str(exc))
    if ns.metrics_port:
        serve_metrics(server.service.status, ns.metrics_port, ns.metrics_address)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    where = server.address.target if server.address.unix_path else f"{server.address.host}:{server.port}"
    print(f"wasinn: serving WASI-NN over gRPC on {where}", file=sys.stderr, flush=True)
    stop.wait()
    print("wasinn: draining: finishing calls in flight", file=sys.stderr, flush=True)
    status = server.service.status() if ns.status else None
    server.stop()
    if status is not None:
        print(json.dumps(status), file=sys.stderr)
    backend.close()
    return 0
