"""``wasinn run``: launches WASI-NN guests like ``wasmedge`` does (N instances, a deadline, Ctrl-C).

A guest's own exit code is passed through; a trap is 134 and its one-line message.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import Any

from ..core.config.preload import Preload, PreloadError
from ..core.errors import WasiNNError
from ..host import WasiNN
from ..launch.guest_load import GuestError, is_component_file
from ..launch.guest_options import parse_dir, parse_env, warn_missing_models
from ..launch.guest_run import RunOptions
from ..launch.runner import InstanceResult, exit_status, run_instances
from ..models import DEMO_MODEL_PATH
from ..observability.log_setup import configure_logging
from ..rpc.targets import TargetError
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
    say,
    warn_server_limits,
)
from .prompt_cache import add_prompt_cache_options, prompt_cache_from
from .socket_options import add_socket_options, socket_policy_from

RUN_EPILOG = """\
Without --nn-preload, the name "default" serves the embedded demo model (a tiny model that
answers 1-3 digit addition and subtraction in ChatML conversations).

SIGHUP makes every preloaded name serve its file as it is now on disk (hot swap: running
contexts finish on the old model).

examples:
  wasinn run --nn-preload default:GGML:AUTO:model.gguf guest_examples/complete.wasm default 'abc'
  wasinn run --dir .:. --env n_predict=32 --nn-preload default:GGML:AUTO:model.gguf chat.wasm default

