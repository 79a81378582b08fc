"""One Store's ``stream-stdout`` pieces on their way out: a bounded queue and a thread that writes them.

The model's worker thread samples a piece for every guest it serves; writing it to a guest's stdout
itself would make every guest wait whenever one guest's stdout is slow or not read at all (a pipe
nobody empties blocks its writer).  So the worker only appends the piece to the Store's
:class:`PieceQueue`, and the queue's own thread writes it to the sink.  While a queue holds
:data:`MAX_PIECES` pieces it says it has no room (:meth:`PieceQueue.has_room`), and the worker leaves
that Store's computation out of its steps until it has: one guest's stdout holds back that guest
alone.  ``compute`` returns once its pieces are written (:meth:`PieceQueue.flush`), so they land in
order with what the guest writes after it.
"""

from __future__ import annotations

import collections
import threading

from .stdout import PieceSink

MAX_PIECES = 256
"""Pieces a Store's queue holds before its computation waits for its stdout."""


class PieceQueue:
    """A piece sink that returns at once: ``sink`` gets the pieces, in order, on the queue's thread."""

    def __init__(self, sink: PieceSink, max_pieces: int = MAX_PIECES) -> None:
        self.sink = sink
        self.max_pieces = max(1, max_pieces)
        self._pieces: collections.deque[bytes] = collections.deque()
        self._cv = threading.Condition(threading.Lock())
        self._writing = False
        """The thread is writing a piece it took (the queue is not flushed until it has)."""
        self._closed = False
        self._thread: threading.Thread | None = None

    def __call__(self, piece: bytes) -> None:
        """Queue one piece (never waits; the worker checks :meth:`has_room` before it samples more)."""
        with self._cv:
            if self._closed:
                return
            self._pieces.append(piece)
            if self._thread is None:  # most Stores never stream: no thread until the first piece
                self._thread = threading.Thread(target=self._write, name="wasinn-stream-stdout", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def has_room(self) -> bool:
        """Fewer than ``max_pieces`` pieces wait to be written."""
        return len(self._pieces) < self.max_pieces

    def flush(self) -> None:
        """Wait until every piece queued so far is written."""
        with self._cv:
            while (self._pieces or self._writing) and self._thread is not None:
                self._cv.wait()

    def close(self) -> None:
        """Stop taking pieces; the thread writes what is queued, then ends (nobody waits for it: a sink
        that never takes them holds only the thread)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _write(self) -> None:
        while True:
            with self._cv:
                while not self._pieces and not self._closed:
                    self._cv.wait()
                if not self._pieces:
                    return
                piece = self._pieces.popleft()
                self._writing = True
            try:
                self.sink(piece)
            finally:
                with self._cv:
                    self._writing = False
                    self._cv.notify_all()
