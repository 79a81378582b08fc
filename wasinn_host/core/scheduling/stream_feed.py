"""A stream's tokens sampled ahead of its guest: the worker fills a :class:`StreamFeed`, the guest empties it.

A guest streaming with ``compute_single`` asks for one token at a time.  Sending each of those calls
to the model's worker and waiting for its step would put two thread hand-offs and the guest's own
time between every two steps of the model, and leave the stream out of the steps its guest is not
waiting for.  Instead the first ``compute_single`` of a stream starts one job that stays in the
worker's batches and puts each token it samples here, up to :data:`LOOKAHEAD` tokens ahead of the
guest; each ``compute_single`` then takes the next token, waiting only when the model has not made it
yet.  The tokens, and the sampler's history that makes them, are the ones the one-token steps gave.

- The job ends by itself at the end of generation or a full context (its last token carries the stop
  reason), and pauses (ends with the sampler kept for the next) once the guest is ``LOOKAHEAD`` tokens
  behind: a guest that stops reading holds no sequence of the model.  The guest's next call after it
  has taken every token starts the next job, from the tokens it has seen.
- A remote client's stream is pushed to it as its tokens come (:mod:`wasinn_host.rpc.stream_push`): the
  feed's ``listener`` is called after each token and at the job's end, so the server's sender wakes
  without polling; the server peeks the tokens (:meth:`StreamFeed.peek`), sends their pieces, and takes
  them once the client reports its guest took them.
- The guest ends the stream early (``fini_single``, a new input, a compute, a close) with
  :meth:`StreamFeed.end`: the worker drops the job at its next step and the call returns when it has
  (an asyncio stream, :mod:`wasinn_host.aio`, uses :meth:`StreamFeed.end_soon` and its listener instead);
  the tokens sampled past what the guest saw are forgotten (their KV cells are trimmed by the next
  request's prefix match, as any other unshared suffix is).
"""

from __future__ import annotations

import collections
import enum
import itertools
import logging
import queue
import threading
from typing import Any, Callable

from ..config.params import MAX_STREAM_INTERVAL
from ..generation import GenerationResult, StopReason

log = logging.getLogger("wasinn_host")

LOOKAHEAD = 16
"""Tokens a stream's job samples at most ahead of its guest before it pauses."""
_PHASES = itertools.count()
"""Numbers the feeds, so that streams started together are woken on different steps."""


class Outlook(str, enum.Enum):
    """What comes after the tokens a feed holds (:meth:`StreamFeed.outlook`)."""

    RUNNING = "running"
    """The job samples more."""
    PAUSED = "paused"
    """The job paused, its guest the lookahead behind: the next job starts once the guest took them all."""
    ENDS = "ends"
    """The stream ends after the tokens held (end of generation, a full context, an error)."""


LATE_AFTER = 1
"""Deadlines in a row a streaming guest may miss before the worker stops waiting for it.  One: with three,
8 streaming guests that missed now and then made the worker wait out the deadline on most steps (1.39 ms
a step against 0.14, 1,777 against 2,053 tokens/s, fast-step model, medians of 5)."""


