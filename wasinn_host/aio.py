"""asyncio forms of the embedding API: :meth:`WasiNN.run_async <wasinn_host.WasiNN.run_async>` and
:meth:`WasiNN.session_async <wasinn_host.WasiNN.session_async>`.

>>> async with nn.session_async("default", {"n-predict": 16}) as s:
...     text = await s.complete("Once upon a time")
...     async for piece in s.stream("Tell me more"):
...         print(piece.decode(), end="")

Sessions hold no thread while they wait: a computation is queued on the model's worker
(:meth:`~wasinn_host.core.scheduling.scheduler.ModelWorker.submit_then`), which completes the caller's
future through its event loop (``loop.call_soon_threadsafe``) when the job ends.  Cancelling the
awaiting task marks the context cancelled: the worker ends the job, and frees its sequence, at its next
step, and the session's next computation starts once it has.

A stream reads the stream's feed, as the blocking :meth:`Session.stream <wasinn_host.Session.stream>`
does (:mod:`~wasinn_host.core.scheduling.stream_feed`): its job samples up to :data:`STREAM_QUEUE` tokens
ahead of the consumer and then pauses, holding no sequence, until the consumer has taken them (a slow
consumer stalls only its own stream).  The worker wakes the loop once per step for all the streams of
that loop it gave tokens to (:class:`_LoopWaker`, through one relay thread per process), not once per
token.  Leaving the ``async for`` early, or cancelling the consuming task, ends the stream's job at the
worker's next step without blocking the loop; the session's next computation starts once it has ended.

Guests run on a bounded pool of threads of their own (guest code blocks): ``WasiNN(guest_threads=N)``.
Cancelling a :meth:`~wasinn_host.WasiNN.run_async` interrupts the guest through its Store's epoch
deadline and cancels its inference, and returns once the guest has ended and its contexts are freed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import (
    Any,
    AsyncGenerator,
    Awaitable,
    Callable,
    Generator,
    Mapping,
    Protocol,
    Sequence,
    TypeVar,
    Union,
    cast,
)

import wasmtime

from .core.errors import ErrorKind, WasiNNError
from .core.generation import GenerationRequest, GenerationResult, StopReason
from .core.inference import GenerationSteps, InferenceContext
from .core.scheduling.stream_feed import LOOKAHEAD, Outlook
from .guest.stdout import PieceSink, python_stdout
from .launch.guest_load import Guest, ModuleSource
from .launch.guest_run import RunOptions
from .launch.guest_stop import GuestStop
from .session import Session


class AsyncHost(Protocol):
    """What this module needs of :class:`~wasinn_host.WasiNN`."""

    engine: wasmtime.Engine
    interruptible: bool

    def load_guest(self, source: ModuleSource) -> Guest:
        """The compiled guest."""

    def run(self, module: ModuleSource, args: Sequence[str] = (), options: RunOptions | None = None) -> int:
        """Run one guest in a Store of its own; its exit code."""

    def session(
        self,
        name: str,
        config: Mapping[str, Any] | str | bytes | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = python_stdout,
    ) -> Session:
        """A blocking session on ``name``."""


log = logging.getLogger("wasinn_host")
_T = TypeVar("_T")

STREAM_QUEUE = LOOKAHEAD
"""Tokens of one stream that may wait for its consumer before its job pauses (the stream feed's lookahead)."""
DEFAULT_GUEST_THREADS = 8
"""Guests that :meth:`WasiNN.run_async` runs at once by default (``WasiNN(guest_threads=...)``)."""

AsyncSink = Callable[[bytes], Awaitable[Any]]
"""An async callback receiving a guest's output, a chunk at a time, in order."""
Output = Union[AsyncSink, bytearray, None]
"""Where :meth:`WasiNN.run_async` sends a guest's stdout or stderr: an async callback, a bytearray that
collects it, or None (the destination in ``options``, else the host's)."""


class _LoopWaker:
    """Wakes the streams of one event loop that models' workers gave tokens to: the first notice after
    the loop last ran asks the relay (:func:`_relay`) for one callback on the loop, which sets every
    stream's event noticed until then.

    A worker must not write to the loop's wake-up pipe itself: the write lets go of the GIL, the loop's
    thread takes it and handles that one token while the worker waits, and the worker's next token wakes
    the loop again.  The relay's thread instead gets the GIL when the worker lets go of it to call
    llama.cpp, after handing out the step's tokens, so one callback takes all of them (as the threads of
    blocking streams wake then, :meth:`.ModelWorker._deliver`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ready: collections.deque[asyncio.Event] = collections.deque()
        self._scheduled = False

    def notify(self, event: asyncio.Event) -> None:  # any thread (a model's worker)
        self._ready.append(event)  # before the check: a callback that has begun drains it
        if not self._scheduled:
            self._scheduled = True
            _relay().put(self)

    def post(self) -> None:  # the relay's thread
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody waits
            pass

    def _wake(self) -> None:  # on the loop
        self._scheduled = False  # before draining: a notice after this asks for the next callback
        ready = self._ready
        while ready:
            ready.popleft().set()


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = weakref.WeakKeyDictionary()
_relay_queue: queue.SimpleQueue[_LoopWaker] | None = None
_relay_lock = threading.Lock()


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` on ``loop`` soon (from another thread); nothing if the loop is closed: its
    coroutine was abandoned (``asyncio.run`` ended while it awaited), and nobody waits for the result."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass


def _relay() -> queue.SimpleQueue[_LoopWaker]:
    """The queue of the process's relay thread (started on first use), which posts wakers' callbacks
    to their loops: one thread for every loop and stream, none per request."""
    global _relay_queue
    with _relay_lock:
        if _relay_queue is None:
            relay: queue.SimpleQueue[_LoopWaker] = queue.SimpleQueue()

            def run() -> None:
                while True:
                    waker = relay.get()
                    try:
                        waker.post()
                    except Exception:  # a bug must not stop the relay of every other loop's streams
                        log.exception("wasinn: relaying a stream's tokens to its event loop failed")

            threading.Thread(target=run, name="wasinn-aio-relay", daemon=True).start()
            _relay_queue = relay
        return _relay_queue


def _waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    """The loop's waker (made on the loop's first stream)."""
    waker = _wakers.get(loop)
    if waker is None:
        waker = _wakers[loop] = _LoopWaker(loop)
    return waker


class AsyncSession:
    """A :class:`~wasinn_host.Session` for asyncio code (``async with nn.session_async(...) as s``).

    On a local backend no thread waits for a computation; over RPC each call runs on a thread of the
    loop's default executor."""

    def __init__(self, session: Session) -> None:
        self.session = session
        _relay()  # the thread that wakes streams' loops, before any stream
        self._turn = asyncio.Lock()  # one computation at a time, as on one execution context
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the public calls ------------------------------------------------------------

    async def complete(self, prompt: str | bytes) -> str:
        """Generate the whole answer (the end-of-generation piece included), as :meth:`Session.complete`."""
        context = self._local()
        if context is None:
            async with self._turn:
                return await self._on_thread(self.session.complete, prompt)
        async with self._turn:
            await self._idle.wait()
            context.set_prompt(_bytes(prompt))
            await self._drive(context, context.generation(stdout=self.session._stdout))
            return context.output.decode("utf-8", "replace")

    async def embed(self, text: str | bytes) -> list[float]:
        """The embedding of ``text`` (a model loaded with ``embedding``), as :meth:`Session.embed`."""
        context = self._local()
        if context is None:
            async with self._turn:
                return await self._on_thread(self.session.embed, text)
        async with self._turn:
            await self._idle.wait()
            context.set_prompt(_bytes(text))
            await self._drive(context, context.generation(stdout=self.session._stdout))
            return self.session._vector()

    async def stream(self, prompt: str | bytes, max_tokens: int | None = None) -> AsyncGenerator[bytes, None]:
        """Yield the generated text as it comes, in whole UTF-8 characters, from at most the session's
        ``n-predict`` and ``max_tokens`` tokens: the pieces :meth:`Session.stream` yields.  Leaving the
        loop early, or cancelling the consuming task, ends the sequence at the worker's next step.  While
        the consumer is :data:`STREAM_QUEUE` tokens behind, the stream's job pauses (out of the worker's
        steps, holding no sequence) until it catches up."""
        context = self._local()
        if context is None:
            async with self._turn:
                remote = self._threaded_stream(prompt, max_tokens)
                try:
                    async for piece in remote:
                        yield piece
                finally:
                    await remote.aclose()  # now, not when it is collected: the session's next call waits for it
            return
        async with self._turn:
            await self._idle.wait()
            context.set_prompt(_bytes(prompt))
            limit = self.session._stream_limit(max_tokens)
            if limit is not None and limit <= 0:
                return
            wake = asyncio.Event()
            waker = _waker(asyncio.get_running_loop())
            context.stream_listener = lambda: waker.notify(wake)
            produced = 0
            try:
                context.open_stream()
                while limit is None or produced < limit:
                    wake.clear()  # before looking: a token put after the look sets it
                    feed = context._feed
                    assert feed is not None
                    running = feed.running  # before the backlog: a job that ended has put all its tokens
                    if not feed.backlog:
                        if running:
                            await wake.wait()
                            continue
                        assert feed.final is not None
                        if feed.final.error is None:
                            if feed.outlook() is Outlook.PAUSED:
                                context.open_stream()  # the consumer took every token: the next job
                                continue
                            return  # ended without a token
                    result = context.stream_step()  # a token held, or the job's error: no wait
                    if result.stop_reason is StopReason.EOS:
                        return
                    if result.stop_reason is StopReason.CONTEXT_FULL:
                        raise WasiNNError(ErrorKind.CONTEXT_FULL, "the context is full (ctx-size reached)")
                    produced += 1
                    if context.last_piece:  # empty while a UTF-8 character is incomplete
                        yield context.last_piece
            finally:
                context.stream_listener = None
                self._end_stream(context)

    def _end_stream(self, context: InferenceContext) -> None:
        """End the stream without blocking the loop: a job still running is told to end at the worker's
        next step, and the session computes again (and closes) once the worker has dropped it.  The
        output stays what the stream gave (its ``metadata``), until the next computation."""
        feed = context._feed
        if feed is not None:
            loop = asyncio.get_running_loop()

            def dropped() -> None:  # on the loop, after a change of the feed
                if not feed.running and not self._idle.is_set():
                    context._end_feed()  # the job has ended: no wait
                    self._idle.set()

            def listener() -> None:  # on the worker's thread
                _post(loop, dropped)

            feed.listener = listener  # before end_soon: the job's end calls it
            if feed.end_soon():
                self._idle.clear()
                return
        context._end_feed()

    def configure(self, config: Mapping[str, Any] | str | bytes) -> None:
        """Change this session's sampling and stop rules (per-context keys)."""
        self.session.configure(config)

    @property
    def metadata(self) -> dict[str, Any]:
        """Usage of the last computation (token counts, timings, stop reason ...)."""
        return self.session.metadata

    async def close(self) -> None:
        """Free the execution context and the graph (after a cancelled computation has ended)."""
        await self._idle.wait()
        self.session.close()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- how a computation is awaited -------------------------------------------------

    def _local(self) -> InferenceContext | None:
        context = self.session._context
        return context if isinstance(context, InferenceContext) else None

    async def _drive(self, context: InferenceContext, steps: GenerationSteps) -> Any:
        """Run ``steps`` with each request queued on the model's worker and awaited; the steps' result."""
        try:
            request = next(steps)
            while True:
                try:
                    result = await self._job(context, request)
                except asyncio.CancelledError:
                    steps.close()
                    raise
                request = steps.send(result)
        except StopIteration as end:
            return end.value

    async def _job(self, context: InferenceContext, request: GenerationRequest) -> GenerationResult:
        """Queue ``request`` on the model's worker and await its result: the worker's thread completes the
        future through the loop.  Cancelled, the context is marked cancelled until the job has ended (the
        worker drops it at its next step); the session computes again only after that."""
        loop = asyncio.get_running_loop()
        worker, state = context.model.worker, context.state
        future: asyncio.Future[GenerationResult] = loop.create_future()
        flags = {"ended": False, "cancelling": False}

        def ended() -> None:  # on the loop, after the worker ended the job
            flags["ended"] = True
            if flags["cancelling"]:
                state.cancelled = False  # the job has ended: the context may compute again
                self._idle.set()
            elif not future.done():
                future.set_result(job.result)

        self._idle.clear()

        def on_done() -> None:  # on the worker's thread
            _post(loop, ended)

        job = worker.submit_then(request, state, on_done)
        try:
            result = await future
        except asyncio.CancelledError:
            if flags["ended"]:
                self._idle.set()
            else:  # ended() has not run yet: it will, and lift the cancel
                flags["cancelling"] = True
                state.cancelled = True  # the worker ends the job at its next step
            raise
        self._idle.set()
        return result

    async def _threaded_stream(self, prompt: str | bytes, max_tokens: int | None) -> AsyncGenerator[bytes, None]:
        """A remote backend's stream: each piece awaited on a thread (its backend has no worker to wake the
        loop); left early, the blocking stream is closed (on a thread) before this generator ends."""
        iterator = cast(Generator[bytes, None, None], self.session.stream(prompt, max_tokens))
        done = object()
        try:
            while True:
                piece = await self._on_thread(next, iterator, done)
                if piece is done:
                    return
                assert isinstance(piece, bytes)
                yield piece
        finally:
            await self._on_thread(iterator.close)

    async def _on_thread(self, call: Callable[..., _T], *args: Any) -> _T:
        """``call(*args)`` on a thread of the loop's default executor (a remote session's blocking call).
        Cancelled, the call in flight is cancelled on the server, and the task ends once the thread has
        returned: the session's next call never overlaps it."""
        running = asyncio.ensure_future(asyncio.to_thread(call, *args))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            cancel = getattr(self.session._context, "cancel", None)
            if cancel is not None:
                cancel()
            try:
                await asyncio.shield(running)
            except BaseException:
                pass
            raise


