"""Execution contexts a guest opens and never finalizes (LlamaEdge's servers open one per request) cost
almost nothing while idle: thousands fit in one Store, an evicted one answers as an uninterrupted one
would, and a server in that shape keeps serving with flat memory and descriptors."""

from __future__ import annotations

import gc
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
from wasinn_host.core.cold_store import COLD_STORE
from wasinn_host.core.scheduling.scheduler import WARM_CONTEXTS
from wasinn_host.ephemeral.handles import RESIDENT_CONTEXTS, HandleTables
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


SEEDED = '{"temp": 1.0, "seed": 5, "top-k": 0, "top-p": 1.0, "min-p": 0.0, "n-predict": 12}'


def stream_steps(guest: AbiGuest, ctx: int, n: int) -> list[bytes]:
    """Up to ``n`` compute_single steps on ``ctx``; the pieces."""
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


def new_context(guest: AbiGuest, graph: int, metadata: str | None = None) -> int:
    rc, ctx = guest.init(graph)
    assert rc == 0, f"init_execution_context: errno {rc}"
    if metadata is not None:
        assert guest.set_input(ctx, 1, metadata) == 0
    return ctx


def test_five_thousand_held_contexts_cost_under_300_bytes_each(nn: WasiNN) -> None:
    """With the default settings a Store keeps its 1,000 most recently named contexts in memory and spills
    the others (tokens, output, usage) to the process's spill store, keeping a stub of a couple of hundred
    bytes: 3,800 more contexts after a warm-up of 1,200 add under 300 bytes of Python memory each."""
    guest = AbiGuest.create(nn)
    rc, graph = guest.load_by_name("succ", ONE_THREAD)
    assert rc == 0
    rows_before = COLD_STORE.rows
    warmup, total = 1200, 5000
    tracemalloc.start()  # from the start, so the resident contexts spilled later are seen freed
    try:
        for i in range(total):
            if i == warmup:
                gc.collect()
                before = tracemalloc.take_snapshot()
            prompt = PROMPTS[i % len(PROMPTS)]
            assert ask(guest, new_context(guest, graph), prompt) == successor_text(prompt) + "</s>", f"context {i}"
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    per_context = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / (total - warmup)
    assert per_context < 300, f"{per_context:.0f} bytes of Python objects per held context"
    state = store_state(guest)
    assert len(state.contexts) == total
    resident = [c for c in state.contexts.values() if not c.spilled]
    assert len(resident) == RESIDENT_CONTEXTS
    assert COLD_STORE.rows - rows_before == total - RESIDENT_CONTEXTS
    assert nn.status()["sessions"]["spilled_contexts"] == COLD_STORE.rows
    assert 0 < nn.status()["sessions"]["spill_store_bytes"] < 4 << 20
    # The contexts in memory hold no sampler (native memory) beyond the warm few, and no sequence beyond the model's.
    engine = [c.inner.state for c in resident]  # type: ignore[attr-defined]
    assert sum(s.sampler is not None for s in engine) <= WARM_CONTEXTS
    assert sum(s.slot is not None for s in engine) <= WARM_CONTEXTS
    first = next(iter(state.contexts))
    assert state.contexts[first].spilled
    assert guest.get_output(first) == (0, (successor_text(PROMPTS[0]) + "</s>").encode())  # taken back
    assert ask(guest, first, "q") == successor_text("q") + "</s>"
    model = state.contexts[first].inner.model  # type: ignore[attr-defined]
    refs = model.refs
    nn.detach(guest.store)  # spilled contexts are dropped without being taken back
    assert nn.imports.contexts_alive.value == 0
    assert COLD_STORE.rows == rows_before
    assert model.refs == refs - total - 1 == 0  # the graph held the last one


