"""pytest plugin: the ``wasinn_run`` fixture tests prebuilt WASI-NN guests in-process.

Registered through the ``pytest11`` entry point, so installing wasinn-host is enough (with plugin
autoloading off, ``-p wasinn_host.pytest_plugin``)::

    def test_my_guest(wasinn_run):
        result = wasinn_run("build/guest.wasm", ["default", "abc"], model="successor")
        assert result.exit_code == 0
        assert "defghijklmnopqrstuvwxyz" in result.stdout
        assert result.calls["compute"] == 1

``model`` is a built-in test model (``successor``, ``demo``, ``random``, ``tts``: ``wasinn model --list``),
a name that ``--wasinn-model NAME=PATH`` gives a file, or a GGUF path; ``name`` is the preload name
the guest loads (default ``default``); ``env``, ``dirs``, ``stdin``, ``timeout`` and any
:class:`~wasinn_host.Limits` field as a keyword work as for ``wasinn run``.  ``result.stdout`` is the
guest's stdout as ``wasinn run`` prints it, ``stream-stdout`` pieces included.  The work is done by
:class:`~wasinn_host.testing.guest_harness.GuestHarness`, one per test session: models are written
and loaded once, guests compiled once.  This module imports only pytest at start-up, so every
pytest session of a machine with wasinn-host installed stays as quick to start as before.

A file a guest names itself, such as the vocoder of a text-to-speech graph (``model-vocoder``), comes
from the ``wasinn_model_file`` fixture: ``wasinn_model_file("vocoder")`` is the session's file for that
name (written once, or the ``--wasinn-model vocoder=PATH`` file), to give the guest through ``dirs``::

    def test_my_tts_guest(wasinn_run, wasinn_model_file, tmp_path):
        vocoder = wasinn_model_file("vocoder")
        env = {"tts": "true", "tts_output_file": "output.wav", "model_vocoder": f"/models/{vocoder.name}"}
        dirs = [(str(tmp_path), "."), (str(vocoder.parent), "/models")]
        result = wasinn_run("build/tts.wasm", ["default", "Hello"], model="tts", env=env, dirs=dirs)
        assert result.exit_code == 0 and len((tmp_path / "output.wav").read_bytes()) == 25_644
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import pytest

if TYPE_CHECKING:
    from .testing.guest_harness import DirSpec, GuestHarness, GuestResult, GuestSource, RunGuest
    from .testing.model_catalog import ModelSpec

_OVERRIDES = pytest.StashKey[dict[str, Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--wasinn-model NAME=PATH``."""
    group = parser.getgroup("wasinn", "WASI-NN guests (wasinn_run fixture)")
    group.addoption(
        "--wasinn-model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="serve this GGUF file wherever a test asks wasinn_run (or wasinn_model_file) for model NAME (a "
        "built-in test model such as demo or vocoder, or any name the tests use); repeatable",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Check the ``--wasinn-model`` values before any test runs (one usage error line if malformed)."""
    from .testing.model_catalog import parse_override

    overrides: dict[str, Path] = {}
    for spec in config.getoption("wasinn_model", default=None) or []:
        try:
            name, path = parse_override(spec)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        overrides[name] = path
    config.stash[_OVERRIDES] = overrides


@pytest.fixture(scope="session")
def wasinn_harness(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestHarness]:
    """The session's guest runner: models written and loaded once, guests compiled once."""
    from .testing.guest_harness import GuestHarness
    from .testing.model_catalog import ModelFiles

    models = ModelFiles(tmp_path_factory.mktemp("wasinn-models"), request.config.stash.get(_OVERRIDES, {}))
    harness = GuestHarness(models, tmp_path_factory.mktemp("wasinn-runs"))
    yield harness
    harness.close()


@pytest.fixture
def wasinn_run(wasinn_harness: GuestHarness) -> RunGuest:
    """Run a guest in-process: ``wasinn_run(module, args, model=..., name=..., env=..., dirs=..., stdin=...,
    timeout=..., **limits)`` returns its ``exit_code``, ``stdout``, ``stderr`` and ``calls``."""
    from .testing.model_catalog import ModelToolsMissing, UnknownModel

    def run(
        module: GuestSource,
        args: Sequence[str] = (),
        *,
        model: ModelSpec = "demo",
        name: str = "default",
        env: Mapping[str, str] | None = None,
        dirs: Sequence[DirSpec] = (),
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        **limits: int | bool,
    ) -> GuestResult:
        try:
            return wasinn_harness.run(
                module, args, model=model, name=name, env=env, dirs=dirs, stdin=stdin, timeout=timeout, limits=limits
            )
        except (UnknownModel, ModelToolsMissing) as exc:
            message = f"wasinn_run: {exc}"
        pytest.fail(message, pytrace=False)  # outside the except: one line, no chained traceback

    return run


@pytest.fixture
def wasinn_model_file(wasinn_harness: GuestHarness) -> Callable[[str], Path]:
    """``wasinn_model_file(name)``: the file the session serves for a model name (a built-in written once,
    or the ``--wasinn-model NAME=PATH`` file), e.g. the ``vocoder`` a TTS guest names in ``model-vocoder``."""
    from .testing.model_catalog import ModelToolsMissing, UnknownModel

    def path(name: str) -> Path:
        try:
            return wasinn_harness.models.path(name).resolve()
        except (UnknownModel, ModelToolsMissing) as exc:
            message = f"wasinn_model_file: {exc}"
        pytest.fail(message, pytrace=False)

    return path
