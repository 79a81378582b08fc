"""WASI-NN over gRPC: real guests through `wasinn serve`'s server and the remote backend, a raw
grpcio client speaking exactly what WasmEdge's client sends, errno trailers, streamed pieces. Sessions and
security are in test_rpc_security.py, the commands and scale-out in test_rpc_commands.py."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
import time
from typing import Any

import grpc
import pytest

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.core.generation import StopReason
from wasinn_host.core.inference import InferenceContext
from wasinn_host.launch.runner import run_instances
from wasinn_host.rpc import stream_push
from wasinn_host.rpc.messages import SESSION_KEY, host, host_grpc, nn, nn_grpc
from wasinn_host.rpc.server import NNServer
from wasinn_host.rpc.service import NNService
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS, run_guest

from .servers import errno_of_call, serve, serve_command

CASES = [
    ("complete", ["succ", "hello"], {}, None),
    ("complete", ["succ", "3"], {"n_predict": "8"}, None),
    ("complete", ["succ", "a"], {"reverse_prompt": "fg"}, None),
    ("complete", ["nope", "a"], {}, None),
    ("complete", ["missing", "a"], {}, None),
    ("complete", ["succ", "1"], {"ctx_size": "32"}, None),
    ("chat", ["succ"], {"temp": "0"}, "hello\nabc\n"),
]


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


@pytest.fixture
def stream_runs_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the server sends the pieces of the tokens sampled ahead, its stream's job has sampled all
    it will (paused ``LOOKAHEAD`` ahead, or ended): what a guest slower than the model meets, made exact."""
    original = InferenceContext.ready_pieces

    def after_the_job(self: InferenceContext, limit: int) -> list[bytes]:
        feed = self._feed
        while feed is not None and feed.running:
            time.sleep(0.001)
        return original(self, limit)

    monkeypatch.setattr(InferenceContext, "ready_pieces", after_the_job)


