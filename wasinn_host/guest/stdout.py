"""Where a guest's stdout goes, for the guest and for its ``stream-stdout`` pieces alike.

WasmEdge's ``stream-stdout`` prints each generated piece on stdout while ``compute`` runs, between
what the guest printed before and after.  This host writes the pieces to the stdout of the Store that
computes, in order with the guest's own writes (which wasmtime has written by the time ``compute`` is
called):

- inherited (``WasiConfig.inherit_stdout``): file descriptor 1, the open file wasmtime writes to;
- a pipe or a character device (``--instances N`` gives each instance a pipe): the same pipe;
- a regular file: wasmtime writes at its own file offset, which no other descriptor can follow, so the
  guest writes into a pipe instead and a thread copies it to the file; the pieces go into that pipe.

:class:`GuestStdout` sets one guest's stdout up this way; its :meth:`~GuestStdout.write` is the
piece sink :meth:`WasiNN.attach <wasinn_host.WasiNN.attach>` takes.  A sink runs on the model's worker
thread: :func:`guarded` makes one that fails log a line and drop the Store's later pieces, never stop
the worker.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import threading
from typing import BinaryIO, Callable, Union

import wasmtime

from . import pipe_hub

log = logging.getLogger("wasinn_host")

PieceSink = Callable[[bytes], None]
"""Receives the bytes of each generated piece, in order."""
Destination = Union[str, "os.PathLike[str]", None]
"""A path for the guest's stdout, or None: the host process's (inherited)."""


def write_fd(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a pipe may take it in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def inherited_stdout(piece: bytes) -> None:
    """The sink of a guest that inherits stdout: file descriptor 1, after whatever Python buffered for it."""
    try:
        sys.stdout.flush()
    except (AttributeError, ValueError, OSError):
        pass
    write_fd(1, piece)


def python_stdout(piece: bytes) -> None:
    """``sys.stdout`` as it is when the piece comes (what a :class:`~wasinn_host.Session` prints on)."""
    out = sys.stdout
    try:
        out.flush()
        out.buffer.write(piece)
        out.buffer.flush()
    except (AttributeError, ValueError):
        out.write(piece.decode("utf-8", "replace"))
        out.flush()


def guarded(sink: PieceSink, what: str) -> PieceSink:
    """``sink``, except that its first failure logs one line and drops the pieces that follow."""
    failed = False

    def write(piece: bytes) -> None:
        nonlocal failed
        if failed:
            return
        try:
            sink(piece)
        except Exception as exc:
            failed = True
            log.warning("stream-stdout: cannot write to %s (%s); its later pieces are dropped", what, exc)

    return write


class PipeCopier:
    """Copies a pipe to ``sink`` as it comes, or one whole line at a time under ``lock``; the reading is
    the process's :class:`~wasinn_host.guest.pipe_hub.PipeHub` thread's, shared by every copier."""

    def __init__(
        self, source: int, sink: BinaryIO, lock: threading.Lock | None = None, whole_lines: bool = True
    ) -> None:
        self.fd = source
        self._sink = sink
        self._lock = lock or threading.Lock()
        self._whole_lines = whole_lines
        self._pending = b""
        self._broken = False
        """The sink failed once: the rest of the pipe is read and dropped (one log line, not one a write)."""
        self._done = threading.Event()
        pipe_hub.HUB.add(self)

    def feed(self, data: bytes) -> None:
        """Data read from the pipe (on the hub's thread): written out, whole lines only if so asked."""
        pending = self._pending + data
        cut = pending.rfind(b"\n") + 1 if self._whole_lines else len(pending)
        if cut:
            self._write(pending[:cut])
        self._pending = pending[cut:]

    def end(self) -> None:
        """The pipe is read to its end: the last partial line goes out too."""
        try:
            if self._pending:
                self._write(self._pending)
                self._pending = b""
        finally:
            self._done.set()

    def _write(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            with self._lock:
                self._sink.write(data)
                self._sink.flush()
        except (OSError, ValueError) as exc:
            self._broken = True
            log.warning("a guest's output cannot be copied (%s); the rest of it is dropped", exc)

    def finish(self) -> None:
        """The writer has ended: copy what is left and stop, even if the pipe is still open elsewhere."""
        pipe_hub.HUB.finish(self)

    def join(self) -> None:
        """Wait until everything written has been copied."""
        self._done.wait()


class GuestStdout:
    """One guest's stdout, set up so that its ``stream-stdout`` pieces land in order with its writes.

    >>> out = GuestStdout("answer.txt")
    >>> out.configure(wasi)                  # the guest's WasiConfig
    >>> nn.attach(store, stdout=out.write)   # the Store's pieces
    >>> ...                                  # run the guest, then store.close()
    >>> out.close()                          # everything is in answer.txt now

    ``destination`` None is the host process's stdout (inherited); a path that cannot be opened
    raises OSError.
    """

    def __init__(self, destination: Destination = None) -> None:
        self.path: str | None = None
        """What wasmtime opens for the guest's stdout (None: inherited)."""
        self._fd: int | None = None
        self._file: BinaryIO | None = None
        self._copier: PipeCopier | None = None
        if destination is None:
            return
        path = os.fspath(destination)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = stat.S_IFREG
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode):
            self.path = path  # no file offset: a second descriptor writes into the same stream, in order
            self._fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        else:
            self._file = open(path, "wb")  # noqa: SIM115 (closed by close())
            read_end, self._fd = os.pipe()
            self._copier = PipeCopier(read_end, self._file, whole_lines=False)
            self.path = f"/dev/fd/{self._fd}"

    def write(self, piece: bytes) -> None:
        """The piece sink: write where the guest writes (nothing once closed)."""
        if self.path is None:
            inherited_stdout(piece)
        elif self._fd is not None:
            write_fd(self._fd, piece)

    def configure(self, wasi: wasmtime.WasiConfig) -> None:
        """Point ``wasi``'s stdout at this destination."""
        if self.path is None:
            wasi.inherit_stdout()
        else:
            wasi.stdout_file = self.path

    def close(self) -> None:
        """Close this side (after the guest's Store is closed) and wait until the copy is complete."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._copier is not None:
            self._copier.finish()
            self._copier.join()
            self._copier = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> GuestStdout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
