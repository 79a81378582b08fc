"""Execution contexts a guest opens and never finalizes (LlamaEdge's servers open one per request) cost
almost nothing while idle: thousands fit in one Store, an evicted one answers as an uninterrupted one
would, and a server in that shape keeps serving with flat memory and descriptors."""

from __future__ import annotations

import http.client
import os
import pathlib
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator

import pytest

from wasinn_host import Errno, Limits, ModelRegistry, WasiNN
from wasinn_host.core.scheduler import WARM_CONTEXTS
from wasinn_host.ephemeral.handles import HandleTables
from wasinn_host.guest.store_tables import store_key
from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

ONE_THREAD = '{"threads": 1}'  # one llama.cpp thread: thousands of tiny computes, no thread hand-offs
PROMPTS = ("abc", "hello", "u", "xy", "mnop")
WAIT = 30.0


def store_state(guest: AbiGuest) -> HandleTables:
    state = guest.nn.imports.stores.lookup(store_key(guest.store))
    assert state is not None
    return state


def ask(guest: AbiGuest, ctx: int, prompt: str) -> str:
    """set_input + compute + get_output on ``ctx``; the output text."""
    assert guest.set_input(ctx, 0, prompt) == 0
    assert guest.call("compute", ctx) == 0
    rc, out = guest.get_output(ctx)
    assert rc == 0
    return out.decode("utf-8", "surrogateescape")


def new_context(guest: AbiGuest, graph: int, metadata: str | None = None) -> int:
    rc, ctx = guest.init(graph)
    assert rc == 0, f"init_execution_context: errno {rc}"
    if metadata is not None:
        assert guest.set_input(ctx, 1, metadata) == 0
    return ctx


def python_bytes_per_context(guest: AbiGuest, graph: int, n: int) -> float:
    """Python memory each of ``n`` more contexts keeps once it has computed and gone idle."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(n):
            ask(guest, new_context(guest, graph), PROMPTS[i % len(PROMPTS)])
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")) / n


def test_a_guest_keeps_two_thousand_contexts_it_never_finalizes(nn: WasiNN) -> None:
    guest = AbiGuest.create(nn)
    rc, graph = guest.load_by_name("succ", ONE_THREAD)
    assert rc == 0
    for i in range(2000):
        prompt = PROMPTS[i % len(PROMPTS)]
        assert ask(guest, new_context(guest, graph), prompt) == successor_text(prompt) + "</s>", f"context {i}"
    state = store_state(guest)
    assert len(state.contexts) == 2000
    # Idle contexts hold no sampler (native memory) beyond the warm few, and no sequence beyond the model's.
    engine = [c.inner.state for c in state.contexts.values()]  # type: ignore[attr-defined]
    assert sum(s.sampler is not None for s in engine) <= WARM_CONTEXTS
    assert sum(s.slot is not None for s in engine) <= WARM_CONTEXTS
    # ... and little Python memory: the conversation's tokens at 4 bytes each, the output once.
    per_context = python_bytes_per_context(guest, graph, 300)
    assert per_context < 2048, f"{per_context:.0f} bytes of Python objects per idle context"
    first = next(iter(state.contexts))
    assert ask(guest, first, "q") == successor_text("q") + "</s>"  # the first context still works
    nn.detach(guest.store)
    assert nn.imports.contexts_alive.value == 0


def test_the_per_store_limit_still_answers_busy(nn: WasiNN) -> None:
    guest = AbiGuest.create(WasiNN(registry=nn.registry, limits=Limits(max_contexts_per_store=3)))
    graph = guest.load_by_name("succ", ONE_THREAD)[1]
    assert [guest.init(graph)[0] for _ in range(4)] == [0, 0, 0, Errno.BUSY]


@pytest.fixture(scope="module")
def demo() -> Iterator[WasiNN]:
    registry = ModelRegistry([f"demo:GGML:AUTO:{DEMO_MODEL_PATH}"])
    yield WasiNN(registry=registry)
    registry.close()


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def test_an_early_context_used_again_after_many_answers_as_an_uninterrupted_one(demo: WasiNN) -> None:
    """The demo model keeps a multi-turn conversation on one context; in between, 300 other contexts
    take every sequence and sampler, so the second turn re-decodes the first from the context's tokens."""
    guest = AbiGuest.create(demo)
    rc, graph = guest.load_by_name("demo", '{"threads": 1, "temp": 0, "n-predict": 8}')
    assert rc == 0
    turn1 = chat("12+30=")
    early = new_context(guest, graph)
    answer1 = ask(guest, early, turn1)
    assert answer1 == "42<|im_end|>"
    for i in range(300):
        ask(guest, new_context(guest, graph), chat(f"{i % 90 + 10}+{i % 7 + 1}="))
    evicted = store_state(guest).contexts[early].inner.state  # type: ignore[attr-defined]
    assert evicted.slot is None and evicted.sampler is None  # it holds no sequence and no sampler
    turn2 = turn1 + answer1 + "\n" + chat("What is 7-19?")
    answer2 = ask(guest, early, turn2)

    uninterrupted = new_context(guest, graph)
    assert ask(guest, uninterrupted, turn1) == answer1
    assert ask(guest, uninterrupted, turn2) == answer2 == "-12<|im_end|>"