def _unimplemented(monkeypatch: pytest.MonkeyPatch, *methods: str) -> None:
    """The server answers these methods as one without them does (an older wasinn serve, WasmEdge's)."""

    def unimplemented(self: NNService, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")

    for method in methods:
        monkeypatch.setattr(NNService, method, unimplemented)


def test_stream_pieces_are_pushed_as_they_are_sampled(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, stream_runs_ahead: None
) -> None:
    """Against wasinn serve, a stream is one StreamSingle call: the server pushes each token's piece (here
    all 23 in its first message: a pushed stream's job samples ``PUSH_LOOKAHEAD`` ahead, where an in-process
    stream's would have paused at ``LOOKAHEAD``, 16, until the guest's reports came), the client reports
    the steps its guest took, and the end comes with one ComputeSingleOutput: no call a token."""
    calls: list[str] = []
    _count_calls(monkeypatch, calls, "ComputeSingle", "ComputeSingleOutput", "GetOutputSingle", "StreamSingle")
    pushed: list[int] = []
    reported: list[int] = []
    results, take = stream_push.PushSender.results, stream_push.PushSender._take_reported

    def counted_results(self: stream_push.PushSender) -> Any:
        for message in results(self):
            pushed.append(len(message.ready))
            yield message

    def counted_take(self: stream_push.PushSender) -> None:
        before = self.taken
        take(self)
        if self.taken > before:
            reported.append(self.taken - before)

    monkeypatch.setattr(stream_push.PushSender, "results", counted_results)
    monkeypatch.setattr(stream_push.PushSender, "_take_reported", counted_take)
    srv = serve(registry, tmp_path / "nn.sock")
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        with client.session("succ") as session:
            assert b"".join(session.stream("abc")) == b"defghijklmnopqrstuvwxyz"
        assert calls == ["StreamSingle", "ComputeSingleOutput"]
        assert (pushed[0], sum(pushed), sum(reported)) == (23, 23, 23)
    finally:
        client.close()
        srv.stop(1)


def test_a_job_paused_before_the_guest_reported_goes_on_after_its_report(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, stream_runs_ahead: None
) -> None:
    """A server whose streams sample fewer tokens ahead than the client takes between two reports: each
    job pauses with the guest's steps not reported; the server says so, the client reports before it waits,
    and the stream goes on, the same text."""
    monkeypatch.setattr(stream_push, "PUSH_LOOKAHEAD", 3)
    calls: list[str] = []
    _count_calls(monkeypatch, calls, "StreamSingle", "ComputeSingleOutput")
    srv = serve(registry, tmp_path / "nn.sock")
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        with client.session("succ") as session:
            assert b"".join(session.stream("abc")) == b"defghijklmnopqrstuvwxyz"
            assert b"".join(session.stream("k", max_tokens=5)) == b"lmnop"
        assert calls == ["StreamSingle", "ComputeSingleOutput", "StreamSingle"]
    finally:
        client.close()
        srv.stop(1)


def test_streams_beyond_the_servers_pushes_take_the_plain_calls(
    registry: ModelRegistry, tmp_path: pathlib.Path
) -> None:
    """A server with 4 serving threads pushes 2 streams at once (each holds a thread while open): a third
    stream at the same time is refused and streamed with ComputeSingleOutput instead, the same text."""
    srv = serve(registry, tmp_path / "nn.sock", max_workers=4)
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        sessions = [client.session("succ") for _ in range(3)]
        streams = [session.stream(prompt) for session, prompt in zip(sessions, ("abc", "klm", "tuv"))]
        texts = [b"", b"", b""]
        firsts = [next(stream) for stream in streams]  # three streams open at once
        for i, stream in enumerate(streams):
            texts[i] = firsts[i] + b"".join(stream)
        assert texts == [successor_text(p).encode() for p in ("abc", "klm", "tuv")]
        assert srv.service._pushes == 0
        for session in sessions:
            session.close()
    finally:
        client.close()
        srv.stop(1)


def test_a_draining_server_ends_its_pushed_streams(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that starts to shut down ends each pushed stream after the pieces sampled (a stream its
    guest stopped reading would hold the drain), and pushes no more: the guest's next steps are plain
    calls (which a stopping server refuses; this one still answers them), and the text is the same."""
    calls: list[str] = []
    _count_calls(monkeypatch, calls, "StreamSingle", "ComputeSingleOutput")
    srv = serve(registry, tmp_path / "nn.sock")
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        with client.session("succ") as session:
            stream = session.stream("abc")
            first = [next(stream) for _ in range(3)]
            srv.service.end_pushes()  # what stop() does first
            assert b"".join(first) + b"".join(stream) == b"defghijklmnopqrstuvwxyz"
        assert calls[0] == "StreamSingle" and calls.count("ComputeSingleOutput") > 1
    finally:
        client.close()
        srv.stop(1)


def test_streaming_takes_a_round_trip_per_tokens_not_yet_sampled(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, stream_runs_ahead: None
) -> None:
    """Against a wasinn serve without StreamSingle, compute_single brings its piece along (no
    GetOutputSingle) and the pieces of the tokens already sampled after it, which the next steps take with
    no call: 23 letters and the end in 3 calls (1 + 16 ready, 1 + 5 ready, the end), each reporting the
    steps taken since the last."""
    _unimplemented(monkeypatch, "StreamSingle")
    calls: list[str] = []
    _count_calls(monkeypatch, calls, "ComputeSingle", "ComputeSingleOutput", "GetOutputSingle")
    srv = serve(registry, tmp_path / "nn.sock")
    client = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        with client.session("succ") as session:
            assert b"".join(session.stream("abc")) == b"defghijklmnopqrstuvwxyz"
            assert b"".join(session.stream("x")) == b"yz"
        assert calls == ["ComputeSingleOutput"] * 5
    finally:
        client.close()
        srv.stop(1)


@pytest.mark.parametrize("server_lacks", [(), ("StreamSingle",)], ids=["pushed", "ahead"])
def test_steps_taken_ahead_are_reported_before_any_other_call(
    nn: WasiNN,
    registry: ModelRegistry,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    stream_runs_ahead: None,
    server_lacks: tuple[str, ...],
) -> None:
    """Metadata read in the middle of a stream, a stream ended early and the next one: over RPC, with
    steps answered from pieces pushed or sent ahead, the same as in-process."""

    def steps(host: WasiNN) -> list[object]:
        seen: list[object] = []
        with host.session("succ", {"temp": 0}) as session:
            for i, piece in enumerate(session.stream("abc", max_tokens=6)):
                seen.append(piece)
                if i in (1, 4):
                    meta = session.metadata
                    seen.append((meta["input_tokens"], meta["output_tokens"]))
            meta = session.metadata
            seen.append((meta["input_tokens"], meta["output_tokens"]))
            seen.append(b"".join(session.stream("uvw")))
            seen.append(session.complete("abc"))
        return seen

    local = steps(nn)
    assert local[:3] == [b"d", b"e", (4, 2)]  # BOS and three letters in, two tokens out
    _unimplemented(monkeypatch, *server_lacks)
    srv = serve(registry, tmp_path / "nn.sock")
    remote = WasiNN(rpc=f"unix:{srv.address.unix_path}")
    try:
        assert steps(remote) == local
        assert steps(remote) == local
    finally:
        remote.close()
        srv.stop(1)


def test_a_cancelled_stream_fails_over_rpc_as_in_process(nn: WasiNN, remote: WasiNN) -> None:
    """A stream cancelled between two steps: the steps whose tokens were sampled already give their pieces,
    then the step fails with a runtime error, and the context's next stream fails too; the same pushed."""

    def cancelled(host: WasiNN) -> tuple[bytes, ErrorKind, ErrorKind]:
        with host.session("succ", {"temp": 0}) as session:
            context = session._context
            context.set_prompt(b"a")
            pieces = []
            for _ in range(3):
                assert context.stream_step().stop_reason is StopReason.TOKEN
                pieces.append(context.last_piece)
            context.cancel()
            with pytest.raises(WasiNNError) as failed:
                while True:
                    assert context.stream_step().stop_reason is StopReason.TOKEN
                    pieces.append(context.last_piece)
            with pytest.raises(WasiNNError) as again:
                list(session.stream("x"))
        return b"".join(pieces), failed.value.kind, again.value.kind

    text, *errors = cancelled(nn)
    assert successor_text("a").encode().startswith(text) and len(text) >= 3
    assert errors == [ErrorKind.RUNTIME_ERROR, ErrorKind.RUNTIME_ERROR]
    text, *errors = cancelled(remote)
    assert successor_text("a").encode().startswith(text) and len(text) >= 3
    assert errors == [ErrorKind.RUNTIME_ERROR, ErrorKind.RUNTIME_ERROR]


def test_streaming_falls_back_to_two_calls(
    registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server without StreamSingle and ComputeSingleOutput (an older wasinn serve): the same pieces,
    two calls a token."""
    _unimplemented(monkeypatch, "StreamSingle", "ComputeSingleOutput")
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


def test_async_session_over_rpc(remote: WasiNN, registry: ModelRegistry) -> None:
    """session_async over RPC (each call on a thread of the loop's executor): complete and stream answer
    as the blocking session does; leaving a stream after two of its five pieces ends it on the server (no
    sequence busy there; the session's next complete answers right)."""

    async def main() -> tuple[str, list[bytes], list[bytes], str]:
        async with remote.session_async("succ", {"n-predict": 5}) as s:
            text = await s.complete("abc")
            pieces = [piece async for piece in s.stream("abc")]
            stream = s.stream("0")
            early = [await stream.__anext__(), await stream.__anext__()]
            await stream.aclose()
            return text, pieces, early, await s.complete("x")

    text, pieces, early, after = asyncio.run(main())
    with remote.session("succ", {"n-predict": 5}) as blocking:
        assert text == blocking.complete("abc") == "defgh"
        assert pieces == list(blocking.stream("abc"))
    assert early == [b"1", b"2"]
    assert after == "yz</s>"
    assert [model.worker.busy_sequences for model in registry.loaded()] == [0] * len(registry.loaded())


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
