"""WASI-NN over gRPC, client sessions: a keep-alive stream cut on the way loses no handle (the client opens
it again, the server keeps the session meanwhile), a client that never comes back is freed after the
server's grace, and the stream carries a heartbeat so that no proxy takes it for idle."""

from __future__ import annotations

import logging
import pathlib
import threading
import time

import grpc
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.limits import Limits
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.rpc.messages import SESSION_KEY, host, host_grpc, nn, nn_grpc
from wasinn_host.rpc.server import NNServer
from wasinn_host.rpc.sessions import SessionScopes

from .servers import nn_config, serve, wait_for


def test_a_keep_alive_stream_cut_on_the_way_loses_no_handle(server: NNServer, caplog: pytest.LogCaptureFixture) -> None:
    client = WasiNN(rpc=server.address.target)
    try:
        session = client.session("succ")
        assert session.complete("x") == "yz</s>"
        (endpoint,) = client.backend.endpoints.values()  # type: ignore[attr-defined]
        time.sleep(1.1)  # a stream that worked a while (one cut at once is retried after a wait)
        first = endpoint.keeper._stream
        with caplog.at_level(logging.INFO, logger="wasinn_host"):
            first.cancel()  # as a proxy's reset would: the server sees the stream end, the client is alive
            assert wait_for(lambda: endpoint.keeper._stream is not first and server.scopes.status()["attached"] == 1)
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
        client.close()  # a second close does nothing
    assert wait_for(lambda: server.scopes.status()["freed_sessions"] == 1)


def test_an_outage_the_session_survives_keeps_its_handles_and_frees_what_closed_meanwhile(server: NNServer) -> None:
    client = WasiNN(rpc=server.address.target)
    try:
        first, second = client.session("succ"), client.session("succ")
        assert first.complete("x") == "yz</s>"
        (endpoint,) = client.backend.endpoints.values()  # type: ignore[attr-defined]
        assert wait_for(lambda: endpoint.keeper.scope is not None)
        (scope,) = server.scopes._scopes.values()
        assert (len(scope.graphs), len(scope.contexts)) == (1, 2)
        endpoint.mark_down("a blip")  # as a call that found the server unreachable would
        second.close()  # while down: finalised once the server answers again
        time.sleep(1.1)  # the endpoint is probed again after a second
        third = client.session("succ")  # the probe finds the server with the same scope
        assert endpoint.down_since is None
        assert third.complete("x") == "yz</s>"
        assert (len(scope.graphs), len(scope.contexts)) == (1, 2), "the graph was shared again, the context freed"
        assert first.complete("x") == "yz</s>"
    finally:
        client.close()


def test_a_server_that_lost_the_session_is_used_afresh(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    sock = tmp_path / "again.sock"
    srv = serve(registry, sock)
    client = WasiNN(rpc=srv.address.target)
    try:
        assert client.session("succ").complete("x") == "yz</s>"
        (endpoint,) = client.backend.endpoints.values()  # type: ignore[attr-defined]
        assert wait_for(lambda: endpoint.keeper.scope is not None)
        srv.stop(0)
        srv = serve(registry, sock)  # a new server: the session's handles are gone
        assert wait_for(lambda: endpoint.keeper.scope == srv.scopes.scope_id(client.backend.session), 15.0)  # type: ignore[attr-defined]
        assert client.session("succ").complete("x") == "yz</s>"  # the graph is loaded anew there
    finally:
        client.close()
        srv.stop(0)


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


def test_a_refused_load_leaves_the_servers_own_service_in_use(server: NNServer) -> None:
    client = WasiNN(rpc=server.address.target)
    try:
        with pytest.raises(WasiNNError) as info:  # the server takes no models as bytes (no --allow-load-bytes)
            client.backend.load_bytes(b"GGUF", nn_config())
        assert info.value.kind is ErrorKind.UNSUPPORTED
        (endpoint,) = client.backend.endpoints.values()  # type: ignore[attr-defined]
        assert endpoint.has_host is not False
        assert client.backend.status()["rpc"]["backends"][0]["status"]["rpc"]["sessions"] >= 1
    finally:
        client.close()
    assert wait_for(lambda: server.scopes.status()["freed_sessions"] == 1)  # told by Detach, not after the grace


def test_sessions_waiting_out_their_grace_share_one_thread() -> None:
    scopes = SessionScopes(Limits(), grace_s=0.3)
    before = set(threading.enumerate())
    for i in range(50):  # as after a proxy's restart: every client's stream ends at once
        scopes.scope(f"s{i}")
        scopes.attach(f"s{i}")
        scopes.detach(f"s{i}")
    assert scopes.status()["orphaned"] == 50
    assert [thread.name for thread in set(threading.enumerate()) - before] == ["wasinn-grace"]
    scopes.attach("s7")  # one client comes back in time
    assert wait_for(lambda: scopes.status()["freed_sessions"] == 49)
    assert scopes.status() == {"sessions": 1, "attached": 1, "orphaned": 0, "contexts": 0, "freed_sessions": 49}
    scopes.close()