def test_a_model_loaded_for_n_guests_keeps_each_ones_sequence_between_requests(
    nn: WasiNN, registry: ModelRegistry
) -> None:
    """A model loaded for 24 guests at once (``expect_guests``, as ``wasinn run --instances 24`` says) keeps
    24 idle contexts' sequences, not ``WARM_CONTEXTS``: 24 sessions that answered once, asked the same
    again in the reverse order, each decode only their prompt's last token again.  With 16 kept, the 8
    oldest gave up their sequences, and each asked again took the lowest free one: another's cells."""
    config = {"temp": 0, "n-predict": 2, "ctx-size": 96}  # a model instance of its own, loaded below
    prompts = [f"{chr(97 + i)}bcdefgh" for i in range(24)]
    registry.expected_sequences = 24
    try:
        sessions = [nn.session("succ", config) for _ in prompts]
    finally:
        registry.expected_sequences = 0
    try:
        first = [session.complete(prompt) for session, prompt in zip(sessions, prompts)]
        assert first == [successor_text(prompt)[:2] for prompt in prompts]
        worker = sessions[0]._context.model.worker  # type: ignore[attr-defined]
        assert len(worker.slots) >= 24
        decoded = worker.prompt_tokens_decoded
        again = [session.complete(prompt) for session, prompt in reversed(list(zip(sessions, prompts)))]
        assert again[::-1] == first
        assert (worker.prompt_tokens_decoded - decoded, worker.evictions) == (24, 0)
    finally:
        for session in sessions:
            session.close()


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
    sampling = SEEDED

    def steps(ctx: int, n: int) -> list[bytes]:
        return stream_steps(guest, ctx, n)

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


# -- spilled contexts: beyond a Store's resident ones, kept in the spill store ------------------------


