"""WASI-NN over gRPC, client sessions: a keep-alive stream cut on the way loses no handle (the client opens
it again, the server keeps the session meanwhile), a client that never comes back is freed after the
server's grace, and the stream carries a heartbeat so that no proxy takes it for idle."""

from __future__ import annotations

import pathlib
import threading
import time

import grpc
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.rpc.messages import SESSION_KEY, host, host_grpc, nn, nn_grpc
from wasinn_host.rpc.server import NNServer

from .servers import serve, wait_for


def test_a_keep_alive_stream_cut_on_the_way_loses_no_handle(server: NNServer, caplog: pytest.LogCaptureFixture) -> None:
    client = WasiNN(rpc=server.address.target)
    try:
        session = client.session("succ")
        assert session.complete("x") == "yz</s>"
        (endpoint,) = client.backend.endpoints.values()  # type: ignore[attr-defined]
        first = endpoint._attach
        first.cancel()  # as a proxy's reset would: the server sees the stream end, the client is alive
        assert wait_for(lambda: endpoint._attach is not first and server.scopes.status()["attached"] == 1)
        assert server.scopes.status() == {
            "sessions": 1,
            "attached": 1,
            "orphaned": 0,
            "contexts": 1,
            "freed_sessions": 0,
        }
        assert session.complete("x") == "yz</s>"  # the same context, on the same server
        assert "keep-alive stream ended" in caplog.text
    finally:
        client.close()
    assert wait_for(lambda: server.scopes.status()["freed_sessions"] == 1)


def _open_session(channel: grpc.Channel, name: str) -> tuple[tuple[tuple[str, str], ...], object]:
    """A raw client session with one context open; its keep-alive stream, its first event read."""
    metadata = ((SESSION_KEY, name),)
    graph = nn_grpc.GraphStub(channel).LoadByName(nn.LoadByNameRequest(name="succ"), metadata=metadata)
    init = nn.InitExecutionContextRequest(resource_handle=graph.graph_handle)
    nn_grpc.GraphResourceStub(channel).InitExecutionContext(init, metadata=metadata)
    stream = host_grpc.HostStub(channel).Attach(host.AttachRequest(), metadata=metadata)
    assert next(stream).session == name
    return metadata, stream


def test_a_client_that_never_comes_back_is_freed_after_the_grace(
    registry: ModelRegistry, tmp_path: pathlib.Path
) -> None:
    srv = serve(registry, tmp_path / "grace.sock", session_grace_s=0.5)
    channel = grpc.insecure_channel(srv.address.target)
    try:
        _, stream = _open_session(channel, "gone")
        assert srv.scopes.status()["contexts"] == 1
        stream.cancel()  # type: ignore[attr-defined]  # and no Detach: the client died
        assert wait_for(lambda: srv.scopes.status()["orphaned"] == 1)
        assert srv.scopes.status()["contexts"] == 1  # kept for the grace
        assert wait_for(
            lambda: (
                srv.scopes.status() == {"sessions": 0, "attached": 0, "orphaned": 0, "contexts": 0, "freed_sessions": 1}
            )
        )
    finally:
        channel.close()
        srv.stop(0)


def test_detach_frees_at_once_and_a_second_stream_keeps_the_session(
    registry: ModelRegistry, tmp_path: pathlib.Path
) -> None:
    srv = serve(registry, tmp_path / "detach.sock")  # the default grace: 30 s
    channel = grpc.insecure_channel(srv.address.target)
    try:
        metadata, stream = _open_session(channel, "two")
        second = host_grpc.HostStub(channel).Attach(host.AttachRequest(), metadata=metadata)
        next(second)
        stream.cancel()  # type: ignore[attr-defined]  # one of two streams ends: nothing waits to be freed
        assert wait_for(lambda: srv.scopes.status()["attached"] == 1)
        time.sleep(0.2)
        assert srv.scopes.status()["orphaned"] == 0 and srv.scopes.status()["contexts"] == 1
        host_grpc.HostStub(channel).Detach(host.DetachRequest(), metadata=metadata)
        assert srv.scopes.status()["contexts"] == 0 and srv.scopes.status()["freed_sessions"] == 1
        second.cancel()
        assert wait_for(lambda: srv.scopes.status()["attached"] == 0)
        assert srv.scopes.status()["freed_sessions"] == 1  # the stream's end frees nothing twice
    finally:
        channel.close()
        srv.stop(0)


def test_the_keep_alive_stream_carries_a_heartbeat(server: NNServer) -> None:
    server.service.heartbeat_s = 0.05
    channel = grpc.insecure_channel(server.address.target)
    stream = host_grpc.HostStub(channel).Attach(host.AttachRequest(), metadata=((SESSION_KEY, "beat"),))
    events: list[str] = []

    def read() -> None:
        for event in stream:
            events.append(event.session)
            if len(events) == 4:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    stream.cancel()
    channel.close()
    assert events == ["beat"] * 4
