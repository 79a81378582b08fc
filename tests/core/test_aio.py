"""The asyncio API (:mod:`wasinn_host.aio`) through the real host and llama.cpp: sessions' complete, stream
and embed answer as the blocking forms do; a cancelled task ends its sequence and leaves the session
usable; a slow stream consumer stalls only its own stream, whose queue stays bounded; ``run_async`` runs
real guests, sends their output to async callbacks or collects it, and a cancelled run frees its guest's
contexts and sequences."""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from wasinn_host import ModelRegistry, RunOptions, WasiNN, aio
from wasinn_host.core.generation import StopReason
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.core.scheduling.stream_feed import Outlook, StreamFeed
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

WAIT = 60.0


@pytest.fixture
def own_nn(model_dir: pathlib.Path) -> Iterator[WasiNN]:
    """A host with a registry of its own (its model's worker is this test's alone), interruptible."""
    registry = ModelRegistry([f"succ:GGML:AUTO:{model_dir / 'successor.gguf'}"])
    nn = WasiNN(registry=registry, interruptible=True, guest_threads=2)
    yield nn
    nn.close()


def worker_of(nn: WasiNN) -> ModelWorker:
    (model,) = nn.registry.loaded()
    return model.worker


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (on the loop) until ``condition()`` holds; fail after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT:g}s for {what}"
        await asyncio.sleep(0.005)


