"""The errno a socket call's exception gives the guest, and its one log line.

Every exception a socket function raises ends in :func:`errno_for` (called by the handler of
:mod:`.linking`), so no argument a guest passes can make the host trap it; only a
:class:`~wasinn_host.guest.native_func.GuestTrap` (the host stopping the guest, or a trap in
wasmtime's own function for a descriptor that is not a socket) traps, and the handler re-raises
that before it gets here.

* :class:`~.table.SockError`: its errno; its message, if any (a bad argument, saying what was wrong
  and what is accepted), is the one WARNING line.  No message: nothing is logged (``AGAIN`` on a
  non-blocking socket is the guest's business, not news).
* :class:`~.policy.Refused`: ``ACCES`` and the policy's line.
* ``OSError`` from the host socket: the host's errno in WASI's numbering, one DEBUG line (a peer
  that reset, a port in use: what a guest on WasmEdge would see from the OS too).
* Anything else is a host bug a guest reached: the guest gets the errno nearest the exception's
  class (``OverflowError`` -> ``OVERFLOW``, ``ValueError`` and ``struct.error`` -> ``INVAL``,
  ``MemoryError`` -> ``NOMEM``, else ``IO``) and goes on; the log gets one ERROR line naming the
  call, its arguments, the exception and where it was raised, so the bug is seen and fixed.
"""

from __future__ import annotations

import logging
import struct
import traceback

from .constants import WasiErrno, errno_from_os
from .passthrough import WASI
from .policy import Refused
from .table import SockError

log = logging.getLogger("wasinn_host")


def errno_for(name: str, args: tuple[int, ...], exc: Exception) -> int:
    """The errno for ``exc`` raised by socket function ``name`` called with ``args``; logs at most one line."""
    if isinstance(exc, SockError):
        if exc.message:
            log.warning("%s (errno %d %s)", exc.message, exc.errno, exc.errno.name)
        return int(exc.errno)
    if isinstance(exc, Refused):
        log.warning("%s", exc)
        return int(WasiErrno.ACCES)
    if isinstance(exc, OSError) and exc.errno is not None:
        code = errno_from_os(exc.errno)
        log.debug("%s on %d: %s (%s)", name, args[0] if args else -1, exc.strerror, code.name)
        return int(code)
    code = unexpected_errno(exc)
    log.error(
        "%s.%s%s: unexpected %s: %s at %s; the guest gets errno %d %s (a host bug: please report it)",
        WASI,
        name,
        tuple(args),
        type(exc).__name__,
        _one_line(str(exc)),
        _where(exc),
        code,
        code.name,
    )
    return int(code)


def unexpected_errno(exc: BaseException) -> WasiErrno:
    """The errno nearest an exception no socket function was meant to raise."""
    if isinstance(exc, OverflowError):
        return WasiErrno.OVERFLOW
    if isinstance(exc, (ValueError, struct.error)):
        return WasiErrno.INVAL
    if isinstance(exc, MemoryError):
        return WasiErrno.NOMEM
    return WasiErrno.IO


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
