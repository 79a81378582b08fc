"""Streams sample ahead of their guests; stream-stdout pieces leave the worker through a bounded queue
(fake runtime, no llama.cpp)."""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from typing import Any

import pytest

from wasinn_host.core.generation import GenerationResult, StopReason
from wasinn_host.core.scheduling.scheduler import ContextState, ModelWorker
from wasinn_host.core.scheduling.stream_feed import StreamFeed
from wasinn_host.guest.piece_queue import PieceQueue
from wasinn_host.testing.successor import successor_text

from .test_engine import make_worker, request, text

pytestmark = pytest.mark.fast


def no_timed_waits(cv: Any, timed: list[float]) -> None:
    """Record every timed wait on ``cv`` (a Condition) in ``timed``."""
    wait = cv.wait

    def recording(timeout: float | None = None) -> bool:
        if timeout is not None:
            timed.append(timeout)
        return bool(wait(timeout))

    cv.wait = recording


def stream(worker: ModelWorker, state: ContextState, prompt: str, first: bool, lookahead: int) -> StreamFeed:
    feed = StreamFeed(lookahead)
    worker.start_stream(request(prompt, limit=1 << 30, streaming=True, reset_sampler=first), state, feed)
    return feed


def test_one_job_serves_a_whole_stream_without_timed_waits(
    fake_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest taking its tokens as they come: one request for the whole stream, one step a token, the
    tokens those of a compute, the last carrying end of generation; neither the worker nor the guest
    waits with a timeout on the way."""
    worker = make_worker(fake_model, delay=0.001)
    timed: list[float] = []
    no_timed_waits(worker._cv, timed)
    waits: list[None] = []
    wait = StreamFeed._wait

    def counted(self: StreamFeed) -> None:  # a guest's wait for the next change: untimed, once a token at most
        waits.append(None)
        wait(self)

    monkeypatch.setattr(StreamFeed, "_wait", counted)
    state = ContextState()
    feed = stream(worker, state, "f", True, 16)
    pieces, reasons = [], []
    while (item := feed.take()) is not None:
        pieces.append(bytes(item.text).decode())
        reasons.append(item.stop_reason)
    assert "".join(pieces) == successor_text("f") + "</s>"
    assert reasons == [StopReason.TOKEN] * (len(pieces) - 1) + [StopReason.EOS]
    assert (worker.requests, worker.decode_calls, worker.clock.steps) == (1, len(pieces), len(pieces))
    assert feed.final is not None and feed.final.error is None and not state.mid_stream
    assert timed == [] and len(waits) <= len(pieces)
    worker.close()


def test_a_stream_interval_wakes_its_guest_for_the_first_token_then_every_interval_and_at_the_end() -> None:
    """With ``stream-interval`` 3 a waiting guest is woken by the first token, then by every third (the
    feed's phase moves which), by a full lookahead and by the stream's end; the others wait in the feed."""
    token = GenerationResult(generated=[1], stop_reason=StopReason.TOKEN)

    def dues(phase: int, puts: int) -> tuple[StreamFeed, list[bool]]:
        feed = StreamFeed(16, interval=3)
        feed._phase = phase
        due = []
        for _ in range(puts):
            due.append(feed.due(token))
            feed.put(token)
        return feed, due

    feed, due = dues(0, 7)
    assert due == [True, False, True, False, False, True, False]
    assert feed.due(GenerationResult(stop_reason=StopReason.EOS)) and feed.backlog == 7
    assert dues(1, 5)[1] == [True, True, False, False, True]
    full = StreamFeed(4, interval=8)  # at most the lookahead: the job never pauses for a guest left waiting
    assert full.interval == 4
    assert StreamFeed(16, interval=99).interval == 8 and StreamFeed(16).interval == 1


def test_a_stream_interval_wakes_the_guest_once_for_several_tokens_and_changes_no_token(
    fake_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest streaming with an interval of 4 waits about once every 4 tokens (one wait a token with
    an interval of 1) and gets the tokens and the end a compute gives."""
    waits: list[int] = []
    wait = StreamFeed._wait

    def counted(self: StreamFeed) -> None:
        waits.append(self.interval)
        wait(self)

    monkeypatch.setattr(StreamFeed, "_wait", counted)
    texts = {}
    for interval in (1, 4):
        worker = make_worker(fake_model, delay=0.002)
        feed = StreamFeed(16, interval=interval)
        worker.start_stream(request("f", limit=1 << 30, streaming=True, reset_sampler=True), ContextState(), feed)
        pieces = []
        while (item := feed.take()) is not None:
            pieces.append(bytes(item.text).decode())
        texts[interval] = "".join(pieces)
        worker.close()
    tokens = len(successor_text("f")) + 1
    assert texts[1] == texts[4] == successor_text("f") + "</s>"
    assert waits.count(1) >= tokens - 2
    assert 2 <= waits.count(4) <= tokens // 4 + 3


def test_a_guest_that_stops_reading_pauses_its_stream_at_the_lookahead(fake_model: pathlib.Path) -> None:
    """A guest that takes nothing: its job samples 5 tokens and ends, giving its sequence up (the
    sampler kept, mid-stream); once the guest has taken those, the next job goes on from them, and the
    stream is the one a compute gives."""
    worker = make_worker(fake_model)
    state = ContextState()
    feed = stream(worker, state, "5", True, 5)  # digits cycle for ever: only the lookahead stops it
    while feed.running:
        threading.Event().wait(0.001)
    assert feed.backlog == 5 and feed.final is not None and feed.final.stop_reason is StopReason.TOKEN
    assert state.mid_stream and state.slot is not None and not state.slot.busy
    taken = [item for item in iter(feed.take, None)]
    assert len(taken) == 5
    tokens = request("5", limit=1).tokens + tuple(t for item in taken for t in item.generated)
    more = StreamFeed(5)
    worker.start_stream(
        dataclasses.replace(request("", limit=1 << 30, streaming=True, reset_sampler=False), tokens=tokens),
        state,
        more,
    )
    taken += [more.take() for _ in range(5)]  # type: ignore[misc]
    assert "".join(bytes(item.text).decode() for item in taken) == successor_text("5", 10)
    # the continuation decodes only the last token taken (the 4 before it are in the sequence)
    assert worker.requests == 2 and worker.prompt_tokens_decoded == len(request("5", limit=1).tokens) + 1
    worker.close()


def test_a_guest_ending_its_stream_midway_stops_the_job(fake_model: pathlib.Path) -> None:
    """``end`` returns once the worker dropped the job; the sequence is free for the next request, which
    keeps the prompt's cells (all but its last token, decoded again for its logits)."""
    worker = make_worker(fake_model, delay=0.002)
    state = ContextState()
    feed = stream(worker, state, "5", True, 1000)
    assert feed.take() is not None
    feed.end()
    assert not feed.running and feed.final is not None and feed.final.stop_reason is StopReason.STREAM_ENDED
    assert feed.final.error is None and not state.mid_stream and state.slot is not None and not state.slot.busy
    again = worker.submit(request("5", limit=3), state)
    assert text(again) == successor_text("5", 3) and again.reused_tokens == 1
    worker.close()


def test_a_store_whose_stdout_is_behind_holds_back_its_own_compute_only(fake_model: pathlib.Path) -> None:
    """stream-stdout pieces go through a queue of 4: while its sink is stuck, that compute samples at
    most 4 more pieces and waits out of the steps; another compute runs to its end meanwhile; once the
    sink takes them, every piece arrives, in order."""
    worker = make_worker(fake_model)
    stuck = threading.Event()
    written: list[bytes] = []

    def sink(piece: bytes) -> None:
        stuck.wait()
        written.append(piece)

    queue = PieceQueue(sink, max_pieces=4)
    slow: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: slow.update(
            result=worker.submit(request("a", on_piece=queue, piece_room=queue.has_room), ContextState())
        )
    )
    thread.start()
    other = worker.submit(request("k"), ContextState())
    assert text(other) == successor_text("k") + "</s>"
    assert thread.is_alive() and len(queue._pieces) <= 4
    stuck.set()
    thread.join()
    queue.flush()
    assert b"".join(written).decode() == text(slow["result"]) == successor_text("a") + "</s>"
    queue.close()
    worker.close()


def test_peek_shows_the_tokens_sampled_ahead_without_taking_them() -> None:
    """What a remote client is sent ahead: tokens only, never the end, and nothing taken."""
    feed = StreamFeed(8)
    for token in (10, 11, 12):
        feed.put(GenerationResult(generated=[token], stop_reason=StopReason.TOKEN))
    feed.put(GenerationResult(generated=[2], stop_reason=StopReason.EOS))
    assert [item.generated for item in feed.peek(2)] == [[10], [11]]
    assert [item.generated for item in feed.peek(10)] == [[10], [11], [12]]  # the end is not a token to show
    assert feed.backlog == 4
    taken = [feed.take() for _ in range(4)]
    assert [item.generated for item in taken if item is not None] == [[10], [11], [12], [2]]
    assert feed.peek(10) == []


def test_every_thread_waiting_on_a_feed_wakes() -> None:
    """Two threads waiting for one feed's next token (a guest's step and a server taking the same
    context's): one gets the token, the other the end once the job closes; a thread ending the stream
    meanwhile returns when the job has ended."""
    feed = StreamFeed(4)
    got: list[object] = []
    takers = [threading.Thread(target=lambda: got.append(feed.take())) for _ in range(2)]
    for taker in takers:
        taker.start()
    while feed._waiters < 2:
        threading.Event().wait(0.001)
    feed.put(GenerationResult(generated=[5], stop_reason=StopReason.TOKEN))
    while not got:
        threading.Event().wait(0.001)
    ender = threading.Thread(target=feed.end)
    ender.start()
    while feed._waiters < 2:  # the other taker and the ender
        threading.Event().wait(0.001)
    feed.close(GenerationResult(stop_reason=StopReason.STREAM_ENDED))
    for thread in (*takers, ender):
        thread.join()
    assert [item.generated if item is not None else None for item in got] == [[5], None]  # type: ignore[attr-defined]


PROMPTS = ["f", "hello", "abc"]


def awaiting_worker(fake_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> ModelWorker:
    """A worker that waits for the streaming guests it wakes (as where llama.cpp's threads take every
    core), with no deadline in the way: the wait itself."""
    from wasinn_host.core.scheduling import scheduler

    monkeypatch.setattr(scheduler, "GUESTS_BACK_MIN_S", 30.0)
    monkeypatch.setattr(scheduler, "GUESTS_BACK_MAX_S", 30.0)
    worker = make_worker(fake_model, delay=0.001)
    worker._await_guests = True
    return worker


def run_guests(feeds: list[StreamFeed], guest: Any) -> None:
    """Run ``guest(index, feed)`` for each feed, each on a thread of its own, until all have ended."""
    threads = [threading.Thread(target=guest, args=(i, feed)) for i, feed in enumerate(feeds)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def test_where_llama_cpp_takes_every_core_no_decode_starts_before_the_woken_guests_come_back(
    fake_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With llama.cpp's threads on every core, the worker waits for the streaming guests it just woke to
    ask for their next token before it decodes again, so they never run beside a decode; the texts are
    those of a compute."""
    worker = awaiting_worker(fake_model, monkeypatch)
    feeds: list[StreamFeed] = []
    out_early: list[int] = []
    decode = worker.context.decode

    def checked(*args: Any, **kwargs: Any) -> int:
        out_early.extend(1 for feed in feeds if feed.comeback is not None)  # a woken guest not back yet
        return decode(*args, **kwargs)

    monkeypatch.setattr(worker.context, "decode", checked)
    texts: dict[int, str] = {}

    def guest(index: int, feed: StreamFeed) -> None:
        out = []
        while (item := feed.take()) is not None:
            out.append(item.text.decode())
            for _ in range(2000):  # a little work per token, as a guest's host calls are
                pass
        texts[index] = "".join(out)

    feeds += [stream(worker, ContextState(), prompt, True, 16) for prompt in PROMPTS]
    run_guests(feeds, guest)
    try:
        assert [texts[i] for i in range(len(PROMPTS))] == [successor_text(p) + "</s>" for p in PROMPTS]
        assert worker.guests_awaited > 0 and out_early == []
        assert worker.late_guests == 0
    finally:
        worker.close()


def test_the_awaited_guests_run_one_after_another(fake_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker wakes the streaming guests it waits for one at a time, each as the one before asks for
    its next token: no two of them handle a token at once (past the stream's start, when the guests were
    not waiting yet, and its end, which wakes at once), and the texts are those of a compute."""
    worker = awaiting_worker(fake_model, monkeypatch)
    lock = threading.Lock()
    active = [0, 0]  # now, most
    texts: dict[int, str] = {}

    def guest(index: int, feed: StreamFeed) -> None:
        out: list[str] = []
        while (item := feed.take()) is not None:
            counted = len(out) >= 2 and item.stop_reason is StopReason.TOKEN  # not the start nor the end
            with lock:
                active[0] += counted
                active[1] = max(active)
            threading.Event().wait(0.002)  # lets the interpreter go: woken together, the others would run now
            with lock:
                active[0] -= counted
            out.append(item.text.decode())
        texts[index] = "".join(out)

    run_guests([stream(worker, ContextState(), prompt, True, 16) for prompt in PROMPTS], guest)
    try:
        assert [texts[i] for i in range(len(PROMPTS))] == [successor_text(p) + "</s>" for p in PROMPTS]
        assert worker.guests_awaited > len(PROMPTS) and worker.late_guests == 0
        assert active[1] == 1
    finally:
        worker.close()


def test_a_guest_that_misses_the_deadline_is_not_waited_for_again(fake_model: pathlib.Path) -> None:
    """A guest slower than the deadline costs the worker a wait until it missed LATE_AFTER deadlines in a
    row: then it is marked late and the next steps go on without waiting for it; its text is still whole."""
    from wasinn_host.core.scheduling.stream_feed import LATE_AFTER

    worker = make_worker(fake_model, delay=0.03)  # a step far longer than the guest's work: it always waits
    worker._await_guests = True
    feed = stream(worker, ContextState(), "hello", True, 16)
    out = []
    awaited_when_late = -1
    try:
        while (item := feed.take()) is not None:
            out.append(item.text.decode())
            if feed.late and awaited_when_late < 0:
                awaited_when_late = worker.guests_awaited
            threading.Event().wait(0.005)  # far past the deadline (well under a millisecond)
        assert "".join(out) == successor_text("hello") + "</s>"
        assert worker.late_guests == 1 and feed.late
        assert worker.guests_awaited == awaited_when_late == LATE_AFTER
    finally:
        worker.close()