def hold_worker(worker: ModelWorker, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold the worker before it admits any job until the returned event is set."""
    release = threading.Event()
    admit = worker._admit

    def held() -> None:
        release.wait()
        admit()

    monkeypatch.setattr(worker, "_admit", held)
    return release


def expected(prompt: str) -> str:
    return successor_text(prompt) + "</s>"


def test_async_session_answers_as_the_blocking_session(own_nn: WasiNN) -> None:
    """complete, stream (whole, and capped by max_tokens) and embed give what Session's blocking forms give;
    several sessions awaited at once are answered right, from one thread (the loop's)."""

    async def main() -> dict[str, Any]:
        async with own_nn.session_async("succ") as s:
            out: dict[str, Any] = {"complete": await s.complete("abc")}
            out["stream"] = [piece async for piece in s.stream("hello")]
            out["capped"] = [piece async for piece in s.stream("hello", max_tokens=3)]
            out["metadata"] = s.metadata
        sessions = [await own_nn.session_async("succ") for _ in range(4)]
        out["threads"] = threading.active_count()
        out["many"] = await asyncio.gather(*(s.complete(p) for s, p in zip(sessions, ("u", "xy", "mnop", "b"))))
        out["threads_after"] = threading.active_count()
        for session in sessions:
            await session.close()
        return out

    got = asyncio.run(main())
    with own_nn.session("succ") as blocking:
        assert got["complete"] == blocking.complete("abc") == expected("abc")
        assert got["stream"] == list(blocking.stream("hello"))
        assert got["capped"] == list(blocking.stream("hello", max_tokens=3))
    assert b"".join(got["stream"]).decode() == successor_text("hello")
    assert got["capped"] == [b"p", b"q", b"r"]
    assert got["metadata"]["output_tokens"] == 3
    assert got["many"] == [expected(p) for p in ("u", "xy", "mnop", "b")]
    assert got["threads_after"] == got["threads"]  # no thread per waiting request


def test_async_embed_matches_the_blocking_embed(model_dir: pathlib.Path) -> None:
    registry = ModelRegistry([f"emb:GGML:AUTO:{model_dir / 'successor.gguf'}"])
    nn = WasiNN(registry=registry)
    try:

        async def main() -> list[float]:
            async with nn.session_async("emb", {"embedding": True}) as s:
                return await s.embed("hello")

        vector = asyncio.run(main())
        with nn.session("emb", {"embedding": True}) as blocking:
            assert vector == blocking.embed("hello")
        assert len(vector) > 0
    finally:
        nn.close()


def test_a_cancelled_complete_ends_its_job_and_the_session_computes_again(
    own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A complete cancelled while its job waits in the worker: the job ends (cancelled) at the worker's
    next step, having generated at most one of its 25 tokens (the cancel reaches the worker's thread while
    it may be taking that step), no sequence stays busy, and the session's next complete answers right."""

    async def main() -> tuple[str, int, int, int]:
        async with own_nn.session_async("succ") as s:
            assert await s.complete("abc") == expected("abc")  # the model is loaded
            worker = worker_of(own_nn)
            generated = worker.generated_tokens
            release = hold_worker(worker, monkeypatch)
            task = asyncio.ensure_future(s.complete("a"))
            await until(lambda: worker.queued == 1, "the job in the worker")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            again = await s.complete("xy")
            return again, worker.generated_tokens - generated, worker.busy_sequences, worker.active

    again, generated, busy, active = asyncio.run(main())
    assert again == expected("xy")
    assert generated in (2, 3)  # "z", "</s>", and at most one token of the cancelled job
    assert (busy, active) == (0, 0)


def test_a_complete_left_by_its_closed_event_loop_costs_the_other_requests_nothing(
    own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``asyncio.run`` ends (cancelling the task, closing its loop) while a complete's job waits in the
    worker: when the job ends, its completion cannot reach the closed loop, and nobody waits for it there;
    a blocking request queued beside it is answered as alone, and nothing is logged as a worker error."""
    session = own_nn.session("succ")
    assert session.complete("abc") == expected("abc")  # the model is loaded
    worker = worker_of(own_nn)
    release = hold_worker(worker, monkeypatch)

    async def abandon() -> None:
        s = await own_nn.session_async("succ")
        asyncio.ensure_future(s.complete("a"))
        await until(lambda: worker.queued == 1, "the job in the worker")

    asyncio.run(abandon())  # the task is cancelled and the loop closed with the job still queued
    answers: list[str] = []
    bystander = threading.Thread(target=lambda: answers.append(own_nn.session("succ").complete("mnop")))
    bystander.start()
    deadline = time.monotonic() + WAIT
    while worker.queued < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    bystander.join(WAIT)
    assert answers == [expected("mnop")]
    assert session.complete("xy") == expected("xy")
    assert not [r for r in caplog.records if "worker error" in r.message]


def gate_steps(worker: ModelWorker, monkeypatch: pytest.MonkeyPatch) -> threading.Semaphore:
    """Make each of the worker's steps wait for a permit from the returned semaphore."""
    permits = threading.Semaphore(0)
    step = worker._step

    def gated() -> None:
        permits.acquire()
        step()

    monkeypatch.setattr(worker, "_step", gated)
    return permits


def stream_feeds(worker: ModelWorker, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, StreamFeed]]:
    """The (context state, feed) of each stream job started on ``worker`` from now on, in order."""
    feeds: list[tuple[Any, StreamFeed]] = []
    start = worker.start_stream

    def recorded(request: Any, state: Any, feed: StreamFeed) -> None:
        feeds.append((state, feed))
        start(request, state, feed)

    monkeypatch.setattr(worker, "start_stream", recorded)
    return feeds


@pytest.mark.parametrize("how", ["aclose", "cancel"])
def test_leaving_a_stream_early_ends_its_job_at_the_next_step(
    own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The endless stream of "0", its worker let through one step at a time: once the consumer has its
    first piece it leaves (``aclose``, what breaking out of ``async for`` does) or its task is cancelled
    while it waits for the next piece.  The stream's job then makes at most the token of the step under
    way, ends with STREAM_ENDED, and leaves no active job, busy sequence, context reference or thread;
    the session answers its next complete right."""

    async def main() -> dict[str, Any]:
        keeper = own_nn.session("succ")  # the model stays loaded; its references without the async session
        (model,) = own_nn.registry.loaded()
        refs = model.refs
        async with own_nn.session_async("succ") as s:
            assert await s.complete("xy") == expected("xy")
            worker = worker_of(own_nn)
            threads = threading.active_count()
            feeds = stream_feeds(worker, monkeypatch)
            permits = gate_steps(worker, monkeypatch)
            generated = worker.generated_tokens
            stream = s.stream("0")
            first = asyncio.ensure_future(stream.__anext__())
            while not first.done():
                permits.release()
                await asyncio.sleep(0.005)
            out: dict[str, Any] = {"first": first.result()}
            if how == "aclose":
                await stream.aclose()
            else:

                async def consume() -> None:
                    async for _ in stream:
                        pass

                task = asyncio.ensure_future(consume())
                await asyncio.sleep(0)  # the task waits for the next piece
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            made_at_leave = worker.generated_tokens - generated
            for _ in range(1000):  # the worker may step freely from now on
                permits.release()
            await until(lambda: worker.active == 0 and not feeds[-1][1].running, "the stream's job to end")
            out["extra"] = worker.generated_tokens - generated - made_at_leave
            out["feeds"] = [feed for _, feed in feeds]
            out["left"] = (worker.active, worker.busy_sequences, worker.queued)
            out["answer"] = await s.complete("u")
        out["refs"] = model.refs - refs
        out["threads"] = threading.active_count() - threads
        keeper.close()
        return out

    got = asyncio.run(main())
    assert got["first"] == b"1"
    assert got["extra"] <= 1  # the token of the step under way, at most
    assert len(got["feeds"]) == 1 and got["feeds"][0].final.stop_reason is StopReason.STREAM_ENDED
    assert got["left"] == (0, 0, 0)
    assert got["answer"] == expected("u")
    assert got["refs"] == 0  # the session's graph and context gave back their references to the model
    assert got["threads"] == 0


def test_a_slow_stream_consumer_stalls_only_its_own_stream(own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that takes one piece and stops reading: its stream's job runs STREAM_QUEUE tokens ahead
    of it and pauses (no sequence busy for it); while it waits, four other streams run to their end and
    its job makes nothing; read
    again, it resumes where it was and gives the text the blocking stream gives."""

    async def main() -> dict[str, Any]:
        slow = await own_nn.session_async("succ", {"n-predict": 40})
        others = [await own_nn.session_async("succ") for _ in range(4)]
        worker = worker_of(own_nn)
        feeds = stream_feeds(worker, monkeypatch)
        stream = slow.stream("0")
        pieces = [await stream.__anext__()]
        state, feed = feeds[0]
        await until(lambda: not feed.running, "the slow stream's job to pause")
        paused = (feed.backlog, feed.outlook(), worker.busy_sequences)
        texts = await asyncio.gather(*(collect(s, p) for s, p in zip(others, ("a", "b", "hello", "mnop"))))
        after = ([f for s, f in feeds if s is state], feed.backlog)
        pieces += [piece async for piece in stream]
        jobs = len([f for s, f in feeds if s is state])
        for session in (slow, *others):
            await session.close()
        return {"paused": paused, "texts": texts, "after": after, "pieces": pieces, "jobs": jobs, "feed": feed}

    got = asyncio.run(main())
    backlog, outlook, busy = got["paused"]
    # the job paused with STREAM_QUEUE tokens not taken (one fewer if it paused before the first was taken)
    assert aio.STREAM_QUEUE - 1 <= backlog <= aio.STREAM_QUEUE
    assert (outlook, busy) == (Outlook.PAUSED, 0)
    assert got["texts"] == [successor_text(p).encode() for p in ("a", "b", "hello", "mnop")]
    assert got["after"] == ([got["feed"]], backlog)  # nothing made for the slow stream meanwhile
    with own_nn.session("succ", {"n-predict": 40}) as blocking:
        assert got["pieces"] == list(blocking.stream("0"))
    assert b"".join(got["pieces"]) == successor_text("0", 40).encode()
    assert got["jobs"] > 1  # the slow stream's job started again once it had caught up
    assert worker_of(own_nn).busy_sequences == 0


async def collect(session: aio.AsyncSession, prompt: str) -> bytes:
    return b"".join([piece async for piece in session.stream(prompt)])


def test_concurrent_async_streams_match_the_blocking_streams_with_a_wake_up_per_step(
    own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight streams on one loop at once give the texts the blocking streams give, with no thread per
    stream, and the workers wake the loop for a step's tokens of all eight at once: far fewer wake-ups
    than tokens."""
    wakes = [0]
    wake = aio._LoopWaker._wake

    def counted(self: aio._LoopWaker) -> None:
        wakes[0] += 1
        wake(self)

    monkeypatch.setattr(aio._LoopWaker, "_wake", counted)
    prompts = ["a", "b", "c", "d", "hello", "mnop", "0", "5"]

    async def main() -> tuple[list[bytes], int, int, int]:
        sessions = [await own_nn.session_async("succ", {"n-predict": 20}) for _ in prompts]
        worker = worker_of(own_nn)
        threads, generated = threading.active_count(), worker.generated_tokens
        texts = await asyncio.gather(*(collect(s, p) for s, p in zip(sessions, prompts)))
        threads_after, tokens = threading.active_count(), worker.generated_tokens - generated
        for session in sessions:
            await session.close()
        return texts, threads, threads_after, tokens

    texts, threads, threads_after, tokens = asyncio.run(main())
    with own_nn.session("succ", {"n-predict": 20}) as blocking:
        assert texts == [b"".join(blocking.stream(p)) for p in prompts]
    assert texts[0] == successor_text("a", 20).encode()
    assert threads_after == threads
    assert wakes[0] * 2 < tokens, (wakes[0], tokens)


def test_run_async_collects_output_and_sends_it_to_callbacks(own_nn: WasiNN) -> None:
    """run_async runs guest_examples/complete.wasm: exit code 0, its stdout collected in a bytearray or
    given in order to an async callback; three runs at once on two guest threads all answer."""

    async def main() -> tuple[int, bytes, bytes, list[bytes]]:
        collected = bytearray()
        code = await own_nn.run_async(GUESTS / "complete.wasm", ["succ", "abc"], stdout=collected, stderr=bytearray())
        chunks: list[bytes] = []

        async def sink(chunk: bytes) -> None:
            await asyncio.sleep(0)
            chunks.append(chunk)

        await own_nn.run_async(GUESTS / "complete.wasm", ["succ", "hello"], stdout=sink, stderr=bytearray())
        outs = [bytearray() for _ in range(3)]
        codes = await asyncio.gather(
            *(
                own_nn.run_async(GUESTS / "complete.wasm", ["succ", p], stdout=o, stderr=bytearray())
                for p, o in zip(("u", "xy", "b"), outs)
            )
        )
        assert codes == [0, 0, 0]
        return code, bytes(collected), b"".join(chunks), [bytes(o) for o in outs]

    code, collected, streamed, outs = asyncio.run(main())
    assert code == 0
    assert collected == (expected("abc") + "\n").encode()
    assert streamed == (expected("hello") + "\n").encode()
    assert outs == [(expected(p) + "\n").encode() for p in ("u", "xy", "b")]


def test_a_cancelled_run_async_stops_its_guest_and_frees_its_contexts(
    own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """A guest waiting in compute when its task is cancelled: the cancel reaches its context (the job ends
    once the worker looks at it), the guest traps, and the awaiting task ends (CancelledError) only after
    that, with no Store, context or busy sequence left; the host runs the next guest right."""

    async def main() -> tuple[dict[str, int], int, int]:
        assert await own_nn.run_async(GUESTS / "complete.wasm", ["succ", "abc"], stdout=bytearray()) == 0
        worker = worker_of(own_nn)
        release = hold_worker(worker, monkeypatch)
        task = asyncio.ensure_future(
            own_nn.run_async(GUESTS / "complete.wasm", ["succ", "a"], stdout=bytearray(), stderr=bytearray())
        )
        await until(lambda: worker.queued == 1, "the guest's compute in the worker")
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # it waits for its guest to end
        generated = worker.generated_tokens
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert worker.generated_tokens == generated  # the cancelled compute made none of its 25 tokens
        sessions = own_nn.imports.sessions_status()
        again = bytearray()
        assert await own_nn.run_async(GUESTS / "complete.wasm", ["succ", "xy"], stdout=again) == 0
        assert bytes(again) == (expected("xy") + "\n").encode()
        return sessions, worker.busy_sequences, worker.active

    sessions, busy, active = asyncio.run(main())
    assert (sessions["stores"], sessions["execution_contexts"], sessions["graphs"]) == (0, 0, 0)
    assert (busy, active) == (0, 0)


def test_run_async_needs_an_interruptible_host(nn: WasiNN) -> None:
    with pytest.raises(Exception, match="interruptible=True"):
        asyncio.run(nn.run_async(GUESTS / "complete.wasm", ["succ", "abc"], RunOptions()))
