"""Every field of ``Limits`` passed to ``WasiNN(limits=...)`` takes effect (fake runtime, milliseconds)."""

from __future__ import annotations

import dataclasses
import pathlib
import struct
import threading
import time
from collections.abc import Callable

import pytest
from conftest import MakeNN

from wasinn_host import Errno, Limits, WasiNN
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.testing.abi_guest import AbiGuest

pytestmark = pytest.mark.fast

MODEL_AT, BUILDERS_AT = 0x2000, 0x1F00


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def worker(nn: WasiNN) -> ModelWorker:
    (model,) = nn.registry.loaded()
    return model.worker


def load_bytes(guest: AbiGuest, data: bytes) -> int:
    guest.write(MODEL_AT, data)
    guest.write(BUILDERS_AT, struct.pack("<2I", MODEL_AT, len(data)))
    return guest.call("load", BUILDERS_AT, 1, 6, 0, guest.OUT32)


def context(guest: AbiGuest, config: str | None = None) -> int:
    rc, graph = guest.load_by_name("succ", config)
    assert rc == 0
    rc, ctx = guest.init(graph)
    assert rc == 0
    return ctx


def blocked_serial_model(make_nn: MakeNN, limits: Limits) -> tuple[WasiNN, threading.Thread]:
    """A host whose one sequence is busy for about a second (an endless digit cycle, slow decodes)."""
    nn = make_nn(limits, decode_delay=0.01)
    blocker = AbiGuest.create(nn)
    ctx = context(blocker, '{"n-parallel": 1}')
    assert blocker.set_input(ctx, 1, '{"n-predict": 100}') == 0
    assert blocker.set_input(ctx, 0, "7") == 0
    thread = threading.Thread(target=blocker.call, args=("compute", ctx), daemon=True)
    thread.start()
    wait_for(lambda: bool(nn.registry.loaded()) and worker(nn).active == 1, "the blocker to run")
    return nn, thread


def check_max_contexts_per_store(make_nn: MakeNN, model: bytes) -> None:
    guest = AbiGuest.create(make_nn(Limits(max_contexts_per_store=2)))
    graph = guest.load_by_name("succ")[1]
    assert [guest.init(graph)[0] for _ in range(3)] == [0, 0, Errno.BUSY]


def check_max_contexts_total(make_nn: MakeNN, model: bytes) -> None:
    nn = make_nn(Limits(max_contexts_total=2))
    guests = [AbiGuest.create(nn) for _ in range(3)]
    codes = [g.init(g.load_by_name("succ")[1])[0] for g in guests]
    assert codes == [0, 0, Errno.BUSY]


def check_max_graphs_per_store(make_nn: MakeNN, model: bytes) -> None:
    guest = AbiGuest.create(make_nn(Limits(max_graphs_per_store=1)))
    assert guest.load_by_name("succ")[0] == 0
    assert load_bytes(guest, model) == Errno.BUSY


def check_max_queue(make_nn: MakeNN, model: bytes) -> None:
    nn, blocker = blocked_serial_model(make_nn, Limits(max_queue=1))
    queued = AbiGuest.create(nn)
    ctx = context(queued, '{"n-parallel": 1}')
    assert queued.set_input(ctx, 0, "a") == 0
    waiting = threading.Thread(target=queued.call, args=("compute", ctx), daemon=True)
    waiting.start()
    wait_for(lambda: worker(nn).queued == 1, "the second request to queue")
    third = AbiGuest.create(nn)
    ctx3 = context(third, '{"n-parallel": 1}')
    assert third.set_input(ctx3, 0, "a") == 0
    assert third.call("compute", ctx3) == Errno.BUSY
    blocker.join()
    waiting.join()


def check_queue_timeout_ms(make_nn: MakeNN, model: bytes) -> None:
    nn, blocker = blocked_serial_model(make_nn, Limits(queue_timeout_ms=50))
    late = AbiGuest.create(nn)
    ctx = context(late, '{"n-parallel": 1}')
    assert late.set_input(ctx, 0, "a") == 0
    assert late.call("compute", ctx) == Errno.BUSY
    blocker.join()


