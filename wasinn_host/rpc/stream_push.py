"""A stream's pieces pushed to a remote client as they are sampled (``Host.StreamSingle``), both ends.

Over ``ComputeSingleOutput`` a streaming guest waits for a round trip whenever its next token is not
among the pieces the last answer brought.  Here the client opens one bidirectional call when its guest
starts (or goes on with) a stream, and the server sends the piece of every token the stream's job
samples as the worker delivers it, without taking it: the client answers each ``compute_single`` of
its guest from the pieces it holds (waiting for the next message only when the model has not sampled
it yet) and reports, now and then, how many its guest took; the server takes exactly those
(``compute_single``), so the server's context is where the guest is:

1. client: ``StepRequest(ctx_handle)`` opens the call; the server starts the stream's job (or, once the
   guest has taken every token of a paused job, the next one) without taking a token;
2. server: ``StepResult(ready=[...])`` with the pieces of the tokens sampled since its last message
   (as the guest's ``compute_single`` steps give them, whole UTF-8 characters), ``paused`` when the job
   waits for the guest (its lookahead of tokens not taken), ``ends`` when the stream ends after the
   pieces sent (end of generation, a full context, an error);
3. client: ``StepRequest(taken=N)``: its guest took N more pieces, every :data:`ACK_EVERY` pieces and
   before it waits while the job is paused; the server takes them and, when it has taken everything a
   paused job sampled, starts the next job;
4. the client closes its side before any other call of the context (``fini_single``, metadata, a new
   prompt) with a last report, and waits until the server has ended the call (having taken those);
   at ``ends`` its guest's next ``compute_single`` is one ``ComputeSingleOutput``, which gives the end
   (end of sequence, context full) or the error as before.

A server that lacks the call (WasmEdge's, an older wasinn-host) answers UNIMPLEMENTED and the client
streams with ``ComputeSingleOutput`` (or WasmEdge's two calls a token) instead; a context that cannot
push (a server in front of another server) is answered UnsupportedOperation the same way.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, Iterator

from ..core.errors import ErrorKind, WasiNNError
from ..core.scheduling.stream_feed import LOOKAHEAD, Outlook
from ..ephemeral.execution import ExecutionContext
from .messages import host

ACK_EVERY = LOOKAHEAD
"""Pieces a client's guest takes between two reports (a report is a message to the server, which wakes
two of its threads: fewer of them leave the cores to llama.cpp)."""
PUSH_LOOKAHEAD = 2 * LOOKAHEAD
"""A pushed stream's lookahead (its jobs' :attr:`.StreamFeed.lookahead`).  The server takes a token only
once the client reports it, so the tokens its job has sampled ahead of what it took include the pieces
in flight and those the guest took since the client's last report (up to :data:`ACK_EVERY`): with an
in-process stream's lookahead the job paused every few tokens until a report came."""
GATHER_S = 0.004
"""After a message, the server gathers the pieces that come for this long before it sends the next (one
message, one wake of the client, for several tokens: gRPC's cost per message is the cost of pushing) ..."""
GATHER_PIECES = 4
"""... or for as long as about this many pieces take to come, if that is shorter (a fast model's stream
stays well within its job's lookahead of pieces neither sent nor reported)."""
SAFETY_WAKE_S = 1.0
"""The server's sender looks at the stream at least this often, even if no token or report woke it."""


