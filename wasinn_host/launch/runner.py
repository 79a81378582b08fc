"""Running guests for ``wasinn run``: N instances, whole output lines, deadlines, Ctrl-C.

Guests run in threads (one Store each) while the main thread waits, so Ctrl-C and
``--timeout`` act at once: every Store checks the run's :class:`~wasinn_host.launch.guest_stop.GuestStop`
as the engine's epoch advances (a guest running wasm traps at its next check, within about
50 ms) and in-flight inference is cancelled (a guest waiting in ``compute`` gets a runtime
error, then traps).  With several instances each one's stdout (its ``stream-stdout`` pieces with
it) and stderr go through a pipe and are copied to the terminal a whole line at a time; the
copying ends when the instance does, even if something still holds the pipe open.  The instances
of a server guest listen on one address (:mod:`wasinn_host.sockets.shared`).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, replace
from typing import Protocol, Sequence

import wasmtime

from ..guest.stdout import PipeCopier
from ..sockets.shared import ListenerGroup
from .guest_load import Guest, GuestError, ModuleSource
from .guest_run import RunOptions
from .guest_stop import GuestStop

TICK_SECONDS = 0.01
EXIT_USAGE = 2
"""A guest that could not be loaded or linked, or a host error (as every ``wasinn`` usage error)."""
EXIT_TRAP = 134
"""A guest that trapped or ran past its timeout (as wasmtime's CLI: 128 + SIGABRT)."""


class GuestHost(Protocol):
    """What :func:`run_instances` needs of the host (:class:`~wasinn_host.WasiNN`)."""

    engine: wasmtime.Engine
    interruptible: bool

    def load_guest(self, source: ModuleSource) -> Guest:
        """The compiled guest."""

    def run(self, module: ModuleSource, args: Sequence[str] = (), options: RunOptions | None = None) -> int:
        """Run one instance in a Store of its own; its exit code."""

    def cancel_all(self) -> None:
        """Stop every inference in flight."""

    def expect_guests(self, count: int) -> None:
        """``count`` guests will compute at once: models loaded from now on start with room for them."""


class EpochTicker:
    """Advances an engine's epoch every :data:`TICK_SECONDS`, so Stores check their stop in time."""

    def __init__(self, engine: wasmtime.Engine) -> None:
        self._engine = engine
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="wasinn-epoch", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self._engine.increment_epoch()

    def stop(self) -> None:
        """Stop ticking."""
        self._stop.set()


@dataclass
class InstanceResult:
    """How one instance ended: its exit code, or the one-line error that stopped it."""

    code: int | None = None
    error: str | None = None


def exit_status(result: InstanceResult) -> tuple[int, str | None]:
    """The exit code of a finished instance and, for a trap or a host error, its one-line message."""
    if result.error is None:
        return result.code or 0, None
    return (EXIT_TRAP if "trapped" in result.error else EXIT_USAGE), result.error


def _run_one(
    nn: GuestHost,
    module: ModuleSource,
    args: Sequence[str],
    options: RunOptions,
    result: InstanceResult,
    ended: threading.Event,
) -> None:
    try:
        result.code = nn.run(module, args, options)
    except GuestError as exc:
        result.error = str(exc)
    except Exception as exc:  # a host bug: a one-line error and a failed exit code, never a silent 0
        result.error = f"internal error: {type(exc).__name__}: {exc}"
    finally:
        ended.set()


def run_instances(
    nn: GuestHost,
    module: ModuleSource,
    args: Sequence[str],
    options: RunOptions,
    instances: int = 1,
    timeout: float | None = None,
    timeout_name: str = "timeout",
) -> list[InstanceResult]:
    """Run ``instances`` copies of the module at once and wait; ``timeout`` seconds stop them (a trap
    each, whose message names the limit as ``timeout_name``: ``--timeout`` for the command line), and
    Ctrl-C interrupts all of them (KeyboardInterrupt is raised once they have stopped)."""
    compiled = nn.load_guest(module)
    nn.expect_guests(instances)
    stop = GuestStop(timeout, timeout_name)
    ticker = EpochTicker(nn.engine) if nn.interruptible else None
    options = replace(options, stop=stop)
    if instances > 1 and options.listeners is None:  # a server guest's N instances listen on one address
        options = replace(options, listeners=ListenerGroup())
    lock = threading.Lock()
    forwarders: list[PipeCopier] = []
    results = [InstanceResult() for _ in range(instances)]
    # Each instance's end, waited on instead of Thread.join: on Python 3.11, a Ctrl-C inside join can
    # mark a running thread as ended (threading's bpo-45274 handling), and the host's last line would
    # then race the guest's last writes.
    ended = [threading.Event() for _ in range(instances)]
    threads = []
    for index in range(instances):
        instance_options = options
        if instances > 1:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            forwarders += [PipeCopier(out_r, sys.stdout.buffer, lock), PipeCopier(err_r, sys.stderr.buffer, lock)]
            instance_options = replace(
                options,
                stdout=f"/dev/fd/{out_w}",
                stderr=f"/dev/fd/{err_w}",
                stdin=options.stdin or os.devnull,
                close_fds=(out_w, err_w),
            )
        thread = threading.Thread(
            target=_run_one,
            name=f"wasinn-guest-{index}",
            args=(nn, compiled, args, instance_options, results[index], ended[index]),
            daemon=True,
        )
        threads.append(thread)
    timed_out: list[int] = []
    try:
        for thread in threads:
            thread.start()
        for done in ended:
            while not done.wait(0.05):
                if stop.expired and not timed_out:
                    timed_out = [i for i, e in enumerate(ended) if not e.is_set()]
                    nn.cancel_all()  # guests blocked in inference past their deadline
    except KeyboardInterrupt:
        stop.interrupt()
        nn.cancel_all()
        for thread, done in zip(threads, ended):
            if thread.ident is not None:  # started
                done.wait(5.0)
        raise
    finally:
        for forwarder in forwarders:
            forwarder.finish()
        for forwarder in forwarders:
            forwarder.join()
        if ticker:
            ticker.stop()
    for index in timed_out:  # stopped by the time limit, however the guest ended once its compute failed
        if results[index].error is None:
            results[index] = InstanceResult(error=f"the guest trapped: {stop.reason()}")
    return results
