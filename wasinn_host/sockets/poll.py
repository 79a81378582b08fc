"""``poll_oneoff`` when a subscription names a socket: sockets, clocks and other descriptors at once.

Without a socket among the subscriptions the call goes to wasmtime's own ``poll_oneoff``.
With one, the host waits: socket readiness through the host's ``poll`` (plus the Store's wake
descriptor, so Ctrl-C ends the wait), clocks as deadlines (relative, or absolute on the
guest's own realtime or monotonic clock), and other descriptors (stdin, files) by asking
wasmtime without blocking every :data:`OTHER_FD_PERIOD` seconds: their subscriptions are
checked by a ``poll_oneoff`` on the guest's own array, in which the socket and clock entries
are turned into zero timeouts for that one call and restored at once.
"""

from __future__ import annotations

import fcntl
import select
import struct
import termios
import time
from dataclasses import dataclass
from typing import AbstractSet

from .call import Call
from .constants import (
    CLOCK_MONOTONIC,
    CLOCK_REALTIME,
    EVENT_SIZE,
    EVENTRWFLAGS_HANGUP,
    EVENTTYPE_CLOCK,
    EVENTTYPE_FD_READ,
    EVENTTYPE_FD_WRITE,
    SUBCLOCKFLAGS_ABSTIME,
    SUBSCRIPTION_SIZE,
    WasiErrno,
)
from .table import SockError

OTHER_FD_PERIOD = 0.01
"""How often other descriptors are checked while sockets are waited on (seconds)."""
_EVENT = struct.Struct("<QHBxxxxxQH6x")
_HEAD = struct.Struct("<QB")
_CLOCK = struct.Struct("<I4xQQH")
_FD = struct.Struct("<I")
_FIONREAD = bytes(4)


@dataclass
class Subscription:
    """One parsed subscription."""

    userdata: int
    tag: int
    fd: int = 0
    clock_id: int = 0
    timeout: int = 0
    flags: int = 0
    deadline: float = 0.0
    """For a clock: when it fires, on ``time.monotonic()``."""
    error: int = 0


def poll_oneoff(call: Call, in_ptr: int, out_ptr: int, count: int, nevents_ptr: int) -> int:
    """``poll_oneoff(*in, *out, n, *nevents)``."""
    view = call.view
    if count == 0:
        raise SockError(WasiErrno.INVAL)
    # The arrays are checked at their full size, in Python's unbounded integers: 2**28 subscriptions
    # (12 GiB) is FAULT, as in WasmEdge (whose span check is 64-bit), never a length that wrapped to 0.
    raw = view.read(in_ptr, SUBSCRIPTION_SIZE * count, f"{count} subscriptions")
    view.address(out_ptr, EVENT_SIZE * count, f"{count} events")
    view.address(nevents_ptr, 4, "nevents")
    subs = [_parse(raw, SUBSCRIPTION_SIZE * i) for i in range(count)]
    recent = set(call.state.accepted)  # shared listeners it took a connection from since its last poll
    call.state.accepted.clear()  # ... which may hand it another from now on (see .shared)
    entries = call.state.entries
    if not any(sub.tag != EVENTTYPE_CLOCK and sub.fd in entries for sub in subs):
        return call.passthrough("poll_oneoff", in_ptr, out_ptr, count, nevents_ptr)
    events = _set_deadlines(call, subs, out_ptr)
    valid = [sub for sub in subs if not sub.error]
    sockets = [sub for sub in valid if sub.tag != EVENTTYPE_CLOCK and sub.fd in entries]
    others = [sub for sub in valid if sub.tag != EVENTTYPE_CLOCK and sub.fd not in entries]
    if others and (in_ptr % 8 or out_ptr % 8 or nevents_ptr % 4):
        # wasmtime is asked about its own descriptors on the guest's arrays, and traps on misaligned
        # ones (WASI's pointers are aligned to their types); WasmEdge would not mind, so no trap here
        raise SockError(
            WasiErrno.INVAL,
            f"poll_oneoff: subscriptions at {in_ptr}, events at {out_ptr} and nevents at {nevents_ptr} must be "
            "aligned to 8, 8 and 4 bytes to wait on sockets and other descriptors together",
        )
    clocks = [sub for sub in valid if sub.tag == EVENTTYPE_CLOCK]
    while not events:
        now = time.monotonic()
        timeout = min((sub.deadline - now for sub in clocks), default=None)
        if others:
            timeout = OTHER_FD_PERIOD if timeout is None else min(timeout, OTHER_FD_PERIOD)
        events += _socket_events(call, sockets, timeout, recent)
        if others:
            events += _other_events(call, raw, subs, in_ptr, out_ptr, count, nevents_ptr)
        now = time.monotonic()
        events += [_EVENT.pack(sub.userdata, 0, EVENTTYPE_CLOCK, 0, 0) for sub in clocks if sub.deadline <= now]
    view.write(out_ptr, b"".join(events), "events")
    view.put_u32(nevents_ptr, len(events), "nevents")
    return 0


def _parse(raw: bytes, offset: int) -> Subscription:
    userdata, tag = _HEAD.unpack_from(raw, offset)
    if tag == EVENTTYPE_CLOCK:
        clock_id, timeout, _precision, flags = _CLOCK.unpack_from(raw, offset + 16)
        return Subscription(userdata, tag, clock_id=clock_id, timeout=timeout, flags=flags)
    if tag in (EVENTTYPE_FD_READ, EVENTTYPE_FD_WRITE):
        return Subscription(userdata, tag, _FD.unpack_from(raw, offset + 16)[0])
    return Subscription(userdata, tag, error=WasiErrno.INVAL)


