"""Running one guest in a Store of its own: WASI set up as ``wasinn run`` does, ``_start`` or
``wasi:cli/run`` called, the exit code or a one-line :class:`GuestError` back.

The host (:class:`~wasinn_host.WasiNN`) provides the linkers with the front ends on them and the
per-Store state (:class:`LinkingHost`); this module owns the Store: its WASI configuration, its
stop (:class:`~wasinn_host.launch.guest_stop.GuestStop`), its stdout (whose ``stream-stdout``
pieces go in order with the guest's own writes), and closing it when the guest ends.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

import wasmtime
import wasmtime.component

from ..core.thread_policy import background
from ..guest.stdout import GuestStdout, PieceSink
from ..guest.wasm_errors import first_line
from ..sockets.shared import ListenerGroup
from .guest_load import Guest, GuestError, ModuleSource
from .guest_stop import GuestStop
from .import_check import check_imports

RUN_INTERFACE = "wasi:cli/run@0.2.0"


@dataclass
class RunOptions:
    """What ``wasinn run`` passes to a guest besides its arguments."""

    env: Mapping[str, str] = field(default_factory=dict)
    dirs: Sequence[tuple[str, str]] = ()
    """(host path, guest path) pairs to preopen."""
    stdin: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    """File paths for the guest's stdio; None inherits the host's.  The guest's ``stream-stdout`` pieces
    go to its stdout, in order with its own writes."""
    program_name: str | None = None
    stop: GuestStop | None = None
    """Traps the guest at its time limit or on an interrupt (needs ``WasiNN(interruptible=True)`` and
    something advancing the engine's epoch, as :func:`wasinn_host.launch.runner.run_instances` does)."""
    close_fds: tuple[int, ...] = ()
    """Host file descriptors to close when the guest ends (pipe ends given as /dev/fd/N)."""
    listeners: ListenerGroup | None = None
    """Shared by the runs of one server guest, lets them listen on one address (one stream socket
    bound once, every instance accepting on it); :func:`wasinn_host.launch.runner.run_instances` gives its
    instances one.  ``None``: the guest's binds are its own."""


class LinkingHost(Protocol):
    """What running a guest needs from the host: its engine, linkers with the imports, per-Store state."""

    engine: wasmtime.Engine
    interruptible: bool

    def module_linker(self, module: wasmtime.Module) -> wasmtime.Linker:
        """A Linker with WASI, ``wasi_ephemeral_nn`` and what else ``module`` imports."""

    def component_linker(self) -> wasmtime.component.Linker:
        """The Linker with wasi:cli and wasi:nn every component runs with."""

    def attach(
        self,
        store: wasmtime.Store,
        allowed_models: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink | None = None,
        listeners: ListenerGroup | None = None,
    ) -> None:
        """Give ``store`` its per-Store state."""

    def detach(self, store: wasmtime.Store) -> None:
        """Free ``store``'s per-Store state."""

    def cancel_store(self, store: wasmtime.Store) -> None:
        """Stop the inference ``store``'s guest waits in (and its socket waits)."""


_CHECKED: weakref.WeakSet[wasmtime.Linker] = weakref.WeakSet()
"""Linkers whose module's imports were checked (:func:`.import_check.check_imports`)."""


def run_guest(
    host: LinkingHost, compiled: Guest, module: ModuleSource, args: Sequence[str], options: RunOptions
) -> int:
    """Instantiate ``compiled`` (named ``module`` in its argv) with WASI and WASI-NN, run it, return its
    exit code; :class:`GuestError` if it cannot be linked or instantiated, or traps.  The calling
    thread runs it as batch work (:func:`~wasinn_host.core.thread_policy.background`)."""
    try:
        stdout = GuestStdout(options.stdout)
    except OSError as exc:
        raise GuestError(f"cannot open the guest's stdout {options.stdout!r}: {exc.strerror or exc}") from None
    try:
        with background():  # the guest's wake-ups do not preempt llama.cpp's threads (core/thread_policy.py)
            return _run_in_store(host, compiled, module, args, options, stdout)
    finally:
        stdout.close()  # after the Store: everything the guest and its pieces wrote is in place


def _run_in_store(
    host: LinkingHost,
    compiled: Guest,
    module: ModuleSource,
    args: Sequence[str],
    options: RunOptions,
    stdout: GuestStdout,
) -> int:
    store = wasmtime.Store(host.engine)
    stop_hook: tuple[Any, ...] = ()
    if host.interruptible:
        if options.stop is not None:
            stop_hook = options.stop.install(store)
        else:
            store.set_epoch_deadline(2**62)
    store.set_wasi(_wasi_config(module, args, options, stdout))
    host.attach(store, dirs=options.dirs, stdout=stdout.write, listeners=options.listeners)
    if options.stop is not None:
        options.stop.watch(id(store), lambda: host.cancel_store(store))
    trap = None
    try:
        if isinstance(compiled, wasmtime.component.Component):
            return _run_component(host, store, compiled)
        return _run_module(host, store, compiled)
    except wasmtime.ExitTrap as exit_trap:
        return exit_trap.code
    except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
        trap = first_line(exc)
    finally:
        if options.stop is not None:
            options.stop.unwatch(id(store))
        host.detach(store)
        store.close()  # now, not when a traceback lets go of it: the guest's files (pipes) close here
        del stop_hook
        for fd in options.close_fds:
            os.close(fd)
    raise GuestError(f"the guest trapped: {trap}")


def _run_module(host: LinkingHost, store: wasmtime.Store, module: wasmtime.Module) -> int:
    """Run a command module: WASI preview 1 and ``wasi_ephemeral_nn``, then ``_start``."""
    linker = host.module_linker(module)
    if linker not in _CHECKED:  # a host keeps one Linker per module: its imports are checked once
        check_imports(linker, store, module)
        _CHECKED.add(linker)
    try:
        instance = linker.instantiate(store, module)
    except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
        raise GuestError(f"cannot instantiate the module: {first_line(exc)}") from None
    start = instance.exports(store).get("_start")
    if not isinstance(start, wasmtime.Func):
        raise GuestError("the module has no _start function (is it a WASI command?)")
    start(store)
    return 0


def _run_component(host: LinkingHost, store: wasmtime.Store, component: wasmtime.component.Component) -> int:
    """Run a command component: wasi:cli (``add_wasip2``) and wasi:nn, then ``wasi:cli/run``."""
    try:
        instance = host.component_linker().instantiate(store, component)
    except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
        from ..wit.versions import unserved_message  # only here: the wit package loads on first use

        unserved = unserved_message(component.type.imports(host.engine))
        raise GuestError(f"cannot instantiate the component: {unserved or first_line(exc)}") from None
    interface = instance.get_export_index(store, RUN_INTERFACE)
    index = instance.get_export_index(store, "run", interface) if interface is not None else None
    run = instance.get_func(store, index) if index is not None else None
    if run is None:
        raise GuestError(f"the component does not export {RUN_INTERFACE} (is it a command?)")
    result = run(store)
    return 0 if result is None or getattr(result, "tag", "ok") == "ok" else 1


def _wasi_config(
    module: ModuleSource, args: Sequence[str], options: RunOptions, stdout: GuestStdout
) -> wasmtime.WasiConfig:
    wasi = wasmtime.WasiConfig()
    name = options.program_name or (str(module) if isinstance(module, (str, os.PathLike)) else "guest.wasm")
    wasi.argv = [name, *args]
    wasi.env = list(options.env.items())
    for host_dir, guest_dir in options.dirs:
        wasi.preopen_dir(host_dir, guest_dir)
    if options.stdin is None:
        wasi.inherit_stdin()
    else:
        wasi.stdin_file = options.stdin
    stdout.configure(wasi)
    if options.stderr is None:
        wasi.inherit_stderr()
    else:
        wasi.stderr_file = options.stderr
    return wasi
