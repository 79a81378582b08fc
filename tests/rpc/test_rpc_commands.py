"""WASI-NN over gRPC through the commands: `wasinn serve` and `wasinn run --nn-rpc-uri`, scale-out over two
servers, one-line errors, and a server or backend killed mid-stream."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.launch.runner import run_instances
from wasinn_host.rpc.client import READY_AHEAD
from wasinn_host.rpc.messages import host, host_grpc
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

from .servers import serve, serve_command, wait_for


def test_two_servers_share_eight_guests_and_survive_one(
    preload_specs: list[str], tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    registries = [ModelRegistry(preload_specs) for _ in range(2)]
    servers = [serve(registries[i], tmp_path / f"s{i}.sock") for i in range(2)]
    client = WasiNN(rpc=[s.address.target for s in servers])
    try:
        options = RunOptions(env={"n_predict": "200"})
        results = run_instances(client, GUESTS / "complete.wasm", ["succ", "0"], options, 8)
        assert [r.code for r in results] == [0] * 8
        expected = successor_text("0", 200)
        assert capfd.readouterr().out.splitlines() == [expected] * 8
        requests = [s.service.status()["performance"]["requests"] for s in servers]
        assert all(r >= 2 for r in requests), requests  # spread over both
        # a context pinned to a server that dies gets errno 5; new work goes to the survivor
        session = client.session("succ", {"n-predict": 3})
        doomed = servers[0] if session._context.endpoint.target == servers[0].address.target else servers[1]  # type: ignore[attr-defined]
        doomed.stop(0)
        with pytest.raises(WasiNNError) as info:
            session.complete("a")
        assert info.value.kind is ErrorKind.RUNTIME_ERROR
        results = run_instances(client, GUESTS / "complete.wasm", ["succ", "0"], options, 4)
        assert [r.code for r in results] == [0] * 4
    finally:
        client.close()
        for s in servers:
            s.stop(0)
        for r in registries:
            r.close()


def test_wasinn_serve_and_run_commands(tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    """The two commands as a user runs them; SIGTERM drains and exits 0 with the status JSON."""
    sock = tmp_path / "cli.sock"
    env = dict(os.environ)
    serve_cmd = [sys.executable, "-m", "wasinn_host.cli", "serve", "--nn-rpc-uri", f"unix://{sock}", "--status"]
    with socket.socket() as probe:  # a free port for the metrics
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    serve_cmd += ["--metrics-port", str(metrics_port), "--metrics-address", "0.0.0.0"]
    proc = subprocess.Popen(
        serve_cmd + ["--nn-preload", f"succ:GGML:AUTO:{successor_path}"], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stderr is not None
        assert "serving WASI-NN over gRPC" in proc.stderr.readline()
        run = subprocess.run(
            [sys.executable, "-m", "wasinn_host.cli", "run", "--nn-rpc-uri", f"unix://{sock}", "--instances", "2"]
            + [str(GUESTS / "complete.wasm"), "succ", "hello"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (run.returncode, run.stdout) == (0, (successor_text("hello") + "</s>\n") * 2)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert 'wasinn_requests_total{model="succ"} 2.0' in metrics and "wasinn_rpc_sessions 0.0" in metrics
        listening = pathlib.Path("/proc/net/tcp").read_text().split("\n")[1:]
        assert any(line.split()[1] == f"00000000:{metrics_port:04X}" for line in listening if line.strip()), (
            "--metrics-address 0.0.0.0 listens on every interface"
        )
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        tail = proc.stderr.read()
        assert '"rpc": {"sessions"' in tail
    finally:
        proc.kill()


def test_cli_errors_are_one_line(tmp_path: pathlib.Path) -> None:
    for args in (
        ["serve", "--nn-rpc-uri", "0.0.0.0:0"],
        ["serve", "--nn-rpc-uri", "tcp://127.0.0.1:5"],
        ["serve", "--nn-rpc-uri", f"unix:{tmp_path}/s.sock", "--session-grace", "-1"],
        ["run", "--nn-rpc-uri", "tcp://x:1", str(GUESTS / "complete.wasm")],
    ):
        result = subprocess.run([sys.executable, "-m", "wasinn_host.cli", *args], capture_output=True, text=True)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("wasinn: error: "), result.stderr


def test_run_warns_that_engine_limits_are_the_servers(tmp_path: pathlib.Path) -> None:
    """Client-side --max-* options that only a model's engine applies get one warning over RPC."""
    args = ["run", "--nn-rpc-uri", f"unix://{tmp_path / 'none.sock'}", str(GUESTS / "complete.wasm"), "a", "b"]
    plain = subprocess.run([sys.executable, "-m", "wasinn_host.cli", *args], capture_output=True, text=True)
    assert "server's engine" not in plain.stderr
    limited = subprocess.run(
        [sys.executable, "-m", "wasinn_host.cli", *args[:3], "--max-n-predict=8", "--max-prompt-bytes=99", *args[3:]],
        capture_output=True,
        text=True,
    )
    assert limited.stderr.splitlines()[0] == (
        "wasinn: WARNING: --max-n-predict: with --nn-rpc-uri the server's engine applies this limit; "
        "set it on `wasinn serve`"
    ), "--max-prompt-bytes is checked by the client's front end: no warning for it"


