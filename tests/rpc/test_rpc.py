"""WASI-NN over gRPC: real guests through `wasinn serve`'s server and the remote backend, a raw
grpcio client speaking exactly what WasmEdge's client sends, errno trailers, sessions, security,
large messages, and scale-out over two servers."""

from __future__ import annotations

import os
import pathlib
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.backend.local import LocalBackend
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.core.limits import INLINE_IMAGE_ROOM, Limits
from wasinn_host.launch.runner import run_instances
from wasinn_host.rpc.endpoint import ClientOptions
from wasinn_host.rpc.messages import SESSION_KEY, host, host_grpc, nn, nn_grpc
from wasinn_host.rpc.server import NNServer, ServeOptions
from wasinn_host.rpc.service import NNService
from wasinn_host.rpc.targets import TargetError
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS, run_guest


def serve(registry: ModelRegistry, sock: pathlib.Path, limits: Limits | None = None, **options: Any) -> NNServer:
    server = NNServer(f"unix:{sock}", LocalBackend(registry, limits or Limits()), options=ServeOptions(**options))
    server.start()
    return server


@pytest.fixture
def server(registry: ModelRegistry, tmp_path: pathlib.Path) -> Iterator[NNServer]:
    srv = serve(registry, tmp_path / "nn.sock")
    yield srv
    srv.stop(1)


@pytest.fixture
def remote(server: NNServer) -> Iterator[WasiNN]:
    client = WasiNN(rpc=f"unix://{server.address.unix_path}")
    yield client
    client.close()


def errno_of_call(call: Any, request: Any, metadata: tuple[tuple[str, str], ...] = ()) -> int:
    """The errno trailer of a call that must fail with status UNKNOWN."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, metadata=metadata, timeout=30)
    assert info.value.code() == grpc.StatusCode.UNKNOWN, info.value
    trailers = dict(info.value.trailing_metadata())
    return int(trailers["errno"])


CASES = [
    ("complete", ["succ", "hello"], {}, None),
    ("complete", ["succ", "3"], {"n_predict": "8"}, None),
    ("complete", ["succ", "a"], {"reverse_prompt": "fg"}, None),
    ("complete", ["nope", "a"], {}, None),
    ("complete", ["missing", "a"], {}, None),
    ("complete", ["succ", "1"], {"ctx_size": "32"}, None),
    ("chat", ["succ"], {"temp": "0"}, "hello\nabc\n"),
]


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


@pytest.mark.parametrize(("guest", "args", "env", "stdin"), CASES)
def test_guests_remote_equal_in_process(
    nn: WasiNN,
    remote: WasiNN,
    tmp_path: pathlib.Path,
    guest: str,
    args: list[str],
    env: dict[str, str],
    stdin: str | None,
) -> None:
    """Exit code, output and error lines are the same; the metadata's WasmEdge head too."""
    local = run_guest(nn, tmp_path, guest, args, env=env, stdin=stdin)
    over_rpc = run_guest(remote, tmp_path, guest, args, env=env, stdin=stdin)
    assert over_rpc[:2] == local[:2]
    head = [line.split(', "stop_reason"')[0] for line in local[2].splitlines()]
    assert [line.split(', "stop_reason"')[0] for line in over_rpc[2].splitlines()] == head


