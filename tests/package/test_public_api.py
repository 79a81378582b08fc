"""The public surface: ``wasinn_host.__all__`` names what an embedder needs, a plain ``import wasinn_host``
stays light, and the fuzzers say what they need when ``hypothesis`` is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

import wasinn_host

pytestmark = pytest.mark.fast

LIGHT = """
import sys
import wasinn_host
print(sorted(m for m in sys.modules if m.split(".")[0] in ("grpc", "llama_cpp", "hypothesis", "gguf")
             or m.startswith(("wasinn_host.rpc.", "wasinn_host.wit", "wasinn_host.testing", "wasinn_host.cli"))))
"""

NO_HYPOTHESIS = """
import sys
sys.modules["hypothesis"] = None  # as if it were not installed
try:
    import wasinn_host.testing.fuzz.abi
except ImportError as exc:
    print(exc)
"""


def test_every_public_name_resolves_to_its_own_definition() -> None:
    names = {name: getattr(wasinn_host, name) for name in wasinn_host.__all__}
    assert names["WasiNN"].__module__ == "wasinn_host.host"
    assert names["ClientOptions"].__module__ == "wasinn_host.rpc.endpoint"  # imported on first use
    assert names["fake_backend"].__module__ == "wasinn_host.backend.fake"
    assert names["__version__"] == "0.1.0"
    assert sorted(wasinn_host.__all__) == sorted(set(wasinn_host.__all__))


def test_the_core_modules_the_docs_once_named_still_give_their_public_names() -> None:
    """``core/``'s modules moved into its rooms (issue 39); the two import paths the guides gave before
    re-export what they named."""
    from wasinn_host.core.preload import Preload, PreloadError, parse_preload
    from wasinn_host.core.prompt_cache import PromptCache

    assert (Preload, PreloadError, parse_preload, PromptCache) == (
        wasinn_host.Preload,
        wasinn_host.PreloadError,
        wasinn_host.parse_preload,
        wasinn_host.PromptCache,
    )


def test_the_fixture_types_are_imported_from_the_test_tooling_not_the_package() -> None:
    """The package stands above no layer of its test tooling: ``RunGuest`` and ``GuestResult`` are the
    harness's (where the docs import them from), and asking the package for one names that module."""
    assert {"RunGuest", "GuestResult"}.isdisjoint(wasinn_host.__all__)
    with pytest.raises(AttributeError, match=r"import it from wasinn_host\.testing\.guest_harness"):
        wasinn_host.RunGuest  # noqa: B018


def test_importing_the_package_loads_neither_grpc_nor_llama_nor_the_test_tools() -> None:
    out = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_fuzzers_name_the_extra_they_need_without_hypothesis() -> None:
    out = subprocess.run([sys.executable, "-c", NO_HYPOTHESIS], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == (
        "wasinn_host.testing.fuzz needs hypothesis, a test dependency: pip install 'wasinn-host[test]'"
    )
