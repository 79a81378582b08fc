"""Many guests, one model: batching, prompt reuse, queueing, limits, hot swap, status."""

from __future__ import annotations

import json
import pathlib
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import wasmtime

from wasinn_host import Errno, Limits, ModelRegistry, WasiNN
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.testing.abi_guest import AbiGuest, streaming_guest_wat
from wasinn_host.testing.gguf_models import successor_text

T = TypeVar("T")

PROMPTS = ["a", "hello", "m", "Q", "xy", "tuv", "C", "k"]


def expected(prompt: str) -> str:
    return successor_text(prompt) + "</s>"


def run_threads(count: int, target: Callable[..., T], *args: object) -> list[T]:
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = target(i, *args)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "deadlock: a guest thread did not finish"
    if errors:
        raise errors[0]
    return [results[i] for i in range(count)]


def wait_for(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll until ``condition()`` is true (instead of sleeping a guessed time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def serial_worker(registry: ModelRegistry) -> ModelWorker:
    """The worker of the one-sequence model the queue tests use (loaded on first use)."""
    return next(m.worker for m in registry.loaded() if m.params.n_parallel == 1)


@pytest.fixture
def own_registry(successor_path: pathlib.Path) -> Iterator[ModelRegistry]:
    reg = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
    yield reg
    reg.close()


def test_parallel_guests_match_their_solo_outputs(nn: WasiNN) -> None:
    def one(i: int) -> tuple[int, str]:
        guest = AbiGuest.create(nn)
        graph = guest.load_by_name("succ")[1]
        return guest.generate(graph, PROMPTS[i])

    results = run_threads(len(PROMPTS), one)
    assert results == [(0, expected(p)) for p in PROMPTS]


def test_32_guests_x_20_requests_no_deadlock_no_leak(nn: WasiNN) -> None:
    model = nn.registry.acquire_named("succ", ModelParams())
    nn.registry.release(model)
    requests_before = model.worker.requests

    def one(i: int) -> list[str]:
        guest = AbiGuest.create(nn)
        graph = guest.load_by_name("succ")[1]
        texts = []
        for r in range(20):
            prompt = PROMPTS[(i + r) % len(PROMPTS)]
            ctx = guest.init(graph)[1]
            assert guest.set_input(ctx, 1, '{"temp": 0}') == 0
            assert guest.set_input(ctx, 0, prompt) == 0
            assert guest.call("compute", ctx) == 0
            texts.append(guest.get_output(ctx)[1].decode())
            assert guest.call("finalize_execution_context", ctx) == 0
        nn.detach(guest.store)
        return texts

    results = run_threads(32, one)
    for i, texts in enumerate(results):
        assert texts == [expected(PROMPTS[(i + r) % len(PROMPTS)]) for r in range(20)]
    assert model.worker.requests - requests_before == 32 * 20
    assert model.worker.queued == 0 and model.worker.active == 0
    assert all(not slot.busy for slot in model.worker.slots)
    assert nn.imports.contexts_alive.value == 0


TRAP_MID_STREAM = streaming_guest_wat("unreachable")


def test_guest_that_traps_mid_stream_frees_its_sequence(nn: WasiNN) -> None:
    from wasinn_host import GuestError

    module = wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(TRAP_MID_STREAM)))
    alive = nn.imports.contexts_alive.value
    with pytest.raises(GuestError, match="trapped"):
        nn.run(module)
    assert nn.imports.contexts_alive.value == alive
    model = next(m for m in nn.registry.loaded() if m.name == "succ" and m.params.ctx_size == 0)
    deadline = time.monotonic() + 5  # the worker frees released sequences asynchronously
    while any(s.owner is not None and s.owner.closed for s in model.worker.slots) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(slot.owner is None or not slot.owner.closed for slot in model.worker.slots)
    assert not any(slot.busy for slot in model.worker.slots)


def test_full_queue_answers_busy(own_registry: ModelRegistry) -> None:
    nn = WasiNN(registry=own_registry, limits=Limits(max_queue=1))
    config = '{"ctx-size": 4096, "n-parallel": 1}'
    results: dict[str, int] = {}

    def long_job(name: str, prompt: str, n: int) -> None:
        guest = AbiGuest.create(nn)
        graph = guest.load_by_name("succ", config)[1]
        results[name] = guest.generate(graph, prompt, json.dumps({"n-predict": n}))[0]

    first = threading.Thread(target=long_job, args=("first", "7", 1000))
    first.start()
    wait_for(
        lambda: (
            any(m.params.n_parallel == 1 for m in own_registry.loaded()) and serial_worker(own_registry).active == 1
        ),
        "the first job to run",
    )
    second = threading.Thread(target=long_job, args=("second", "a", 5))
    second.start()
    wait_for(lambda: serial_worker(own_registry).queued == 1, "the second job to queue")
    guest = AbiGuest.create(nn)
    rc, text = guest.generate(guest.load_by_name("succ", config)[1], "b")
    assert rc == Errno.BUSY
    first.join(60)
    second.join(60)
    assert results == {"first": 0, "second": 0}
    status = nn.status()
    assert status["performance"]["rejected_busy"] >= 1