def _bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


async def open_session(
    nn: AsyncHost,
    name: str,
    config: Mapping[str, Any] | str | bytes | None = None,
    dirs: Sequence[tuple[str, str]] = (),
    stdout: PieceSink = python_stdout,
) -> AsyncSession:
    """A session on ``name``; loading the model (its first use) runs on a thread, not on the loop."""
    return AsyncSession(await asyncio.to_thread(nn.session, name, config, dirs, stdout))


class SessionOpener:
    """What :meth:`WasiNN.session_async` returns: ``async with`` it, or ``await`` it for the session."""

    def __init__(self, nn: AsyncHost, args: tuple[Any, ...]) -> None:
        self._nn, self._args = nn, args
        self._session: AsyncSession | None = None

    def __await__(self) -> Any:
        return open_session(self._nn, *self._args).__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await open_session(self._nn, *self._args)
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()


# -- guests ----------------------------------------------------------------------------


class GuestPool:
    """The threads async guest runs use (guest code blocks), and the epoch ticker that lets them be stopped."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"guest_threads must be at least 1, got {threads}")
        self.threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._ticker: Any = None
        self._lock = threading.Lock()

    def executor(self, nn: AsyncHost) -> ThreadPoolExecutor:
        """The pool (made, with the epoch ticker for ``nn``'s engine, on first use)."""
        with self._lock:
            if self._executor is None:
                from .launch.runner import EpochTicker

                self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="wasinn-async-guest")
                self._ticker = EpochTicker(nn.engine)
            return self._executor

    def close(self) -> None:
        """Stop the ticker and let the threads end (after the guests running now)."""
        with self._lock:
            executor, self._executor = self._executor, None
            ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.stop()
        if executor is not None:
            executor.shutdown(wait=False)


