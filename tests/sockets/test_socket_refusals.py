"""A refused socket call names the rule that refused it (issue 28 item 7): connect and bind through a WAT probe
on the real host, one log line each."""

from __future__ import annotations

import logging
import socket

import pytest
import wasmtime

from wasinn_host import WasiNN
from wasinn_host.sockets import SocketPolicy
from wasinn_host.testing.guest_runs import GUESTS

SERVER = GUESTS / "socket_server.wasm"


# -- item 7: a refusal names the rule that refused it ----------------------------------------------

ACCES = 2  # errno: the guest may not reach that address

PROBE_WAT = """(module
  (import "wasi_snapshot_preview1" "sock_open" (func $open (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_bind" (func $bind (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_connect" (func $connect (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; the V1 address {buf = 32, len = 4} at 16; the IPv4 address bytes at 32 are written by the test
  (func $sock (result i32)
    (i32.store (i32.const 16) (i32.const 32))
    (i32.store (i32.const 20) (i32.const 4))
    (if (call $open (i32.const 1) (i32.const 2) (i32.const 0)) (then unreachable))
    (i32.load (i32.const 0)))
  (func (export "connect") (param $port i32) (result i32)
    (call $connect (call $sock) (i32.const 16) (local.get $port)))
  (func (export "bind") (param $port i32) (result i32)
    (call $bind (call $sock) (i32.const 16) (local.get $port))))
"""


def probe_call(policy: SocketPolicy, what: str, ip: str, port: int) -> int:
    nn = WasiNN(sockets=policy)
    module = wasmtime.Module(nn.engine, PROBE_WAT)
    linker = wasmtime.Linker(nn.engine)
    linker.define_wasi()
    nn.sockets.link(linker, module)
    store = wasmtime.Store(nn.engine)
    store.set_wasi(wasmtime.WasiConfig())
    nn.attach(store)
    exports = linker.instantiate(store, module).exports(store)
    memory = exports["memory"]
    assert isinstance(memory, wasmtime.Memory)
    memory.write(store, socket.inet_aton(ip), 32)
    func = exports[what]
    assert isinstance(func, wasmtime.Func)
    result = func(store, port)
    nn.detach(store)
    assert isinstance(result, int)
    return result


@pytest.mark.parametrize(
    ("connect", "port", "why"),
    [
        ([], 9, "outbound connections are off"),
        (["127.0.0.1:8080"], 9, "--sock-allow-connect 127.0.0.1:8080 allows port 8080 only"),
        (
            ["127.0.0.1:8080", "127.0.0.1:8081", "10.0.0.1"],
            9,
            "--sock-allow-connect 127.0.0.1:8080, --sock-allow-connect 127.0.0.1:8081 allow ports 8080, 8081 only",
        ),
        (["10.0.0.1", "10.0.0.2:80"], 9, "no --sock-allow-connect rule names 127.0.0.1 (given: 10.0.0.1, 10.0.0.2:80)"),
    ],
)
def test_a_refused_connect_names_the_rule_that_refused_it(
    connect: list[str], port: int, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        assert probe_call(SocketPolicy.from_specs(connect=connect), "connect", "127.0.0.1", port) == ACCES
    assert [r.getMessage() for r in caplog.records] == [
        f"refused the guest's outbound connection to 127.0.0.1:{port}: {why}; "
        f"allow it with --sock-allow-connect 127.0.0.1:{port} (or --sock-allow-connect all)"
    ]


def test_a_refused_bind_names_the_rule_that_refused_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        assert probe_call(SocketPolicy.from_specs(bind=["0.0.0.0:8080"]), "bind", "0.0.0.0", 0) == ACCES
    assert [r.getMessage() for r in caplog.records] == [
        "refused the guest's bind to 0.0.0.0:0: --sock-allow-bind 0.0.0.0:8080 allows port 8080 only; "
        "allow it with --sock-allow-bind 0.0.0.0 (or --sock-allow-bind all)"
    ]
