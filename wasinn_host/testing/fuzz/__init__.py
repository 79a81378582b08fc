"""Stateful fuzzers of the host's two hand-written ABIs, driven by ``hypothesis`` (a test-only dependency).

:mod:`.abi` drives the 12 ``wasi_ephemeral_nn`` imports through a real wasm instance
(``tests/ephemeral/test_fuzz.py``, ``scripts/tools/fuzz_abi.py``), with its environment (:mod:`.abi_env`)
and the values it draws (:mod:`.abi_values`); :mod:`.sockets` does the same for WasmEdge's
socket extension (``tests/sockets/test_socket_fuzz.py``, ``scripts/tools/fuzz_sockets.py``), with its peers
(:mod:`.socket_peers`), the memory ranges a call may write (:mod:`.socket_ranges`), the values it draws
(:mod:`.socket_values`) and the run's shared parts (:mod:`.socket_env`).

Importing this package without ``hypothesis`` installed raises an ImportError that says how to get it.
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401  (every fuzzer's state machine is built on it)
except ImportError as exc:
    raise ImportError(
        "wasinn_host.testing.fuzz needs hypothesis, a test dependency: pip install 'wasinn-host[test]'",
        name="hypothesis",
    ) from exc