class GuestsBack:
    """The guests a delivery woke, one after another: each wakes the next as it comes back for its next
    token, the last tells the worker.

    Where llama.cpp's threads take every core (a CPU decode), a guest that handles its token while the
    next decode runs takes a core from it, and llama.cpp's threads, which meet at a barrier after every
    graph node, all wait for the one it displaced.  So the worker, having woken the streams' guests,
    waits for them to come back (:meth:`StreamFeed.take` or :meth:`StreamFeed.end`) before it decodes
    again, at most a deadline; on a GPU, or with a core to spare, it does not wait.

    The guests run one at a time: woken together, they pass the interpreter lock to each other at every
    host call (three or four a token), a futex wake-up and a thread switch each time.
    """

    __slots__ = ("_lock", "_left", "_next", "_done")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left = 0
        self._next: collections.deque[StreamFeed] = collections.deque()
        """The feeds whose guests wait for their turn to be woken, in order."""
        self._done: queue.SimpleQueue[None] = queue.SimpleQueue()

    def start(self, feeds: list[StreamFeed]) -> None:
        """Wake the first of ``feeds``' guests (worker; their tokens are in the feeds, put without waking
        them); each wakes the next as it comes back."""
        with self._lock:
            self._left = len(feeds)
            self._next = collections.deque(feeds[1:])
        if feeds:
            feeds[0].wake()

    def back(self) -> None:
        """One guest came back (guest side): wake the next, or tell the worker they all came back."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
            following = self._next.popleft() if self._next else None
        if following is not None:
            following.wake()
        if last:
            self._done.put(None)

    def wait(self, timeout: float) -> bool:
        """Wait until every guest came back or ``timeout`` seconds passed (then the guests not woken yet
        are woken at once); whether they all came back."""
        try:
            self._done.get(timeout=timeout)
            return True
        except queue.Empty:
            with self._lock:
                self._left = 0  # the late ones count down nothing: the next start() starts over
                rest, self._next = list(self._next), collections.deque()
            for feed in rest:
                feed.wake()
            while not self._done.empty():  # one came back right at the deadline
                self._done.get_nowait()
            return False


class StreamFeed:
    """The tokens one stream's job sampled and its guest has not taken yet, one result each.

    The worker hands a token over on every step of every stream, so the hand-off is C-level: the items
    under a plain lock, and a guest with nothing to take waits on a ``SimpleQueue`` the worker puts one
    wake-up in per waiting thread (a ``threading.Condition``'s wait and notify are Python code: a few
    microseconds a token on the worker's thread, for each stream).
    """

    __slots__ = (
        "lookahead",
        "_items",
        "_lock",
        "_wakeups",
        "_waiters",
        "running",
        "final",
        "ended",
        "undelivered",
        "listener",
        "comeback",
        "late",
        "misses",
        "interval",
        "_phase",
        "_puts",
    )

    def __init__(
        self, lookahead: int = LOOKAHEAD, listener: Callable[[], None] | None = None, interval: int = 1
    ) -> None:
        self.lookahead = max(1, lookahead)
        self.interval = max(1, min(interval, MAX_STREAM_INTERVAL, self.lookahead))
        """A waiting guest is woken once this many tokens are ready (the first token and the stream's end
        at once): the ``stream-interval`` key."""
        self._phase = next(_PHASES) % self.interval
        self._puts = 0
        """Tokens put so far (worker only)."""
        self._items: collections.deque[GenerationResult] = collections.deque()
        self._lock = threading.Lock()
        self._wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._waiters = 0
        """Threads waiting for a change of the feed (guarded by ``_lock``)."""
        self.running = True
        """A job fills the feed (until :meth:`close`)."""
        self.final: GenerationResult | None = None
        """The job's own result once it ended: its stop reason, or its error."""
        self.ended = False
        """The guest ended the stream (:meth:`end`): the worker drops the job."""
        self.undelivered = 0
        """Tokens the worker sampled for the feed and holds until it next calls llama.cpp (worker only)."""
        self.listener = listener
        """Called (on the worker's thread, without the feed's lock) after each token and at the job's end."""
        self.comeback: GuestsBack | None = None
        """Told when the guest next asks for a token or ends the stream (set by the worker as it wakes it)."""
        self.late = False
        """The guest missed the worker's deadline :data:`LATE_AFTER` times in a row: no longer waited for."""
        self.misses = 0
        """Deadlines the guest missed in a row (worker only)."""

    def _changed(self) -> int:
        """The threads to wake after a change (holding ``_lock``)."""
        waiters, self._waiters = self._waiters, 0
        return waiters

    def _wake(self, waiters: int) -> None:
        for _ in range(waiters):
            self._wakeups.put(None)
        if self.listener is not None:
            try:
                self.listener()
            except Exception:  # the feed's change is done: a listener's failure is its own
                log.exception("wasinn: a stream's listener failed")

    @property
    def waiting(self) -> bool:
        """A guest waits for the next token (read without the lock: a hint)."""
        return self._waiters > 0

    def _came_back(self) -> None:
        comeback, self.comeback = self.comeback, None
        if comeback is not None:
            comeback.back()

    def _wait(self) -> None:
        """Wait for the next change (called after counting oneself in ``_waiters`` under ``_lock``)."""
        self._wakeups.get()

    # -- worker side --------------------------------------------------------------

    def due(self, item: GenerationResult) -> bool:
        """Whether :meth:`put` of ``item`` next wakes a waiting guest: always with an interval of 1; else for
        the stream's first token, its end, a full lookahead, and every ``interval`` tokens (worker only)."""
        if self.interval == 1 or item.stop_reason is not StopReason.TOKEN or item.error is not None:
            return True
        puts = self._puts + 1
        return puts == 1 or (puts + self._phase) % self.interval == 0 or len(self._items) + 1 >= self.lookahead

    def put(self, item: GenerationResult, wake: bool = True) -> bool:
        """Hand one token's result to the guest (waking it when :meth:`due`); False once the guest is
        ``lookahead`` tokens behind.  ``wake=False``: a waiting guest is left waiting until :meth:`wake`
        (its turn in :class:`GuestsBack`)."""
        due = self.due(item) and wake
        self._puts += 1
        with self._lock:
            self._items.append(item)
            room = len(self._items) < self.lookahead
            waiters = self._changed() if due else 0
        self._wake(waiters)
        return room

    def close(self, final: GenerationResult) -> None:
        """The job ended (``final``: its result); a guest waiting for a token gets what is left, then None."""
        with self._lock:
            self.final = final
            self.running = False
            waiters = self._changed()
        self._wake(waiters)

    def wake(self) -> None:
        """Wake the threads waiting for tokens :meth:`put` without waking them."""
        with self._lock:
            waiters = self._changed()
        self._wake(waiters)

    # -- guest side ---------------------------------------------------------------

    def take(self) -> GenerationResult | None:
        """The next token's result, waiting for the job to sample it; None once the job ended and every
        token it made was taken.  A guest the worker waits for comes back when it has taken every token
        it was woken for (it waits again, or its stream ended)."""
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                running = self.running
                if running:
                    self._waiters += 1
            if self.comeback is not None:
                self._came_back()
            if not running:
                return None
            self._wait()

    def peek(self, limit: int) -> list[GenerationResult]:
        """Up to ``limit`` of the next results already sampled, without taking them: tokens only (the
        first that ends the stream, or carries an error, and those after it are left out)."""
        with self._lock:
            ready: list[GenerationResult] = []
            for item in self._items:
                if len(ready) >= limit or item.stop_reason is not StopReason.TOKEN or item.error is not None:
                    break
                ready.append(item)
            return ready

    def outlook(self) -> Outlook:
        """Whether the job samples more, paused, or the stream ends after the tokens held."""
        with self._lock:
            if any(item.stop_reason is not StopReason.TOKEN or item.error is not None for item in self._items):
                return Outlook.ENDS
            if self.running:
                return Outlook.RUNNING
            final = self.final
            paused = final is not None and final.error is None and final.stop_reason is StopReason.TOKEN
            return Outlook.PAUSED if paused else Outlook.ENDS

    def end(self) -> None:
        """End the stream early: wait until the worker dropped the job (at once if it ended already)."""
        if self.comeback is not None:
            self._came_back()
        while True:
            with self._lock:
                self.ended = True
                self._items.clear()
                if not self.running:
                    return
                self._waiters += 1
            self._wait()

    def end_soon(self) -> bool:
        """:meth:`end` without waiting (a caller on an event loop): the worker drops the job at its next
        step and then calls the ``listener``; whether the job still runs."""
        with self._lock:
            self.ended = True
            self._items.clear()
            return self.running

    @property
    def backlog(self) -> int:
        """Tokens sampled and not taken yet."""
        return len(self._items)

    # -- spilling (an idle context's feed, in the spill store) ---------------------

    def record(self) -> list[tuple[Any, ...]]:
        """The tokens not taken yet, as plain values (the feed of a paused stream: its job ended)."""
        return [
            (item.generated, bytes(item.text), item.probs, item.stop_reason.value, item.generation_ms)
            for item in self._items
        ]

    @classmethod
    def resumed(cls, record: list[tuple[Any, ...]]) -> StreamFeed:
        """A paused stream's feed again, from :meth:`record`."""
        feed = cls()
        for generated, text, probs, stop, generation_ms in record:
            feed._items.append(
                GenerationResult(
                    list(generated),
                    bytearray(text),
                    [(token, list(top)) for token, top in probs],
                    stop_reason=StopReason(stop),
                    generation_ms=generation_ms,
                )
            )
        feed.running = False
        feed.final = GenerationResult(stop_reason=StopReason.TOKEN)
        return feed
