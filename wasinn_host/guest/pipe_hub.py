"""One thread that reads every guest pipe the host copies (``--instances N`` stdout and stderr, a guest's
stdout into a regular file), however many there are.

A pipe's copier (:class:`~wasinn_host.guest.stdout.PipeCopier`) registers its read end here; the hub's
thread waits in one ``select`` over all of them and hands each chunk to its copier as it arrives.
Nothing wakes the thread but data, a new pipe, or a copier's :meth:`PipeHub.finish` (a byte on the
hub's own wake-up pipe): a thread per pipe polling for its writer's end woke the process 20 times a
second per pipe (2,560 times a second at 64 guests), each time taking the interpreter from the model
worker and a core from llama.cpp's threads.

:meth:`PipeHub.finish` is how a copier stops while its pipe may still be open elsewhere (wasmtime
keeps a guest's stdout open until its Store is dropped): what was written is read to the end, given to
the copier, and the copier is done.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from typing import Protocol

log = logging.getLogger("wasinn_host")

CHUNK = 65536
"""The most a read takes from a pipe at once."""


class PipeReader(Protocol):
    """What the hub needs of a copier."""

    fd: int
    """The pipe's read end (the hub makes it non-blocking and closes it when the copier is done)."""

    def feed(self, data: bytes) -> None:
        """Data just read from the pipe."""

    def end(self) -> None:
        """The pipe is read to its end (its writer closed it, or the copier finished): nothing follows."""


class PipeHub:
    """Reads registered pipes on one daemon thread, started at the first :meth:`add` (:data:`HUB`: the
    process's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._added: list[PipeReader] = []
        self._finishing: list[PipeReader] = []
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1  # the thread's wake-up pipe, made with the thread

    def forget(self) -> None:
        """Start afresh: in a child process after a fork, where the parent's thread does not run."""
        self._lock = threading.Lock()
        self._added, self._finishing, self._thread = [], [], None
        self._wake_r = self._wake_w = -1

    def add(self, reader: PipeReader) -> None:
        """Copy ``reader``'s pipe from now on."""
        os.set_blocking(reader.fd, False)
        with self._lock:
            self._added.append(reader)
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe()
                os.set_blocking(self._wake_r, False)
                os.set_blocking(self._wake_w, False)
                self._thread = threading.Thread(target=self._run, name="wasinn-pipes", daemon=True)
                self._thread.start()
        self._wake()

    def finish(self, reader: PipeReader) -> None:
        """Read what ``reader``'s pipe holds now, then end it (its writer has ended, even if the pipe is
        still open elsewhere)."""
        with self._lock:
            self._finishing.append(reader)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the wake-up pipe is full: the thread has wake-ups to read already
            pass

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        while True:
            for key, _ in selector.select():
                reader: PipeReader | None = key.data
                if reader is None:
                    _drain_wakeups(self._wake_r)
                elif not _read_available(reader):
                    _close(selector, reader)
            with self._lock:
                added, self._added = self._added, []
                finishing, self._finishing = self._finishing, []
            for reader in added:
                try:
                    selector.register(reader.fd, selectors.EVENT_READ, reader)
                except (OSError, ValueError, KeyError) as exc:  # a bad descriptor: this pipe alone is lost
                    log.warning("a guest's output pipe cannot be watched (%s); it is not copied", exc)
                    reader.end()
            for reader in finishing:
                registered = selector.get_map().get(reader.fd)
                if registered is not None and registered.data is reader:  # not ended by its writer's close
                    _read_available(reader)
                    _close(selector, reader)


def _read_available(reader: PipeReader) -> bool:
    """Give ``reader`` everything its pipe holds now; False once the pipe is at its end (or unreadable)."""
    while True:
        try:
            chunk = os.read(reader.fd, CHUNK)
        except BlockingIOError:
            return True
        except OSError as exc:
            log.warning("a guest's output pipe cannot be read (%s); what follows on it is lost", exc)
            return False
        if not chunk:
            return False
        try:
            reader.feed(chunk)
        except Exception as exc:  # a copier's bug must not stop the copying of every other pipe
            log.warning("a guest's output could not be copied (%s); what follows on its pipe is lost", exc)
            return False


def _close(selector: selectors.BaseSelector, reader: PipeReader) -> None:
    """Stop watching ``reader``'s pipe, close it, and tell the copier it is done (whatever fails before)."""
    try:
        selector.unregister(reader.fd)
        os.close(reader.fd)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("a guest's output pipe could not be closed (%s)", exc)
    finally:
        reader.end()


def _drain_wakeups(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


HUB = PipeHub()
"""The process's hub (its thread and wake-up pipe are made at the first pipe)."""
os.register_at_fork(after_in_child=HUB.forget)
