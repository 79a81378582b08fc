"""Guest pipes copied by one thread: every byte arrives, whole lines stay whole, a finished copier ends
while its pipe is still open elsewhere, and no thread is started per pipe."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from wasinn_host.guest.pipe_hub import PipeHub
from wasinn_host.guest.stdout import PipeCopier


class Sink(io.BytesIO):
    """A sink that records each write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes.append(bytes(data))
        return super().write(data)


def test_many_pipes_one_thread_every_byte_in_whole_lines() -> None:
    before = threading.active_count()
    sink, lock = Sink(), threading.Lock()
    pipes = [os.pipe() for _ in range(64)]
    copiers = [PipeCopier(r, sink, lock) for r, _ in pipes]
    assert threading.active_count() <= before + 1  # the hub's thread at most, not one per pipe
    for i, (_, w) in enumerate(pipes):
        os.write(w, f"guest {i} says ".encode())
    for i, (_, w) in enumerate(pipes):
        os.write(w, f"hello {i}\nby".encode())
    for i, (_, w) in enumerate(pipes):
        os.write(w, f"e {i}\n".encode())
        os.close(w)  # the writer's end: the copier reads to the end and stops by itself
    for copier in copiers:
        copier.join()
    lines = sink.getvalue().decode().split("\n")
    for i in range(64):
        assert f"guest {i} says hello {i}" in lines
        assert f"bye {i}" in lines
    assert len(lines) == 2 * 64 + 1  # and the empty string after the last newline
    assert all(w.endswith(b"\n") for w in sink.writes)


def test_finish_ends_a_copier_whose_pipe_is_still_open() -> None:
    sink = Sink()
    r, w = os.pipe()
    copier = PipeCopier(r, sink, whole_lines=False)
    os.write(w, b"partial line, no newline")
    copier.finish()  # the guest has ended; wasmtime may still hold the write end
    copier.join()
    assert sink.getvalue() == b"partial line, no newline"
    os.close(w)


def test_a_failing_sink_drops_its_output_and_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            raise BrokenPipeError("reader gone")

    good = Sink()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    bad_copier = PipeCopier(r1, Broken())
    good_copier = PipeCopier(r2, good)
    os.write(w1, b"lost\n")
    time.sleep(0.05)
    os.write(w1, b"lost too\n")
    os.write(w2, b"kept\n")
    os.close(w1)
    os.close(w2)
    bad_copier.join()
    good_copier.join()
    assert good.getvalue() == b"kept\n"
    assert len([r for r in caplog.records if "cannot be copied" in r.getMessage()]) == 1  # one line, not one a write


def test_a_child_process_copies_its_own_pipes() -> None:
    """After a fork the parent's hub thread does not run in the child: the child's copiers get one of
    their own."""
    r, w = os.pipe()
    PipeCopier(r, Sink()).finish()  # the hub's thread runs in this process now
    os.close(w)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: copy a pipe of its own into out_w
        try:
            cr, cw = os.pipe()
            copier = PipeCopier(cr, os.fdopen(out_w, "wb", buffering=0))
            os.write(cw, b"from the child\n")
            os.close(cw)
            copier.join()
        finally:
            os._exit(0)
    os.close(out_w)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(out_r, "rb") as got:
        assert got.read() == b"from the child\n"
    assert status == 0


class Reader:
    """A bare copier for a hub of the test's own."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = b""
        self.ended = threading.Event()

    def feed(self, data: bytes) -> None:
        self.data += data

    def end(self) -> None:
        self.ended.set()


def copied_through(hub: PipeHub) -> bytes:
    """What a new pipe's copier gets through ``hub`` (the hub still copies: within 10 s)."""
    r, w = os.pipe()
    reader = Reader(r)
    hub.add(reader)
    os.write(w, b"still copied\n")
    os.close(w)
    assert reader.ended.wait(10.0), "the hub stopped copying"
    return reader.data


def test_a_pipe_the_hub_cannot_watch_is_lost_alone() -> None:
    hub = PipeHub()
    r, w = os.pipe()
    hub.add(Reader(r))
    twice = Reader(r)  # the same descriptor again: the hub's selector refuses it
    hub.add(twice)
    assert twice.ended.wait(10.0)
    assert copied_through(hub) == b"still copied\n"
    os.close(w)


def test_a_pipe_closed_behind_the_hubs_back_ends_its_copier_and_the_hub_copies_on() -> None:
    hub = PipeHub()
    r, w = os.pipe()
    reader = Reader(r)
    hub.add(reader)
    os.write(w, b"before")
    time.sleep(0.05)
    os.close(r)  # a bug elsewhere closes the read end the hub owns
    hub.finish(reader)
    assert reader.ended.wait(10.0)
    assert copied_through(hub) == b"still copied\n"
    os.close(w)
