"""Shared fixtures: test models built by the project's own code, hosts on llama.cpp and on the fake runtime;
and the speed split: every test in a module without ``pytestmark = pytest.mark.fast`` is marked ``slow``
(it needs llama.cpp or real guests), so ``pytest -m "not slow"`` runs the fast set in seconds."""

from __future__ import annotations

import pathlib
import struct
from collections.abc import Callable, Iterator

import pytest

from wasinn_host import Limits, ModelRegistry, WasiNN
from wasinn_host.backend.fake import FakeRuntime, fake_backend
from wasinn_host.testing.gguf_models import write_successor_model

pytest_plugins = ["pytester"]  # tests/testing/test_pytest_plugin.py runs throwaway pytest projects


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test not marked ``fast`` (the fast modules set ``pytestmark = pytest.mark.fast``)."""
    for item in items:
        if item.get_closest_marker("fast") is None:
            item.add_marker(pytest.mark.slow)


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
    reg = ModelRegistry(test_preloads(model_dir))
    yield reg
    reg.close()


@pytest.fixture
def nn(registry: ModelRegistry) -> WasiNN:
    return WasiNN(registry=registry)


def test_preloads(model_dir: pathlib.Path) -> list[str]:
    """The names every host in the tests serves: two successor models and a missing file."""
    return [
        f"succ:GGML:AUTO:{model_dir / 'successor.gguf'}",
        f"noisy:GGML:AUTO:{model_dir / 'successor-random.gguf'}",
        f"missing:GGML:CPU:{model_dir / 'no-such-model.gguf'}",
    ]


test_preloads.__test__ = False  # type: ignore[attr-defined]  # pytest's marker; mypy allows no function attributes


@pytest.fixture(scope="session")
def preload_specs(model_dir: pathlib.Path) -> list[str]:
    """The ``--nn-preload`` strings of the test models (for hosts a test builds itself)."""
    return test_preloads(model_dir)


@pytest.fixture(scope="session")
def fake_registry(model_dir: pathlib.Path) -> Iterator[ModelRegistry]:
    """The same names served by the fake runtime (pure Python, no llama.cpp)."""
    reg = ModelRegistry(test_preloads(model_dir), runtime=FakeRuntime())
    yield reg
    reg.close()


@pytest.fixture(params=["llama", "fake"])
def any_nn(request: pytest.FixtureRequest, registry: ModelRegistry, fake_registry: ModelRegistry) -> WasiNN:
    """A host on llama.cpp, then the same on the fake runtime: tests using it run on both."""
    if request.param == "fake":
        return WasiNN(registry=fake_registry)
    return WasiNN(registry=registry)


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