def check_idle_timeout_ms(make_nn: MakeNN, model: bytes) -> None:
    nn = make_nn(Limits(idle_timeout_ms=100))
    guest = AbiGuest.create(nn)
    ctx = context(guest)
    wait_for(lambda: nn.status()["sessions"]["execution_contexts"] == 0, "the idle context to be finalised")
    assert guest.set_input(ctx, 0, "a") == Errno.INVALID_ARGUMENT


def check_max_prompt_bytes(make_nn: MakeNN, model: bytes) -> None:
    guest = AbiGuest.create(make_nn(Limits(max_prompt_bytes=4)))
    ctx = context(guest)
    assert guest.set_input(ctx, 0, "abcd") == 0
    assert guest.set_input(ctx, 0, "abcde") == Errno.TOO_LARGE


def check_max_output_bytes(make_nn: MakeNN, model: bytes) -> None:
    guest = AbiGuest.create(make_nn(Limits(max_output_bytes=5)))
    ctx = context(guest)
    assert guest.set_input(ctx, 0, "a") == 0
    assert guest.call("compute", ctx) == Errno.TOO_LARGE
    assert guest.get_output(ctx) == (0, b"bcdefg"), "the output up to the limit is kept"


def check_max_n_predict(make_nn: MakeNN, model: bytes) -> None:
    guest = AbiGuest.create(make_nn(Limits(max_n_predict=3)))
    ctx = context(guest)
    assert guest.set_input(ctx, 1, '{"n-predict": 4}') == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 0, "a") == 0
    assert guest.call("compute", ctx) == 0
    assert guest.get_output(ctx) == (0, b"bcd"), "an unlimited n-predict stops at the limit"


def check_allow_load_bytes(make_nn: MakeNN, model: bytes) -> None:
    guest = AbiGuest.create(make_nn(Limits(allow_load_bytes=False)))
    assert load_bytes(guest, model) == Errno.UNSUPPORTED_OPERATION
    assert guest.load_by_name("succ")[0] == 0


def check_max_load_bytes(make_nn: MakeNN, model: bytes) -> None:
    guest = AbiGuest.create(make_nn(Limits(max_load_bytes=len(model) - 1)))
    assert load_bytes(guest, model) == Errno.TOO_LARGE


def check_max_kv_bytes(make_nn: MakeNN, model: bytes) -> None:
    # the fake runtime's KV cache is 1 KiB a cell; a sequence is 512 cells
    guest = AbiGuest.create(make_nn(Limits(max_kv_bytes=1 << 20)))
    assert guest.load_by_name("succ", '{"n-parallel": 4}')[0] == Errno.TOO_LARGE, "4 x 512 cells: 2 MiB"
    assert guest.load_by_name("succ")[0] == 0, "without n-parallel it starts with the 2 sequences that fit"
    (model_entry,) = guest.nn.status()["models"]
    assert model_entry["kv_cache_bytes"] == 1 << 20
    small = AbiGuest.create(make_nn(Limits(max_kv_bytes=256 << 10)))
    assert small.load_by_name("succ")[0] == Errno.TOO_LARGE, "less than one sequence"
    assert small.load_by_name("succ", '{"ctx-size": 128}')[0] == 0


CHECKS: dict[str, Callable[[MakeNN, bytes], None]] = {
    name.removeprefix("check_"): check for name, check in globals().items() if name.startswith("check_")
}


def test_every_limit_has_a_check() -> None:
    assert set(CHECKS) == {f.name for f in dataclasses.fields(Limits)}


@pytest.mark.parametrize("field", sorted(CHECKS))
def test_limit_passed_to_wasinn_takes_effect(field: str, make_nn: MakeNN, fake_model: pathlib.Path) -> None:
    CHECKS[field](make_nn, fake_model.read_bytes())
