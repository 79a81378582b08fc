"""Stateful ABI fuzzing: random call sequences over all 12 imports through a real wasm instance.

The state machine and the properties it checks live in ``wasinn_host/testing/fuzz/abi.py`` (shared with
``scripts/tools/fuzz_abi.py``, which runs it for longer).  This CI run is derandomized (the same call
sequences every time) and sized for about a minute on a 2-core machine.
"""

from __future__ import annotations

import pathlib
import sys
import threading
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.ephemeral.imports import SIGNATURES
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.fuzz.abi import run_fuzz
from wasinn_host.testing.fuzz.abi_env import FuzzEnv, make_env

EXAMPLES = 200
STEPS = 50
MIN_CALLS = 6000
"""The run must really exercise the host: at least this many import calls (about 9,500 are made)."""


@pytest.fixture(scope="module")
def fuzz_env(model_dir: pathlib.Path) -> Iterator[FuzzEnv]:
    """Its own registry: the fuzzer checks every model's reference count against its one Store."""
    env = make_env(model_dir)
    yield env
    env.registry.close()


def test_fuzz_abi_state_machine(fuzz_env: FuzzEnv) -> None:
    stats = run_fuzz(fuzz_env, EXAMPLES, STEPS)
    print("\n" + stats.report())
    assert stats.calls >= MIN_CALLS, f"only {stats.calls} calls were made"
    assert set(stats.by_import) == set(SIGNATURES), f"imports never called: {set(SIGNATURES) - set(stats.by_import)}"
    # the runs reach the interesting paths, not only argument validation
    for name in (
        "load",
        "load_by_name",
        "init_execution_context",
        "set_input",
        "compute",
        "get_output",
        "compute_single",
        "get_output_single",
        "unload",
        "finalize_execution_context",
    ):
        assert stats.by_import_errno[(name, 0)] > 0, f"{name} never succeeded"
    assert stats.errnos[7] > 0 and stats.errnos[100] > 0, "TooLarge / EndOfSequence never returned"


# -- host bugs the fuzzer found (fixed; kept as regression tests) ---------------------------------


def test_logit_bias_out_of_vocabulary_is_rejected_not_hung(successor_path: pathlib.Path) -> None:
    """A logit-bias id past the vocabulary made compute wait for ever (the model's worker thread
    dropped the job when building its sampler failed)."""
    registry = ModelRegistry(
        [  # its own: a hang leaves a slot busy
            f"succ:GGML:AUTO:{successor_path}",
            f"other:GGML:AUTO:{successor_path}",
        ]
    )
    guest = AbiGuest.create(WasiNN(registry=registry))
    rc, graph = guest.load_by_name("succ")
    assert rc == 0
    rc, ctx = guest.init(graph)
    assert rc == 0
    rc = guest.set_input(ctx, 1, '{"logit-bias": {"100000": 1.0}, "n-predict": 4}')
    assert rc in (0, 1)
    assert guest.set_input(ctx, 0, "a") == 0
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(guest.call("compute", ctx)), daemon=True)
    worker.start()
    worker.join(20)
    assert result, "compute did not return within 20 s (the thread stays blocked for good)"
    assert result[0] == (1 if rc == 0 else 0), f"compute gave {result[0]}"
    assert guest.load_by_name("other", '{"logit-bias": [[354, 2.0]]}')[0] == 1, "in a load config: rejected too"
    registry.close()


def test_load_of_gguf_with_duplicate_token_is_refused_and_the_host_survives(successor_path: pathlib.Path) -> None:
    """A GGUF whose vocabulary has a duplicate token string made llama.cpp abort the host process
    (GGML_ASSERT(id_to_token.size() == token_to_id.size())); run in a child so a regression is a
    failure here, not a dead test run."""
    import subprocess

    code = f"""
import struct, sys
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host import ModelRegistry, WasiNN
model = bytearray(open({str(successor_path)!r}, "rb").read())
one = struct.pack("<Q", 1)
at = model.index(one + b"a" + one + b"b")   # the vocabulary strings "a", "b"
model[at + 17] = ord("a")                   # "b" -> "a": a duplicate token string
guest = AbiGuest.create(WasiNN(registry=ModelRegistry()), memory_pages=64)
guest.write(0x10000, bytes(model))
guest.write(0x100, struct.pack("<2I", 0x10000, len(model)))
print("errno", guest.call("load", 0x100, 1, 6, 0, 0x40))
print("errno", guest.call("load", 0x100, 1, 6, 0, 0x40))  # the second refusal comes from the cache
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the host process died (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
    assert proc.stdout.split() == ["errno", "1", "errno", "1"], proc.stdout