async def run_guest_async(
    nn: AsyncHost,
    pool: GuestPool,
    module: ModuleSource,
    args: Sequence[str],
    options: RunOptions | None,
    stdout: Output,
    stderr: Output,
) -> int:
    """:meth:`WasiNN.run_async`: the guest on ``pool``, its output piped to ``stdout``/``stderr``."""
    if not nn.interruptible:
        raise WasiNNError(
            ErrorKind.INVALID_ARGUMENT, "run_async needs WasiNN(interruptible=True) to stop a cancelled guest"
        )
    loop = asyncio.get_running_loop()
    guest = nn.load_guest(module)
    stop = GuestStop()
    options = options or RunOptions()
    options = replace(options, stop=stop, stdin=options.stdin or os.devnull)  # a service's stdin is not the guest's
    pumps: list[_Pump] = []
    close_fds: list[int] = []
    for field_name, output in (("stdout", stdout), ("stderr", stderr)):
        if output is None:
            continue
        read_end, write_end = os.pipe()
        close_fds.append(write_end)
        path = f"/dev/fd/{write_end}"
        options = replace(options, stdout=path) if field_name == "stdout" else replace(options, stderr=path)
        pumps.append(_Pump(loop, read_end, output))
    options = replace(options, close_fds=options.close_fds + tuple(close_fds))
    try:
        running = loop.run_in_executor(pool.executor(nn), nn.run, guest, args, options)
    except BaseException:
        for fd in close_fds:
            os.close(fd)
        raise
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        stop.interrupt()  # its wasm traps at the next epoch check; a compute it waits in fails now
        for pump in pumps:
            pump.discard()  # the caller is gone: a guest writing must not wait for its callbacks
        try:
            await asyncio.shield(running)
        except Exception:
            pass
        raise
    finally:
        for pump in pumps:
            await pump.finished()


