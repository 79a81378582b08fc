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
from wasinn_host.core.scheduling.scheduler import ModelWorker
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
    """A complete cancelled while its job waits in the worker: the job ends (cancelled) when the worker
    next looks at it, before generating any of its 25 tokens, no sequence stays busy, and the session's
    next complete answers right (its 2 tokens the only ones generated after the cancel)."""

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
    assert generated == 2  # "z", "</s>": the cancelled job made none
    assert (busy, active) == (0, 0)


def test_leaving_a_stream_early_ends_its_sequence(own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch) -> None:
    """Breaking out of ``async for`` after one piece (a queue of one piece, so the job cannot run ahead):
    the stream's job ends at the worker's next step, having generated at most 3 of its 25 tokens, and the
    session answers its next complete right."""
    monkeypatch.setattr(aio, "STREAM_QUEUE", 1)

    async def main() -> tuple[bytes, int, str, int]:
        async with own_nn.session_async("succ") as s:
            assert await s.complete("xy") == expected("xy")  # the model is loaded
            worker = worker_of(own_nn)
            generated = worker.generated_tokens
            stream = s.stream("a")  # an async generator
            first = await stream.__anext__()
            await stream.aclose()  # what leaving an ``async for`` early does
            await until(lambda: worker.active == 0, "the stream's job to end")
            made = worker.generated_tokens - generated
            return first, made, await s.complete("u"), worker.busy_sequences

    first, made, answer, busy = asyncio.run(main())
    assert first == b"b"
    assert made <= 3
    assert answer == expected("u")
    assert busy == 0


def test_a_slow_stream_consumer_stalls_only_its_own_stream(own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that stops reading: its stream's queue fills to STREAM_QUEUE pieces and the worker then
    leaves it out of its steps (it makes no more pieces) while another session's complete runs all its
    steps; read again, the stream gives its whole text."""
    monkeypatch.setattr(aio, "STREAM_QUEUE", 4)
    queues: list[Any] = []

    class Recorded(aio._PieceQueue):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            queues.append(self)

    monkeypatch.setattr(aio, "_PieceQueue", Recorded)

    async def main() -> tuple[list[bytes], int, str, int]:
        slow = await own_nn.session_async("succ")
        fast = await own_nn.session_async("succ")
        stream = slow.stream("a")
        pieces = [await stream.__anext__()]
        await until(lambda: bool(queues) and queues[0]._waiting == 4, "the slow stream's queue to fill")
        answer = await fast.complete("mnop")
        waiting_after = queues[0]._waiting
        pieces += [piece async for piece in stream]
        await slow.close()
        await fast.close()
        return pieces, waiting_after, answer, worker_of(own_nn).busy_sequences

    pieces, waiting_after, answer, busy = asyncio.run(main())
    assert answer == expected("mnop")
    assert waiting_after == 4  # no piece was made for it while the other computed
    assert b"".join(pieces).decode() == successor_text("a")
    assert busy == 0


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
