"""Shared fixtures: test models built by the project's own code, hosts and guest paths."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.testing.gguf_models import write_successor_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("models")
    write_successor_model(directory / "successor.gguf")
    write_successor_model(directory / "successor-random.gguf", logit_gap=1.0)
    return directory


@pytest.fixture(scope="session")
def successor_path(model_dir: pathlib.Path) -> pathlib.Path:
    return model_dir / "successor.gguf"


@pytest.fixture(scope="session")
def registry(model_dir: pathlib.Path) -> Iterator[ModelRegistry]:
    """One registry for the session: models load once and are shared by every test's Stores."""
    reg = ModelRegistry([
        f"succ:GGML:AUTO:{model_dir / 'successor.gguf'}",
        f"noisy:GGML:AUTO:{model_dir / 'successor-random.gguf'}",
        f"missing:GGML:CPU:{model_dir / 'no-such-model.gguf'}",
    ])
    yield reg
    reg.close()


@pytest.fixture
def nn(registry: ModelRegistry) -> WasiNN:
    return WasiNN(registry=registry)
