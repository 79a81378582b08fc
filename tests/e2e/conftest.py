"""Fixtures for the real-model tests (test_real_models*.py): the files, one host and one native model per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.real_models import real_model_or_skip

from .real import LOAD


@pytest.fixture(scope="session")
def model_paths() -> dict[str, Path]:
    return {name: real_model_or_skip(name) for name in ("smollm2", "gemma3")}


@pytest.fixture(scope="session")
def real_nn(model_paths: dict[str, Path]) -> Iterator[WasiNN]:
    registry = ModelRegistry([f"{name}:GGML:AUTO:{path}" for name, path in model_paths.items()])
    yield WasiNN(registry=registry)
    registry.close()


@pytest.fixture(scope="session")
def natives(model_paths: dict[str, Path]) -> Iterator[dict[str, NativeModel]]:
    models = {name: NativeModel(path, threads=LOAD["threads"]) for name, path in model_paths.items()}
    yield models
    for native in models.values():
        native.close()