--dir forms: PATH (the same path in the guest), GUEST:HOST (WasmEdge), HOST::GUEST (wasmtime).
"""


def add_run_parser(commands: Any) -> None:
    """``wasinn run`` and its options."""
    run = commands.add_parser(
        "run",
        help="run a .wasm guest (WASI command module, or wasi:cli command component) with WASI-NN",
        description="Run a WASI command module with the wasi_ephemeral_nn imports, or a command component\n"
        "with wasi:cli and wasi:nn. Components may be built against wasi:nn 0.2.0-rc-2024-10-28,\n"
        "0.2.0-rc-2024-08-19 or 0.2.0-rc-2024-06-25. Models are named with --nn-preload and load\n"
        "lazily on the guest's first load_by_name.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_options(run)
    run.add_argument(
        "--dir",
        action="append",
        default=[],
        metavar="DIR",
        help="preopen a host directory for the guest: PATH, GUEST:HOST or HOST::GUEST; repeatable",
    )
    run.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an environment variable in the guest; repeatable",
    )
    add_log_options(run)
    run.add_argument(
        "--nn-legacy-output",
        action="store_true",
        help="copy the whole output into a zero-length get_output buffer, as WasmEdge <= 0.16.3 "
        "did (LlamaEdge's apps need it); never past the end of guest memory",
    )
    run.add_argument(
        "--instances",
        type=_positive,
        default=1,
        metavar="N",
        help="run N instances of the module at once (one Store each, same arguments and "
        "environment, sharing the models, which start with room for N sequences; a server guest's "
        "instances sharing its address and their computes batched); output lines stay whole; "
        "exit code = the first non-zero one (default: 1)",
    )
    run.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop the guest (trap) after SECONDS of wall-clock time; its contexts are freed",
    )
    run.add_argument(
        "--no-cache",
        action="store_true",
        help="compile the guest every time instead of keeping compiled modules and components in "
        "$XDG_CACHE_HOME/wasinn (default ~/.cache/wasinn)",
    )
    add_report_options(run)
    add_prompt_cache_options(run)
    limits = add_limit_options(run)
    limits.add_argument(
        "--no-load-bytes",
        action="store_true",
        help="refuse load() of model bytes sent by the guest (it gets UnsupportedOperation); load_by_name still works",
    )
    rpc = run.add_argument_group("models on a WASI-NN RPC server (wasinn serve, or WasmEdge's wasi_nn_rpcserver)")
    rpc.add_argument(
        "--nn-rpc-uri",
        action="append",
        metavar="URI",
        help="serve the guest's wasi_ephemeral_nn calls from this server: unix:PATH, unix:///abs/path, "
        "HOST:PORT, ipv4:A:P,B:P or dns:///NAME:PORT (every address a backend); repeatable: new contexts go "
        "to the least-loaded backend and stay there; --nn-preload is then ignored",
    )
    add_token_option(rpc, "token the server requires")
    rpc.add_argument("--tls-ca", metavar="PEM", help="verify the server's TLS certificate with these root certificates")
    rpc.add_argument(
        "--rpc-compute-timeout",
        type=float,
        metavar="SECONDS",
        help="deadline of each remote compute call (default: none); the server cancels the computation",
    )
    add_socket_options(run)
    run.add_argument("module", metavar="MODULE.wasm", help="the guest module")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to the guest")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def run_command(ns: argparse.Namespace) -> int:
    """``wasinn run``: returns the guest's exit code."""
    try:
        configure_logging(ns.log_level, ns.log_file, ns.log_format)
    except OSError as exc:
        return fail(f"--log-file {ns.log_file!r}: {exc.strerror}")
    try:
        preloads = preloads_from(ns)
        dirs = [parse_dir(spec) for spec in ns.dir]
        env = dict(parse_env(spec) for spec in ns.env)
        sockets = socket_policy_from(ns)
    except (PreloadError, ValueError) as exc:
        return fail(str(exc))
    rpc_options = None
    try:
        if ns.nn_rpc_uri:
            from ..rpc.endpoint import ClientOptions  # gRPC only for runs that use it

            warn_server_limits(ns)
            tls_ca = read_pem(ns.tls_ca, "--tls-ca")
            rpc_options = ClientOptions(ns.nn_rpc_token, tls_ca, compute_timeout=ns.rpc_compute_timeout)
        else:
            warn_missing_models(preloads)
            if not preloads and DEMO_MODEL_PATH.is_file():
                preloads = [Preload("default", DEMO_MODEL_PATH)]  # the embedded demo model
        nn = WasiNN(
            preload=preloads,
            limits=limits_from(ns, not ns.no_load_bytes),
            allowed_models=ns.nn_allow,
            interruptible=True,
            legacy_output=ns.nn_legacy_output,
            rpc=ns.nn_rpc_uri,
            rpc_options=rpc_options,
            compile_cache=not ns.no_cache,
            sockets=sockets,
            prompt_cache=prompt_cache_from(ns),
        )
    except (TargetError, WasiNNError, OSError) as exc:
        return fail(str(exc))
    if nn.local is not None:
        signal.signal(signal.SIGHUP, lambda *_: reload_models(nn))
    if is_component_file(ns.module):
        from ..guest.fast_calls import keep_list_heap  # the component front end, for components only

        keep_list_heap()  # byte lists cross wasmtime's C API about 2.5x faster (README: Byte lists)
    try:
        if ns.metrics_port:
            nn.serve_metrics(ns.metrics_port, ns.metrics_address)
        results = run_instances(
            nn,
            ns.module,
            ns.args,
            RunOptions(env=env, dirs=dirs, program_name=ns.module),
            ns.instances,
            ns.timeout,
            timeout_name="--timeout",
        )
    except (GuestError, RuntimeError, OSError) as exc:
        return fail(str(exc))
    finally:
        sys.stdout.flush()
    if ns.status:
        print(json.dumps(nn.status()), file=sys.stderr)
    nn.close()
    return _exit_code(results)


def reload_models(nn: WasiNN) -> None:
    """SIGHUP: hot-swap every preloaded name to its file as it is now on disk."""
    for name in nn.registry.preloads():
        try:
            nn.swap_model(name)
        except WasiNNError as exc:
            logging.getLogger("wasinn_host").error("reload of %s failed: %s", name, exc.message)


def _exit_code(results: list[InstanceResult]) -> int:
    """The first non-zero exit code among the instances, else 0; trap messages on stderr."""
    codes = []
    for index, result in enumerate(results):
        code, message = exit_status(result)
        if message is not None:
            prefix = f"instance {index}: " if len(results) > 1 else ""
            say(f"wasinn: error: {prefix}{message}")
        codes.append(code)
    return next((code for code in codes if code != 0), 0)
