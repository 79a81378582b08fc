"""Stateful fuzzing of WasmEdge's socket imports: random hostile calls through a real wasm instance.

The state machine and what it checks live in ``wasinn_host/testing/fuzz/sockets.py`` (shared with
``scripts/tools/fuzz_sockets.py``, which runs it for longer and over seeds).  This CI run is
derandomized and sized for a few seconds; two more runs plant a host bug each and check the fuzzer
reports it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from wasinn_host.sockets import linking
from wasinn_host.sockets.call import Call
from wasinn_host.testing.fuzz.sockets import SocketFuzzEnv, make_env, run_socket_fuzz
from wasinn_host.testing.socket_probe import V1, V2, signatures

EXAMPLES = 12
STEPS = 30
MIN_CALLS = 150
"""The run must really exercise the host: at least this many calls (about 350 are made)."""


@pytest.fixture
def env() -> Iterator[SocketFuzzEnv]:
    made = make_env()
    yield made
    made.close()


def test_fuzz_socket_imports(env: SocketFuzzEnv) -> None:
    stats = run_socket_fuzz(env, EXAMPLES, STEPS)
    print("\n" + stats.report())
    assert stats.calls >= MIN_CALLS, f"only {stats.calls} calls were made"
    every = set(signatures("v1")) | set(V2)
    assert set(V1) | set(V2) <= every
    missing = every - set(stats.by_import)
    assert len(missing) <= 3, f"imports never called: {missing}"
    # the calls reach past argument checking: sockets are made, bound, listened on, connected, used
    for name in ("sock_open", "sock_bind", "sock_connect", "sock_getsockopt", "fd_fdstat_get"):
        assert stats.by_import_errno[(name, 0)] > 0, f"{name} never succeeded"
    assert stats.warnings > 0, "no call was refused with a log line"


def _planted(env: SocketFuzzEnv) -> str:
    with pytest.raises(AssertionError) as failure:
        run_socket_fuzz(env, 30, 20, seed=7, shrink=False)
    return str(failure.value)


def test_the_fuzzer_reports_a_write_past_the_output(env: SocketFuzzEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: fd_fdstat_get on a socket writes one byte past its 24-byte record."""
    real = linking.VARIANTS["fd_fdstat_get"][2]

    def leaky(call: Call, fd: int, stat_ptr: int) -> int:
        code = real(call, fd, stat_ptr)
        if stat_ptr + 25 <= 2 * 65536:
            call.view.write(stat_ptr + 24, b"\xaa", "planted")
        return code

    monkeypatch.setitem(linking.VARIANTS["fd_fdstat_get"], 2, leaky)
    message = _planted(env)
    assert "fd_fdstat_get" in message and "changed guest bytes it names no output for" in message


def test_the_fuzzer_reports_an_unexpected_exception(env: SocketFuzzEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug: sock_shutdown raises KeyError; the guest gets an errno, and the ERROR line is a failure."""

    def broken(call: Call, fd: int, how: int) -> int:
        raise KeyError(how)

    monkeypatch.setitem(linking.VARIANTS["sock_shutdown"], 2, broken)
    message = _planted(env)
    assert "sock_shutdown" in message and "logged a host error" in message and "unexpected KeyError" in message