def test_priority_orders_the_queue(own_registry: ModelRegistry) -> None:
    nn = WasiNN(registry=own_registry, limits=Limits(max_queue=64))
    config = '{"ctx-size": 4096, "n-parallel": 1}'
    finished: list[str] = []

    def job(name: str, prompt: str, meta: dict) -> None:
        guest = AbiGuest.create(nn)
        graph = guest.load_by_name("succ", config)[1]
        guest.generate(graph, prompt, json.dumps(meta))
        finished.append(name)

    blocker = threading.Thread(target=job, args=("blocker", "7", {"n-predict": 1000}))
    blocker.start()
    wait_for(
        lambda: (
            any(m.params.n_parallel == 1 for m in own_registry.loaded()) and serial_worker(own_registry).active == 1
        ),
        "the blocker to run",
    )
    low = threading.Thread(target=job, args=("low", "a", {"priority": -5}))
    low.start()
    wait_for(lambda: serial_worker(own_registry).queued == 1, "the low-priority job to queue")
    high = threading.Thread(target=job, args=("high", "b", {"priority": 5}))
    high.start()
    wait_for(lambda: serial_worker(own_registry).queued == 2, "the high-priority job to queue")
    for t in (blocker, low, high):
        t.join(60)
    assert finished == ["blocker", "high", "low"]


def test_queue_timeout_answers_busy(own_registry: ModelRegistry) -> None:
    nn = WasiNN(registry=own_registry, limits=Limits(max_queue=64))
    config = '{"ctx-size": 4096, "n-parallel": 1}'
    blocker_guest = AbiGuest.create(nn)
    blocker = threading.Thread(
        target=blocker_guest.generate, args=(blocker_guest.load_by_name("succ", config)[1], "7", '{"n-predict": 2500}')
    )
    blocker.start()
    wait_for(
        lambda: (
            any(m.params.n_parallel == 1 for m in own_registry.loaded()) and serial_worker(own_registry).active == 1
        ),
        "the blocker to run",
    )
    guest = AbiGuest.create(nn)
    rc, _ = guest.generate(guest.load_by_name("succ", config)[1], "a", '{"queue-timeout-ms": 50}')
    assert rc == Errno.BUSY
    blocker.join(60)


def test_prompt_prefix_is_reused_and_outputs_stay_identical(nn: WasiNN) -> None:
    guest = AbiGuest.create(nn)
    graph = guest.load_by_name("succ")[1]
    ctx = guest.init(graph)[1]
    first = "the conversation so far: " * 8 + "a"
    second = first + " and now k"
    for prompt, reused in ((first, None), (second, len(first) + 1)):
        assert guest.set_input(ctx, 0, prompt) == 0
        assert guest.call("compute", ctx) == 0
        assert guest.get_output(ctx)[1].decode() == expected(prompt)
        meta = json.loads(guest.get_output(ctx, 1)[1])
        if reused is not None:
            assert meta["reused_tokens"] == reused
    # cache-prompt false decodes everything again, same output
    assert guest.set_input(ctx, 1, '{"cache-prompt": false}') == 0
    assert guest.call("compute", ctx) == 0
    assert json.loads(guest.get_output(ctx, 1)[1])["reused_tokens"] == 0
    assert guest.get_output(ctx)[1].decode() == expected(second)


def test_ctx_shift_instead_of_context_full(nn: WasiNN) -> None:
    guest = AbiGuest.create(nn)
    graph = guest.load_by_name("succ", '{"ctx-size": 32}')[1]
    rc, text = guest.generate(graph, "0", '{"n-predict": 100}')
    assert rc == Errno.CONTEXT_FULL
    rc, text = guest.generate(graph, "0", '{"n-predict": 100, "ctx-shift": true, "n-keep": 2}')
    assert (rc, text) == (0, successor_text("0", 100))