def test_a_stream_left_midway_continues_with_its_sampler_after_many_contexts(nn: WasiNN) -> None:
    """Seeded sampling at temp 1 on the noisy model: the random state of a stream left in the middle is
    kept through eviction (only its sequence is given up), so the stream goes on as if never left; a
    whole compute after eviction gets a new sampler, the same as the reset one it would have had."""
    guest = AbiGuest.create(nn)
    rc, graph = guest.load_by_name("noisy", ONE_THREAD)
    assert rc == 0
    sampling = '{"temp": 1.0, "seed": 5, "top-k": 0, "top-p": 1.0, "min-p": 0.0, "n-predict": 12}'

    def steps(ctx: int, n: int) -> list[bytes]:
        pieces = []
        for _ in range(n):
            rc = guest.call("compute_single", ctx)
            if rc == Errno.END_OF_SEQUENCE:
                break
            assert rc == 0
            rc, piece = guest.get_output(ctx, single=True)
            assert rc == 0
            pieces.append(piece)
        return pieces

    left = new_context(guest, graph, sampling)
    assert guest.set_input(left, 0, "k") == 0
    pieces = steps(left, 3)
    whole = new_context(guest, graph, sampling)
    first_answer = ask(guest, whole, "k")
    for i in range(100):
        ask(guest, new_context(guest, graph), PROMPTS[i % len(PROMPTS)])
    state = store_state(guest)
    left_state = state.contexts[left].inner.state  # type: ignore[attr-defined]
    assert left_state.slot is None and left_state.sampler is not None
    whole_state = state.contexts[whole].inner.state  # type: ignore[attr-defined]
    assert whole_state.slot is None and whole_state.sampler is None
    pieces += steps(left, 12)

    uninterrupted = new_context(guest, graph, sampling)
    assert guest.set_input(uninterrupted, 0, "k") == 0
    assert steps(uninterrupted, 15) == pieces
    assert ask(guest, whole, "k") == first_answer
    nn.detach(guest.store)


# -- a server in LlamaEdge's shape: one new context per request, never finalized ---------------------


def process_usage(pid: int) -> tuple[int, int]:
    """(resident bytes, open descriptors) of process ``pid``."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def test_a_chat_server_opening_a_context_per_request_keeps_serving(
    preload_specs: list[str], tmp_path: pathlib.Path
) -> None:
    """``wasinn run`` with chat_server.wasm (LlamaEdge's shape): 1,300 sequential chats, all 200, each on
    a new context never finalized; the server's memory and descriptors stay flat after the first 300."""
    out, err = tmp_path / "server.out", tmp_path / "server.err"
    command = [sys.executable, "-m", "wasinn_host", "run", "--env", f"WASINN_CONFIG={ONE_THREAD}"]
    command += ["--nn-preload", preload_specs[0], str(GUESTS / "chat_server.wasm"), "succ", "127.0.0.1", "0"]
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    statuses: dict[int, int] = {}
    usage: dict[int, tuple[int, int]] = {}
    total, warmup = 1300, 300
    try:
        deadline = time.monotonic() + WAIT
        while not out.read_text().endswith("\n"):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        port = int(out.read_text().split(":")[-1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        for i in range(total):
            if i % 50 == 25:  # a new connection now and then: accepted and closed descriptors too
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
            prompt = PROMPTS[i % len(PROMPTS)]
            conn.request("POST", "/v1/chat/completions", body=prompt.encode())
            response = conn.getresponse()
            body = response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
            assert response.status == 200, f"request {i}: {response.status} {body!r}"
            assert body == (successor_text(prompt) + "</s>").encode()
            assert response.getheader("X-Context") == str(i)  # a new context each time, none finalized
            if i + 1 in (warmup, total):
                usage[i + 1] = process_usage(proc.pid)
        conn.request("POST", "/quit")
        assert conn.getresponse().read() == b"bye\n"
        conn.close()
        assert proc.wait(WAIT) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert statuses == {200: total}
    assert out.read_text().endswith(f"bye after {total} chats\n")
    (rss_warm, fds_warm), (rss_end, fds_end) = usage[warmup], usage[total]
    grown = rss_end - rss_warm
    assert grown < 6 << 20, f"RSS grew {grown / 2**20:.1f} MiB over {total - warmup} requests"
    assert fds_end <= fds_warm, (fds_warm, fds_end)