def test_streaming_guest_over_rpc(remote: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, _ = run_guest(remote, tmp_path, "chat", ["succ"], stdin="hello\n", env={"temp": "0"})
    assert (code, out.splitlines()[0]) == (0, successor_text("hello"))


def _count_calls(monkeypatch: pytest.MonkeyPatch, calls: list[str], *methods: str) -> None:
    """Record every call of these server methods (patched before the server is built)."""
    for method in methods:
        original = getattr(NNService, method)

        def counted(self: NNService, request: Any, context: Any, _m: str = method, _f: Any = original) -> Any:
            calls.append(_m)
            return _f(self, request, context)

        monkeypatch.setattr(NNService, method, counted)


def test_streaming_takes_one_round_trip_per_token(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against wasinn serve, compute_single brings the piece along: no GetOutputSingle call."""
    calls: list[str] = []
    _count_calls(monkeypatch, calls, "ComputeSingle", "ComputeSingleOutput", "GetOutputSingle")
    srv = serve(registry, tmp_path / "nn.sock")
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        with client.session("succ") as session:
            assert b"".join(session.stream("abc")) == b"defghijklmnopqrstuvwxyz"
        assert calls == ["ComputeSingleOutput"] * 24  # 23 letters, then the end of the sequence
    finally:
        client.close()
        srv.stop(1)


def test_streaming_falls_back_to_two_calls(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server without ComputeSingleOutput (an older wasinn serve): the same pieces, two calls a token."""

    def unimplemented(self: NNService, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")

    monkeypatch.setattr(NNService, "ComputeSingleOutput", unimplemented)
    calls: list[str] = []
    _count_calls(monkeypatch, calls, "ComputeSingle", "GetOutputSingle")
    srv = serve(registry, tmp_path / "nn.sock")
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        with client.session("succ") as session:
            assert b"".join(session.stream("abc")) == b"defghijklmnopqrstuvwxyz"
        assert (calls.count("ComputeSingle"), calls.count("GetOutputSingle")) == (24, 23)
    finally:
        client.close()
        srv.stop(1)


def test_session_over_rpc(remote: WasiNN) -> None:
    with remote.session("succ", {"n-predict": 5}) as session:
        assert session.complete("abc") == "defgh"
        assert session.metadata["output_tokens"] == 5
        assert b"".join(session.stream("x")) == b"yz"
        assert b"".join(session.stream("abc")) == b"defgh"  # n-predict bounds a stream too
    with pytest.raises(WasiNNError) as info:
        remote.session("nope")
    assert info.value.kind is ErrorKind.NOT_FOUND


def test_eight_instances_over_rpc(remote: WasiNN, capfd: pytest.CaptureFixture[str]) -> None:
    results = run_instances(remote, GUESTS / "complete.wasm", ["succ", "hello"], RunOptions(), 8)
    assert [r.code for r in results] == [0] * 8
    assert capfd.readouterr().out.splitlines() == [successor_text("hello") + "</s>"] * 8


def test_raw_wasmedge_client(server: NNServer) -> None:
    """No session metadata, ty = the guest's witx U8 (3), handles shared as in WasmEdge's server."""
    channel = grpc.insecure_channel(server.address.target)
    graph, resource = nn_grpc.GraphStub(channel), nn_grpc.GraphResourceStub(channel)
    context = nn_grpc.GraphExecutionContextResourceStub(channel)
    handle = graph.LoadByName(nn.LoadByNameRequest(name="succ")).graph_handle
    assert graph.LoadByName(nn.LoadByNameRequest(name="succ")).graph_handle == handle  # one shared scope
    ctx = resource.InitExecutionContext(nn.InitExecutionContextRequest(resource_handle=handle)).ctx_handle

    def tensor(data: bytes, ty: int = 3) -> Any:
        return nn.Tensor(dimensions=[len(data)], ty=ty, data=data)

    context.SetInput(nn.SetInputRequest(resource_handle=ctx, index=1, tensor=tensor(b'{"n-predict": 4}')))
    context.SetInput(nn.SetInputRequest(resource_handle=ctx, index=0, tensor=tensor(b"abc")))
    context.Compute(nn.ComputeRequest(resource_handle=ctx))
    assert context.GetOutput(nn.GetOutputRequest(resource_handle=ctx, index=0)).data == b"defg"
    meta = context.GetOutput(nn.GetOutputRequest(resource_handle=ctx, index=1)).data
    assert meta.startswith(b'{"input_tokens": 4, "output_tokens": 4, "llama_build_number": ')
    # streaming: two unary calls per token, end of sequence as errno 100
    context.SetInput(nn.SetInputRequest(resource_handle=ctx, index=1, tensor=tensor(b'{"n-predict": 100}')))
    context.SetInput(nn.SetInputRequest(resource_handle=ctx, index=0, tensor=tensor(b"x")))
    pieces = []
    for _ in range(5):
        try:
            context.ComputeSingle(nn.ComputeRequest(resource_handle=ctx))
        except grpc.RpcError as exc:
            assert dict(exc.trailing_metadata())["errno"] == "100"
            break
        pieces.append(context.GetOutputSingle(nn.GetOutputRequest(resource_handle=ctx, index=0)).data)
    assert pieces == [b"y", b"z"]
    context.FiniSingle(nn.FiniSingleRequest(resource_handle=ctx))
    # errno trailers for every kind of error
    assert errno_of_call(graph.LoadByName, nn.LoadByNameRequest(name="nope")) == 8
    assert errno_of_call(graph.LoadByName, nn.LoadByNameRequest(name="missing")) == 103
    assert errno_of_call(graph.LoadByNameWithConfig, nn.LoadByNameWithConfigRequest(name="succ", config="{")) == 2
    bad_ctx = nn.InitExecutionContextRequest(resource_handle=99)
    assert errno_of_call(resource.InitExecutionContext, bad_ctx) == 1
    for accepted in (0, 1, 2, 4):  # what WasmEdge accepts (4: U8 in this proto's enum)
        context.SetInput(nn.SetInputRequest(resource_handle=ctx, index=0, tensor=tensor(b"abcd", ty=accepted)))
    i32 = nn.SetInputRequest(resource_handle=ctx, index=0, tensor=tensor(b"abcd", ty=5))
    assert errno_of_call(context.SetInput, i32) == 1
    # output_max_size (WasmEdge's newest field): larger outputs are errno 7; 0 (older clients): no limit
    context.Compute(nn.ComputeRequest(resource_handle=ctx))
    answer = successor_text("abcd").encode() + b"</s>"
    exact = nn.GetOutputRequest(resource_handle=ctx, index=0, output_max_size=len(answer))
    assert context.GetOutput(exact).data == answer
    small = nn.GetOutputRequest(resource_handle=ctx, index=0, output_max_size=len(answer) - 1)
    assert errno_of_call(context.GetOutput, small) == 7
    assert context.GetOutput(nn.GetOutputRequest(resource_handle=ctx, index=0)).data == answer
    piece = nn.GetOutputRequest(resource_handle=ctx, index=0, output_max_size=4)
    assert context.GetOutputSingle(piece).data == b"</s>"
    assert errno_of_call(context.GetOutputSingle, nn.GetOutputRequest(resource_handle=ctx, output_max_size=3)) == 7
    assert errno_of_call(context.Compute, nn.ComputeRequest(resource_handle=77)) == 1
    assert errno_of_call(context.GetOutput, nn.GetOutputRequest(resource_handle=77, index=0)) == 1
    # path-bearing keys are refused from remote clients; context full is 101 with the output kept
    image = nn.SetInputRequest(resource_handle=ctx, index=1, tensor=tensor(b'{"image": "/etc/passwd"}'))
    assert errno_of_call(context.SetInput, image) == 1
    with_mmproj = nn.LoadByNameWithConfigRequest(name="succ", config='{"model": {"mmproj": "/x"}}')
    assert errno_of_call(graph.LoadByNameWithConfig, with_mmproj) == 1
    # in the shared scope a name loads once (WasmEdge); a session gets the config it asks for
    mine = ((SESSION_KEY, "mine"),)
    request = nn.LoadByNameWithConfigRequest(name="succ", config='{"ctx-size": 8}')
    small = graph.LoadByNameWithConfig(request, metadata=mine).graph_handle
    init = nn.InitExecutionContextRequest(resource_handle=small)
    ctx2 = resource.InitExecutionContext(init, metadata=mine).ctx_handle
    context.SetInput(nn.SetInputRequest(resource_handle=ctx2, index=0, tensor=tensor(b"1")), metadata=mine)
    assert errno_of_call(context.Compute, nn.ComputeRequest(resource_handle=ctx2), mine) == 101
    output = context.GetOutput(nn.GetOutputRequest(resource_handle=ctx2, index=0), metadata=mine).data
    assert output == successor_text("1", 7).encode()
    # this host's own service: load from bytes is off by default
    host_stub = host_grpc.HostStub(channel)
    assert errno_of_call(host_stub.Load, host.LoadRequest(model=b"GGUF")) == 6
    channel.close()


def test_stream_stdout_is_printed_by_the_client_not_the_server(
    remote: WasiNN, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """WasmEdge's basic example prints only a newline and relies on stream-stdout: the client, the
    guest's host, writes the pieces to the guest's stdout; the server (in this process too) never
    prints, so they appear once."""
    code, out, _ = run_guest(remote, tmp_path, "complete", ["succ", "u"], env={"stream_stdout": "true"})
    assert (code, out) == (0, "vwxyz</s>vwxyz</s>\n")
    assert capfd.readouterr().out == ""
    code, out, _ = run_guest(remote, tmp_path, "complete", ["succ", "u"])
    assert (code, out, capfd.readouterr().out) == (0, "vwxyz</s>\n", "")


def test_pieces_stream_as_they_are_generated(remote: WasiNN) -> None:
    """Compute with stream-stdout gets one piece per token through ComputePieces, then the output."""
    with remote.session("succ", {"n-predict": 5}) as session:
        context = session._context
        context.set_prompt(b"abc")
        pieces: list[bytes] = []
        context.generate(pieces.append)
        assert pieces == [b"d", b"e", b"f", b"g", b"h"]
        assert session.metadata["output_tokens"] == 5 and bytes(context.output) == b"defgh"


def test_stream_stdout_from_a_server_without_compute_pieces(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """WasmEdge's server (no ComputePieces): the client writes the whole output after compute."""

    def unimplemented(self: NNService, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")

    monkeypatch.setattr(NNService, "ComputePieces", unimplemented)
    srv = serve(registry, tmp_path / "nn.sock")
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        code, out, _ = run_guest(client, tmp_path, "complete", ["succ", "u"], env={"stream_stdout": "true"})
        assert (code, out, capfd.readouterr().out) == (0, "vwxyz</s>vwxyz</s>\n", "")
    finally:
        client.close()
        srv.stop(1)


def test_stream_stdout_through_the_commands(tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    """`wasinn serve` + `wasinn run --nn-rpc-uri` print what an in-process run prints."""
    sock = tmp_path / "ss.sock"
    proc = serve_command(sock, successor_path)
    try:
        outputs = []
        for where in (["--nn-rpc-uri", f"unix:{sock}"], ["--nn-preload", f"succ:GGML:AUTO:{successor_path}"]):
            run = subprocess.run(
                [sys.executable, "-m", "wasinn_host.cli", "run", *where, "--env", "stream_stdout=1"]
                + [str(GUESTS / "complete.wasm"), "succ", "w"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            outputs.append((run.returncode, run.stdout))
        assert outputs == [(0, "xyz</s>xyz</s>\n")] * 2  # the streamed pieces, then the guest's own print
    finally:
        proc.kill()


def test_sessions_cannot_see_each_other(server: NNServer) -> None:
    channel = grpc.insecure_channel(server.address.target)
    graph, resource = nn_grpc.GraphStub(channel), nn_grpc.GraphResourceStub(channel)
    context = nn_grpc.GraphExecutionContextResourceStub(channel)
    alice, bob = ((SESSION_KEY, "alice"),), ((SESSION_KEY, "bob"),)
    handle = graph.LoadByName(nn.LoadByNameRequest(name="succ"), metadata=alice).graph_handle
    ctx = resource.InitExecutionContext(nn.InitExecutionContextRequest(resource_handle=handle), metadata=alice)
    request = nn.ComputeRequest(resource_handle=ctx.ctx_handle)
    assert errno_of_call(context.Compute, request, bob) == 1
    assert errno_of_call(context.Compute, request) == 1  # nor the anonymous scope
    bob_init = nn.InitExecutionContextRequest(resource_handle=handle)
    assert errno_of_call(resource.InitExecutionContext, bob_init, bob) == 1
    channel.close()


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_disconnect_frees_the_session(server: NNServer, registry: ModelRegistry) -> None:
    client = WasiNN(rpc=server.address.target)
    session = client.session("succ")
    assert session.complete("x") == "yz</s>"
    assert server.scopes.status()["contexts"] == 1
    client.close()  # the keep-alive stream ends: the server frees the session's context and graph
    assert wait_for(
        lambda: server.scopes.status() == {"sessions": 0, "attached": 0, "contexts": 0, "freed_sessions": 1}
    )


def test_unix_socket_is_private(server: NNServer) -> None:
    assert server.address.unix_path is not None
    assert stat.S_IMODE(os.stat(server.address.unix_path).st_mode) == 0o600


def test_token_is_required_on_every_call(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    srv = serve(registry, tmp_path / "tok.sock", token="s3cret")
    try:
        stranger = WasiNN(rpc=srv.address.target)
        with pytest.raises(WasiNNError) as info:
            stranger.session("succ")
        assert info.value.kind is ErrorKind.RUNTIME_ERROR and "UNAUTHENTICATED" in info.value.message
        stranger.close()
        friend = WasiNN(rpc=srv.address.target, rpc_options=ClientOptions(token="s3cret"))
        with friend.session("succ", {"n-predict": 2}) as session:
            assert session.complete("a") == "bc"
        friend.close()
        channel = grpc.insecure_channel(srv.address.target)  # health checks need no token
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        channel.close()
    finally:
        srv.stop(1)


def test_non_loopback_needs_token_or_tls(registry: ModelRegistry) -> None:
    with pytest.raises(TargetError, match="non-loopback"):
        NNServer("0.0.0.0:0", LocalBackend(registry))
    srv = NNServer("0.0.0.0:0", LocalBackend(registry), options=ServeOptions(token="t"))
    srv.stop(0)


def test_messages_over_4_mib(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    """GRPC's 4 MiB default does not apply: the server's limits do."""
    limits = Limits(max_prompt_bytes=8 << 20, allow_load_bytes=True, max_load_bytes=6 << 20)
    srv = serve(registry, tmp_path / "big.sock", limits, allow_load_bytes=True)
    client = WasiNN(rpc=srv.address.target, limits=limits)
    try:
        blob = b"\x00" * (5 << 20)  # 5 MiB of not-a-model reaches the server, which checks it
        with pytest.raises(WasiNNError) as info:
            client.backend.load_bytes(blob, nn_config())
        assert info.value.kind in (ErrorKind.INVALID_ARGUMENT, ErrorKind.INVALID_ENCODING), info.value
        with pytest.raises(WasiNNError) as info:  # over max_load_bytes: the server says TooLarge
            client.backend.load_bytes(b"\x00" * (7 << 20), nn_config())
        assert info.value.kind is ErrorKind.TOO_LARGE
        with pytest.raises(WasiNNError) as info:  # over every limit: gRPC refuses the message, errno 5
            too_big = (8 << 20) + INLINE_IMAGE_ROOM + (1 << 20)  # a prompt's text and inline images
            client.backend.load_bytes(b"\x00" * too_big, nn_config())
        assert info.value.kind is ErrorKind.RUNTIME_ERROR and "RESOURCE_EXHAUSTED" in info.value.message
    finally:
        client.close()
        srv.stop(1)


def nn_config() -> Any:
    from wasinn_host.core.config import EMPTY_CONFIG

    return EMPTY_CONFIG


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
    """A server killed while a guest streams: the next call gets errno 5 at once, never a silent 0."""
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


def make_certificate(directory: pathlib.Path) -> tuple[bytes, bytes]:
    """A self-signed certificate for localhost (openssl), as (cert PEM, key PEM)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert.read_bytes(), key.read_bytes()


def test_tls_on_a_public_address(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    """TLS lets serve listen beyond loopback; a client with the CA gets answers, one without cannot connect."""
    cert, key = make_certificate(tmp_path)
    srv = NNServer("0.0.0.0:0", LocalBackend(registry), options=ServeOptions(tls_cert=cert, tls_key=key))
    srv.start()
    target = f"localhost:{srv.port}"
    try:
        trusted = WasiNN(rpc=target, rpc_options=ClientOptions(tls_ca=cert))
        with trusted.session("succ", {"n-predict": 3}) as session:
            assert session.complete("a") == "bcd"
        trusted.close()
        plain = WasiNN(rpc=target, rpc_options=ClientOptions(unary_timeout=5))
        with pytest.raises(WasiNNError) as info:
            plain.session("succ")
        assert info.value.kind is ErrorKind.RUNTIME_ERROR
        plain.close()
    finally:
        srv.stop(0)
