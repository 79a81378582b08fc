"""gRPC servers for the tests: the in-process NNServer, the `wasinn serve` command, a raw call's errno."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from typing import Any

import grpc
import pytest

from wasinn_host import ModelRegistry
from wasinn_host.backend.local import LocalBackend
from wasinn_host.core.config.limits import Limits
from wasinn_host.rpc.server import NNServer, ServeOptions


def serve(registry: ModelRegistry, sock: pathlib.Path, limits: Limits | None = None, **options: Any) -> NNServer:
    server = NNServer(f"unix:{sock}", LocalBackend(registry, limits or Limits()), options=ServeOptions(**options))
    server.start()
    return server


def errno_of_call(call: Any, request: Any, metadata: tuple[tuple[str, str], ...] = ()) -> int:
    """The errno trailer of a call that must fail with status UNKNOWN."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, metadata=metadata, timeout=30)
    assert info.value.code() == grpc.StatusCode.UNKNOWN, info.value
    trailers = dict(info.value.trailing_metadata())
    return int(trailers["errno"])


def serve_command(sock: pathlib.Path, model: pathlib.Path) -> subprocess.Popen[str]:
    """`wasinn serve` on a unix socket serving ``model`` as "succ", started (its first line read)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wasinn_host.cli", "serve", "--nn-rpc-uri", f"unix:{sock}"]
        + ["--nn-preload", f"succ:GGML:AUTO:{model}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None and "serving" in proc.stderr.readline()
    return proc


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def nn_config() -> Any:
    from wasinn_host.core.config.keys import EMPTY_CONFIG

    return EMPTY_CONFIG