class PushSender:
    """The server's half: sends a stream's pieces as they come, takes what the client reports taken."""

    def __init__(self, ctx: ExecutionContext, requests: Iterator[Any]) -> None:
        self.ctx = ctx
        self._requests = requests
        self._wake = threading.Event()
        self._gone = threading.Event()
        self._reported = 0
        """Steps the client reported taken (the reader thread adds to it)."""
        self._closed = False
        """The client closed its side (or went away): take what it reported and end."""
        self._half_closed = False
        """The client closed its side after its last report (not a cancel)."""
        self.taken = 0
        """Steps taken on the server's context in this call."""
        self.sent = 0
        """Pieces sent in this call."""
        self.finished = False
        """The client closed the call and the server took what it reported."""
        self._draining = False
        """The server shuts down: send the pieces sampled and say the stream ends after them."""

    def _read(self) -> None:
        try:
            for request in self._requests:
                self._reported += int(request.taken)
                self._wake.set()
            self._half_closed = True
        except Exception:  # noqa: BLE001 - the client went away or the call was cancelled: end as closed
            pass
        finally:
            self._closed = True
            self._wake.set()
            self._gone.set()

    def results(self) -> Iterator[Any]:
        """The call's messages; raises :class:`WasiNNError` when the stream cannot go on."""
        threading.Thread(target=self._read, name="wasinn-rpc-reports", daemon=True).start()
        self._open()
        told: Outlook | None = None
        last, gather = 0.0, 0.0
        while True:
            wait = last + gather - time.monotonic()
            if wait > 0:
                self._gone.wait(wait)  # a client closing its side is not kept waiting
            self._wake.clear()  # whatever comes from here on wakes the wait below
            self._take_reported()
            if self._closed:
                self.finished = self._half_closed
                return
            outlook = self._outlook()  # before the pieces: once it is not RUNNING, they are all there
            if outlook is Outlook.PAUSED and self.taken == self.sent and not self._draining:
                outlook = self._open()  # the guest took every token of the paused job: the next job
            ahead = self.sent - self.taken
            ready = self._ready_pieces(ahead + PUSH_LOOKAHEAD)[ahead:]
            if self._draining:  # the client closes the call once its guest took what is sampled
                outlook = Outlook.ENDS
            said = None if outlook is Outlook.RUNNING else outlook
            if ready or said is not told:
                self.sent += len(ready)
                told = said
                yield host.StepResult(ready=ready, paused=said is Outlook.PAUSED, ends=said is Outlook.ENDS)
                now = time.monotonic()
                if ready:  # the time a piece takes to come, from this message's
                    gather = min(GATHER_S, GATHER_PIECES * (now - last) / len(ready)) if last else 0.0
                last = now
            self._wake.wait(SAFETY_WAKE_S)

    def _inner(self) -> Any:
        """The backend context (an :class:`~wasinn_host.core.inference.InferenceContext` where it can push),
        this sender its stream's listener."""
        inner: Any = self.ctx.inner  # taken back from the spill store if it went there
        inner.stream_listener = self._wake.set
        inner.stream_lookahead = PUSH_LOOKAHEAD
        return inner

    def _open(self) -> Outlook:
        opener: Callable[[], Outlook] | None = getattr(self._inner(), "open_stream", None)
        if opener is None:
            raise WasiNNError(ErrorKind.UNSUPPORTED, "this server's contexts cannot push a stream")
        return opener()

    def _outlook(self) -> Outlook:
        outlook: Outlook = self._inner().stream_outlook()
        return outlook

    def _ready_pieces(self, limit: int) -> list[bytes]:
        return list(self._inner().ready_pieces(limit))

    def _take_reported(self) -> None:
        """Take the steps the client reported (tokens sampled already: no wait), at most those sent."""
        while self.taken < min(self._reported, self.sent):
            self.ctx.compute_single()
            self.taken += 1

    def drain(self) -> None:
        """The server shuts down: the client gets the pieces sampled so far and the stream's end (its
        next step is a plain call, which a draining server refuses); no next job starts."""
        self._draining = True
        self._wake.set()

    def cancel_unless_finished(self) -> None:
        """The call ended: unless the client closed it, the stream's computation is cancelled (a client
        that cancelled its step, or went away)."""
        if not self.finished:
            self.ctx.cancel()

    def stop(self) -> None:
        """The call ended: stop waking this sender."""
        if self.ctx.spilled:
            return  # a spilled context keeps no listener (and a finalised one has no context to reach)
        inner: Any = self.ctx.inner
        if getattr(inner, "stream_listener", None) is not None:
            inner.stream_listener = None
            inner.stream_lookahead = LOOKAHEAD


class PushReceiver:
    """The client's half: the pieces the server pushed, the reports of what the guest took."""

    def __init__(self, handle: int, open_call: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
        self._reports: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._reports.put(host.StepRequest(ctx_handle=handle))
        self._results = open_call(iter(self._reports.get, None))
        self._pieces: collections.deque[bytes] = collections.deque()
        self._unreported = 0
        self._paused = False
        self.ends = False
        """The server said the stream ends after the pieces it sent."""
        self.closed = False

    def next_piece(self) -> bytes | None:
        """The piece of the guest's next step, waiting for it if needed; None when the stream's end comes
        next (the caller asks the server for it with a plain call, after :meth:`close`).  Raises the
        call's error as :class:`WasiNNError`."""
        while not self._pieces:
            if self.ends:
                return None
            if self._paused and self._unreported:
                self._report()
            result = next(self._results, None)
            if result is None:
                raise WasiNNError(ErrorKind.RUNTIME_ERROR, "the server ended the stream of pieces early")
            self._pieces.extend(bytes(piece) for piece in result.ready)
            self._paused = bool(result.paused)
            self.ends = bool(result.ends)
        self._unreported += 1
        if self._unreported >= ACK_EVERY:
            self._report()
        return self._pieces.popleft()

    def _report(self) -> None:
        self._reports.put(host.StepRequest(taken=self._unreported))
        self._unreported = 0

    def close(self) -> None:
        """Report the steps taken and wait until the server has taken them and ended the call."""
        if self.closed:
            return
        self.closed = True
        self._report()
        self._reports.put(None)
        for _ in self._results:
            pass

    def abandon(self) -> None:
        """End the call without waiting (the context is being closed)."""
        self.closed = True
        self._reports.put(None)