def _set_deadlines(call: Call, subs: list[Subscription], out_ptr: int) -> list[bytes]:
    """Give every clock its deadline; return the error events of bad subscriptions."""
    errors: list[bytes] = []
    start = time.monotonic()
    for sub in subs:
        if sub.tag == EVENTTYPE_CLOCK and not sub.error:
            if sub.clock_id not in (CLOCK_REALTIME, CLOCK_MONOTONIC) or sub.flags & ~SUBCLOCKFLAGS_ABSTIME:
                sub.error = WasiErrno.INVAL  # as WasmEdge: an unknown clock or flag is that subscription's error
            else:
                # Any u64 timeout is valid in WASI: 25 days or u64::MAX ns (585 years) is a clock that
                # fires that late, not an error (WasmEdge arms a timer that far ahead).  The deadline is
                # a float and the wait is cut into pieces the host's poll can take (SocketState.wait).
                remaining = sub.timeout
                if sub.flags & SUBCLOCKFLAGS_ABSTIME:
                    remaining = sub.timeout - _guest_now(call, sub.clock_id, (out_ptr + 7) & ~7)
                sub.deadline = start + max(remaining, 0) / 1e9
        if sub.error:
            errors.append(_EVENT.pack(sub.userdata, sub.error, sub.tag & 0xFF, 0, 0))
    return errors


def _guest_now(call: Call, clock_id: int, scratch_ptr: int) -> int:
    """The guest's clock now (wasmtime's monotonic clock has its own origin), read through
    wasmtime's ``clock_time_get`` into the events area, which is written afterwards anyway (at an
    8-aligned address inside it: wasmtime traps on a misaligned timestamp pointer)."""
    if clock_id == CLOCK_REALTIME:
        return time.time_ns()
    code = call.passthrough("clock_time_get", clock_id, 1, scratch_ptr)
    if code != 0:
        raise SockError(WasiErrno.INVAL)
    return int(struct.unpack("<Q", call.view.read(scratch_ptr, 8, "events"))[0])


def _socket_events(
    call: Call, sockets: list[Subscription], timeout: float | None, recent: AbstractSet[int] = frozenset()
) -> list[bytes]:
    """The events of the ready socket subscriptions.  A shared listener (:mod:`.shared`) the Store took a
    connection from since its last poll is left out while another of its subscriptions is ready: the
    instance serves what it has, and the next waiting connection goes to an idle sibling."""
    masks: dict[int, int] = {}
    for sub in sockets:
        host_fd = call.state.entries[sub.fd].sock.fileno()
        masks[host_fd] = masks.get(host_fd, 0) | (select.POLLIN if sub.tag == EVENTTYPE_FD_READ else select.POLLOUT)
    ready = call.state.wait(list(masks.items()), timeout)
    events: list[bytes] = []
    entries = call.state.entries
    busy = bool(recent) and any(ready.get(entries[o.fd].sock.fileno()) for o in sockets if o.fd not in recent)
    for sub in sockets:
        host_fd = call.state.entries[sub.fd].sock.fileno()
        revents = ready.get(host_fd, 0)
        if busy and sub.fd in recent:
            continue
        wanted = select.POLLIN if sub.tag == EVENTTYPE_FD_READ else select.POLLOUT
        if not revents & (wanted | select.POLLHUP | select.POLLERR):
            continue
        hangup = EVENTRWFLAGS_HANGUP if revents & select.POLLHUP else 0
        nbytes = _readable_bytes(host_fd) if sub.tag == EVENTTYPE_FD_READ else 0
        events.append(_EVENT.pack(sub.userdata, 0, sub.tag, nbytes, hangup))
    return events


def _readable_bytes(host_fd: int) -> int:
    try:
        return int(struct.unpack("<i", fcntl.ioctl(host_fd, termios.FIONREAD, _FIONREAD))[0])
    except OSError:
        return 0  # a listening socket


def _other_events(
    call: Call, raw: bytes, subs: list[Subscription], in_ptr: int, out_ptr: int, count: int, nevents_ptr: int
) -> list[bytes]:
    """Ask wasmtime, without blocking, about the subscriptions on its own descriptors."""
    entries = call.state.entries
    patched = bytearray(raw)
    for index, sub in enumerate(subs):
        if sub.tag != EVENTTYPE_CLOCK and sub.fd not in entries and not sub.error:
            continue
        offset = SUBSCRIPTION_SIZE * index
        patched[offset : offset + SUBSCRIPTION_SIZE] = struct.pack(
            "<QB7xI4xQQH6x", sub.userdata, EVENTTYPE_CLOCK, CLOCK_MONOTONIC, 0, 0, 0
        )
    call.view.write(in_ptr, bytes(patched), "subscriptions")
    try:
        code = call.passthrough("poll_oneoff", in_ptr, out_ptr, count, nevents_ptr)
    finally:
        call.view.write(in_ptr, raw, "subscriptions")
    if code != 0:
        raise SockError(WasiErrno(code) if code in WasiErrno._value2member_map_ else WasiErrno.IO)
    count_out = call.view.u32(nevents_ptr, "nevents")
    out = call.view.read(out_ptr, EVENT_SIZE * min(count_out, count), "events")
    events = [out[i : i + EVENT_SIZE] for i in range(0, len(out), EVENT_SIZE)]
    return [event for event in events if event[10] != EVENTTYPE_CLOCK]