def spilling_guest(
    nn: WasiNN, name: str, resident: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[AbiGuest, int, HandleTables]:
    """A guest with ``name`` loaded whose Store keeps only ``resident`` contexts in memory, the model's
    worker only 2 warm (a context warm in its worker is not spilled: it holds a sequence)."""
    guest = AbiGuest.create(nn)
    rc, graph = guest.load_by_name(name, ONE_THREAD)
    assert rc == 0
    state = store_state(guest)
    state.resident_contexts = resident
    monkeypatch.setattr(state.graphs[graph].graph.model.worker, "warm_contexts", 2)  # type: ignore[attr-defined]
    return guest, graph, state


def test_a_spilled_context_keeps_all_a_guest_can_see(demo: WasiNN, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Store keeping 4 contexts in memory spills a conversation between its turns (20 chats in between):
    its output and metadata JSON read back byte for byte, a compute repeated without set_input answers
    the same, its per-context config holds, a prompt set before the spill computes after it, and its
    second turn equals an uninterrupted context's."""
    guest, graph, state = spilling_guest(demo, "demo", 4, monkeypatch)
    config = '{"temp": 0, "n-predict": 8}'
    rows = COLD_STORE.rows

    def others(n: int) -> None:
        for i in range(n):
            ask(guest, new_context(guest, graph, config), chat(f"{i % 90 + 10}+{i % 7 + 1}="))

    turn1 = chat("12+30=")
    early = new_context(guest, graph, config)
    answer1 = ask(guest, early, turn1)
    assert answer1 == "42<|im_end|>"
    rc, metadata1 = guest.get_output(early, index=1)
    assert rc == 0 and b'"stop_reason"' in metadata1
    pending = new_context(guest, graph, '{"temp": 0, "n-predict": 1}')
    assert guest.set_input(pending, 0, turn1) == 0
    others(20)
    assert state.contexts[early].spilled and state.contexts[pending].spilled
    assert COLD_STORE.rows - rows == 2 + 20 - 4 == sum(c.spilled for c in state.contexts.values())
    assert guest.get_output(early, index=1) == (0, metadata1)  # timings and all, from the spill store
    assert guest.get_output(early) == (0, answer1.encode())
    assert guest.call("compute", early) == 0  # the prompt was kept too
    assert guest.get_output(early) == (0, answer1.encode())
    assert guest.call("compute", pending) == 0
    assert guest.get_output(pending) == (0, b"4")  # its n-predict 1, its prompt
    others(20)
    assert state.contexts[early].spilled
    turn2 = turn1 + answer1 + "\n" + chat("What is 7-19?")
    answer2 = ask(guest, early, turn2)

    uninterrupted = new_context(guest, graph, config)
    assert ask(guest, uninterrupted, turn1) == answer1
    assert ask(guest, uninterrupted, turn2) == answer2 == "-12<|im_end|>"
    assert guest.get_output(uninterrupted, index=1)[1].count(b",") == guest.get_output(early, index=1)[1].count(b",")
    demo.detach(guest.store)
    assert COLD_STORE.rows == rows


def test_a_spilled_stream_left_midway_continues_exactly(nn: WasiNN, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded sampling at temp 1 on the noisy model: a stream left after 3 tokens is spilled (its sampler,
    whose random state the next tokens depend on, stays in memory; its tokens, output and held-back bytes
    go to the spill store) and goes on as if never left."""
    guest, graph, state = spilling_guest(nn, "noisy", 4, monkeypatch)
    left = new_context(guest, graph, SEEDED)
    assert guest.set_input(left, 0, "k") == 0
    pieces = stream_steps(guest, left, 3)
    for i in range(30):
        ask(guest, new_context(guest, graph), PROMPTS[i % len(PROMPTS)])
    assert state.contexts[left].spilled
    pieces += stream_steps(guest, left, 12)

    uninterrupted = new_context(guest, graph, SEEDED)
    assert guest.set_input(uninterrupted, 0, "k") == 0
    assert stream_steps(guest, uninterrupted, 15) == pieces
    assert len(pieces) > 3
    nn.detach(guest.store)


def test_spilled_contexts_are_cancelled_and_reaped_like_the_others(nn: WasiNN, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cancel_all`` reaches a spilled context (its next compute fails as a resident one's does) without
    taking it back, and the idle reaper finalises spilled contexts, emptying their rows."""
    host = WasiNN(registry=nn.registry)
    guest, graph, state = spilling_guest(host, "succ", 2, monkeypatch)
    rows = COLD_STORE.rows
    contexts = [new_context(guest, graph) for _ in range(6)]
    for ctx in contexts:
        assert ask(guest, ctx, "u") == successor_text("u") + "</s>"
    assert [state.contexts[c].spilled for c in contexts] == [True] * 4 + [False] * 2
    host.cancel_all()
    assert state.contexts[contexts[0]].spilled
    failed = guest.call("compute", contexts[-1])
    assert failed != 0
    assert guest.call("compute", contexts[0]) == failed
    assert state.reap_idle(0.0) == 6
    assert COLD_STORE.rows == rows and not state.contexts
    assert guest.call("compute", contexts[1]) == Errno.INVALID_ARGUMENT


# -- a server in LlamaEdge's shape: one new context per request, never finalized ---------------------


def process_usage(pid: int) -> tuple[int, int]:
    """(resident bytes, open descriptors) of process ``pid``."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def test_a_chat_server_opening_a_context_per_request_keeps_serving(
    preload_specs: list[str], tmp_path: pathlib.Path
) -> None:
    """``wasinn run`` with chat_server.wasm (LlamaEdge's shape): 2,600 sequential chats, all 200, each on
    a new context never finalized; once the Store's 1,000 resident contexts are reached and the spill
    store is open, the next 1,000 chats add under 1 MiB of RSS (each context spilled leaves a stub of
    about 200 bytes; kept in memory, each cost 1.8 kB) and no descriptor."""
    out, err = tmp_path / "server.out", tmp_path / "server.err"
    command = [sys.executable, "-m", "wasinn_host", "run", "--env", f"WASINN_CONFIG={ONE_THREAD}"]
    command += ["--nn-preload", preload_specs[0], str(GUESTS / "chat_server.wasm"), "succ", "127.0.0.1", "0"]
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr)
    statuses: dict[int, int] = {}
    usage: dict[int, tuple[int, int]] = {}
    total, warmup = 2600, 1600
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
    assert grown < 1 << 20, f"RSS grew {grown / 2**20:.1f} MiB over {total - warmup} requests"
    assert fds_end <= fds_warm + 1, (fds_warm, fds_end)  # + the spill store's file, once its page cache overflows