def test_hot_swap_under_load_loses_no_request(model_dir: pathlib.Path, successor_path: pathlib.Path) -> None:
    copies = []
    for i in range(3):
        copy = model_dir / f"swap-{i}.gguf"
        shutil.copy(successor_path, copy)
        copies.append(copy)
    registry = ModelRegistry([f"live:GGML:AUTO:{copies[0]}"])
    nn = WasiNN(registry=registry)
    stop = threading.Event()

    def client(i: int) -> int:
        done = 0
        while not stop.is_set() or done < 5:
            guest = AbiGuest.create(nn)
            graph = guest.load_by_name("live")[1]
            prompt = PROMPTS[(i + done) % len(PROMPTS)]
            assert guest.generate(graph, prompt) == (0, expected(prompt))
            nn.detach(guest.store)
            done += 1
        return done

    def swapper(_: int) -> int:
        for copy in copies[1:] + copies[:1]:
            time.sleep(0.2)
            nn.swap_model("live", copy)
        stop.set()
        return 0

    counts = run_threads(7, lambda i: swapper(i) if i == 6 else client(i))
    assert all(c >= 5 for c in counts[:6])
    live = [m for m in registry.loaded() if m.name == "live"]
    assert len(live) <= 1 and all(not m.stale for m in live), "old models are freed"
    registry.close()


def test_idle_contexts_are_reclaimed(registry: ModelRegistry) -> None:
    nn = WasiNN(registry=registry, limits=Limits(idle_timeout_ms=100))
    guest = AbiGuest.create(nn)
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    assert guest.set_input(ctx, 0, "a") == 0
    time.sleep(0.6)
    assert guest.call("compute", ctx) == Errno.INVALID_ARGUMENT
    assert nn.imports.contexts_alive.value == 0


def test_context_and_graph_limits(registry: ModelRegistry) -> None:
    nn = WasiNN(registry=registry, limits=Limits(max_contexts_per_store=2, max_graphs_per_store=1))
    guest = AbiGuest.create(nn)
    graph = guest.load_by_name("succ")[1]
    assert guest.init(graph)[0] == 0 and guest.init(graph)[0] == 0
    assert guest.init(graph)[0] == Errno.BUSY
    assert guest.call("finalize_execution_context", 0) == 0
    assert guest.init(graph)[0] == 0
    assert guest.load_by_name("noisy")[0] == Errno.BUSY
    assert guest.load_by_name("succ") == (0, graph), "the cached name needs no new graph"


def test_status_json(nn: WasiNN) -> None:
    guest = AbiGuest.create(nn)
    guest.generate(guest.load_by_name("succ")[1], "a")
    status = nn.status()
    json.dumps(status)
    assert set(status) >= {"queue", "memory", "sessions", "performance", "models"}
    model = next(m for m in status["models"] if m["name"] == "succ")
    assert model["weights_bytes"] > 0 and model["kv_cache_bytes"] > 0 and model["requests"] >= 1
    assert status["sessions"]["execution_contexts"] >= 1
    assert nn.get_backend_status()["queue"]["queued"] == 0


def test_prometheus_endpoint(nn: WasiNN) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    guest = AbiGuest.create(nn)
    guest.generate(guest.load_by_name("succ")[1], "a")
    nn.serve_metrics(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'wasinn_requests_total{model="succ"}' in body
    assert "wasinn_execution_contexts" in body


def test_dropping_an_embedders_store_frees_its_contexts(nn: WasiNN) -> None:
    import gc

    before = nn.imports.contexts_alive.value
    guest = AbiGuest.create(nn)
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    assert guest.set_input(ctx, 0, "a") == 0 and guest.call("compute", ctx) == 0
    assert nn.imports.contexts_alive.value == before + 1
    del guest
    gc.collect()
    assert nn.imports.contexts_alive.value == before


def test_a_guest_checking_its_model_file_holds_no_one_else_up(
    own_registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model file's checks ask the file system (and let other threads run): a guest in them must not
    hold the model table, or every guest starting beside it, opening a context of a loaded model, waits
    for it to run again (8 guests' contexts opened 11-23 ms late)."""
    from wasinn_host.core import registry as registry_module

    model = own_registry.acquire_named("succ", ModelParams())
    checking, go_on = threading.Event(), threading.Event()
    check = registry_module.check_model_path

    def slow_check(path: pathlib.Path, what: str = "") -> None:
        if threading.current_thread().name == "slow-guest":
            checking.set()
            go_on.wait(30)
        check(path, what)

    monkeypatch.setattr(registry_module, "check_model_path", slow_check)
    slow = threading.Thread(target=own_registry.acquire_named, args=("succ", ModelParams()), name="slow-guest")
    slow.start()
    try:
        assert checking.wait(30)
        retained = threading.Event()

        def retain() -> None:
            own_registry.retain(model)
            retained.set()

        threading.Thread(target=retain, daemon=True).start()
        assert retained.wait(5), "a context's retain waited for another guest's file check"
    finally:
        go_on.set()
        slow.join(30)
    assert model.refs == 3
    for _ in range(3):
        own_registry.release(model)