def test_killed_server_mid_stream(tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    """A server killed while a guest streams: the next call to it gets errno 5 at once, never a silent 0
    (the pieces it had sent ahead, tokens it sampled before it died, come first)."""
    sock = tmp_path / "dies.sock"
    proc = serve_command(sock, successor_path)
    client = None
    try:
        client = WasiNN(rpc=f"unix:{sock}")
        session = client.session("succ", {"n-predict": 1000})
        idle = client.session("succ")
        stream = session.stream("0")
        assert [next(stream), next(stream)] == [b"1", b"2"]
        proc.kill()
        proc.wait(timeout=30)
        started = time.monotonic()
        with pytest.raises(WasiNNError) as info:
            for _ in range(READY_AHEAD + 1):
                next(stream)
        assert info.value.kind is ErrorKind.RUNTIME_ERROR and "UNAVAILABLE" in info.value.message
        assert time.monotonic() - started < 10
        # every path that would talk to the dead server is bounded: closing the failed session, a session
        # that had not noticed the death yet, the client's channels
        started = time.monotonic()
        session.close()
        idle.close()
        client.close()
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
        if client is not None:
            client.close()


def test_killed_backend_does_not_hang_instances(tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    """Two backends, `--instances 2` over both, one backend killed mid-generation: its guest gets errno 5,
    the other finishes, and `wasinn run` exits (it used to wait for ever on the failed guest's output pipe)."""
    socks = [tmp_path / f"b{index}.sock" for index in range(2)]
    servers = [serve_command(sock, successor_path) for sock in socks]
    channels = [grpc.insecure_channel(f"unix:{sock}") for sock in socks]
    try:
        uris = [arg for sock in socks for arg in ("--nn-rpc-uri", f"unix:{sock}")]
        run = subprocess.Popen(
            [sys.executable, "-m", "wasinn_host.cli", "run", *uris, "--instances", "2"]
            + ["--env", "n_predict=1500", "--env", "ctx_size=2048", str(GUESTS / "complete.wasm"), "succ", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        def computing() -> bool:  # one guest's context on each backend
            return all(host_grpc.HostStub(c).Status(host.StatusRequest(), timeout=10).contexts == 1 for c in channels)

        assert wait_for(computing, 60.0), "the two guests were not placed one on each backend"
        servers[0].kill()
        started = time.monotonic()
        out, err = run.communicate(timeout=180)
        assert time.monotonic() - started < 120
        assert run.returncode == 1, err
        assert "wasi-nn error: compute returned 5" in err.decode().splitlines()
        assert out.decode() == successor_text("0", 1500) + "\n"  # the other guest's whole answer
    finally:
        for channel in channels:
            channel.close()
        for server in servers:
            server.kill()
