"""Fixtures for the RPC tests: an in-process server on a unix socket and a WasiNN using it."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.rpc.server import NNServer

from .servers import serve


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
