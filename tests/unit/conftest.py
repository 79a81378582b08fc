"""Fixtures for the fast section: hosts on the fake runtime (pure Python, no llama.cpp)."""

from __future__ import annotations

import pathlib
import struct
from collections.abc import Callable, Iterator

import pytest

from wasinn_host import Limits, WasiNN
from wasinn_host.backend.fake import FakeRuntime, fake_backend

GGUF_HEADER = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)


@pytest.fixture
def fake_model(tmp_path: pathlib.Path) -> pathlib.Path:
    """A file the fake runtime accepts as a model (a bare GGUF header)."""
    path = tmp_path / "fake.gguf"
    path.write_bytes(GGUF_HEADER)
    return path


MakeNN = Callable[..., WasiNN]


@pytest.fixture
def make_nn(fake_model: pathlib.Path) -> Iterator[MakeNN]:
    """``make_nn(limits=None, decode_delay=0.0, n_ctx_train=512)``: a WasiNN whose name ``succ`` is
    the fake successor model; every host made is closed after the test."""
    made: list[WasiNN] = []

    def make(limits: Limits | None = None, decode_delay: float = 0.0, n_ctx_train: int = 512) -> WasiNN:
        backend = fake_backend(
            [f"succ:GGML:AUTO:{fake_model}"], limits, FakeRuntime(n_ctx_train=n_ctx_train, decode_delay=decode_delay)
        )
        made.append(WasiNN(backend=backend))
        return made[-1]

    yield make
    for nn in made:
        nn.registry.close()