class _Pump:
    """Copies a guest's output pipe to an async callback or a bytearray until the guest closes it (a slow
    callback makes the guest wait: back-pressure through the pipe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, output: AsyncSink | bytearray) -> None:
        self._output = output
        self._discarding = False
        self._delivery: asyncio.Future[Any] | None = None
        self._task = loop.create_task(self._copy(loop, fd))

    async def _copy(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
        )
        try:
            while chunk := await reader.read(1 << 16):
                if self._discarding:
                    continue
                if isinstance(self._output, bytearray):
                    self._output += chunk
                    continue
                self._delivery = asyncio.ensure_future(self._output(chunk))
                try:
                    await self._delivery
                except asyncio.CancelledError:
                    if not self._discarding:
                        raise
                except Exception as exc:  # the guest must not wait on a pipe nobody reads: drop the rest
                    log.error(
                        "a guest output callback failed (%s: %s); the rest of the output is dropped",
                        type(exc).__name__,
                        exc,
                    )
                    self._discarding = True
        finally:
            transport.close()

    def discard(self) -> None:
        """From now on read and drop the output (the run was cancelled)."""
        self._discarding = True
        if self._delivery is not None and not self._delivery.done():
            self._delivery.cancel()

    async def finished(self) -> None:
        """Wait until the guest has closed the pipe and everything was delivered (errors are dropped)."""
        try:
            await asyncio.shield(self._task)
        except Exception:
            pass
