"""WASI-NN over gRPC, security: sessions kept apart and freed on disconnect, a private unix socket, the token,
TLS on a public address, and messages over 4 MiB."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.backend.local import LocalBackend
from wasinn_host.core.config.limits import INLINE_IMAGE_ROOM, Limits
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.rpc.endpoint import ClientOptions
from wasinn_host.rpc.messages import SESSION_KEY, nn, nn_grpc
from wasinn_host.rpc.server import NNServer, ServeOptions
from wasinn_host.rpc.targets import TargetError

from .servers import errno_of_call, nn_config, serve, wait_for


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


def test_disconnect_frees_the_session(server: NNServer, registry: ModelRegistry) -> None:
    client = WasiNN(rpc=server.address.target)
    session = client.session("succ")
    assert session.complete("x") == "yz</s>"
    assert server.scopes.status()["contexts"] == 1
    client.close()  # the client says Detach: the server frees the session's context and graph at once, not
    # after the 30 s it keeps a session whose keep-alive stream ended for its client to come back
    assert wait_for(
        lambda: (
            server.scopes.status() == {"sessions": 0, "attached": 0, "orphaned": 0, "contexts": 0, "freed_sessions": 1}
        )
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
