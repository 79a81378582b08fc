"""Byte lists through the fast path, on ``guest_examples/components/lists.wat``: exact bytes both ways,
the largest list wasmtime lets a guest pass, who frees the arrays we allocate, and what
``keep_list_heap`` changes."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap

import pytest
import wasmtime
import wasmtime.component as cm
from wasmtime import _ffi as ffi

from wasinn_host.guest import fast_calls
from wasinn_host.testing.guest_runs import GUESTS

LISTS_WAT = GUESTS / "components" / "lists.wat"
LARGEST_LIST_IN = 2_796_202
"""128 MiB (wasmtime's hostcall fuel) over 48 bytes (the ``Val`` wasmtime lifts each byte into)."""


class Lists:
    """An instance of ``lists.wat`` whose ``take`` records what it got and ``give`` answers ``payload``."""

    def __init__(self, payload: bytes = b"") -> None:
        self.payload = payload
        self.taken: list[bytes] = []
        engine = wasmtime.Engine()
        linker = cm.Linker(engine)
        with linker.root() as root, root.add_instance("host") as host:
            fast_calls.add_fast_func(host, "take", lambda _store, data: self.taken.append(data))
            fast_calls.add_fast_func(host, "give", lambda _store, n: memoryview(self.payload)[:n])
        self.store = wasmtime.Store(engine)
        self.instance = linker.instantiate(self.store, cm.Component(engine, LISTS_WAT.read_text()))

    def call(self, name: str, *args: int) -> None:
        """Call the export ``name``."""
        func = self.instance.get_func(self.store, name)
        assert func is not None
        func(self.store, *args)


@pytest.mark.parametrize("size", [0, 1, 255, 65_537, 1 << 20])
def test_bytes_cross_exactly_both_ways(size: int) -> None:
    payload = bytes((i * 7 + 3) & 0xFF for i in range(size))
    lists = Lists(payload)
    lists.call("give-take", size)  # the guest passes back exactly what the host gave it
    lists.call("take-n", 3, 2)  # memory from 0x100: the guest's zeroed pages
    assert lists.taken == [payload, b"\0\0\0", b"\0\0\0"]


def test_largest_list_a_guest_can_pass_to_the_host() -> None:
    lists = Lists()
    lists.call("take-n", LARGEST_LIST_IN, 1)
    assert [len(data) for data in lists.taken] == [LARGEST_LIST_IN]
    with pytest.raises(wasmtime.WasmtimeError, match="fuel allocated for hostcalls has been exhausted"):
        Lists().call("take-n", LARGEST_LIST_IN + 1, 1)
    # the other way has no such bound: 8 MiB reach the guest and come back (in pieces under the bound)
    big = Lists(bytes(range(256)) * (8 << 12))
    big.call("give-n", 8 << 20, 1)


def test_wasmtime_frees_our_malloc_arrays_with_glibc() -> None:
    assert fast_calls.rust_allocates_with_malloc() is True
    libc = fast_calls._glibc()
    assert libc is not None
    value = ffi.wasmtime_component_val_t()
    before = fast_calls._heap_in_use(libc)
    fast_calls.write_bytes(bytes(range(256)) * 4096, value)
    assert fast_calls._heap_in_use(libc) - before >= (1 << 20) * fast_calls.VAL_SIZE
    ffi.wasmtime_component_val_delete(ctypes.byref(value))  # Rust's drop, glibc's free
    assert abs(fast_calls._heap_in_use(libc) - before) < 64 << 10


def test_keep_list_heap_stops_the_page_faults() -> None:
    # process-wide, so in a process of its own: page faults per 1 MiB crossing in and out
    script = textwrap.dedent(
        """
        import json, resource, sys
        sys.path.insert(0, sys.argv[1])
        from test_component_lists import Lists
        from wasinn_host.guest import fast_calls

        lists = Lists(bytes(range(256)) * 4096)
        def faults():
            lists.call("give-take", 1 << 20)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(3):
                lists.call("give-take", 1 << 20)
            return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
        default = faults()
        kept = fast_calls.keep_list_heap()
        print(json.dumps([default, kept, faults()]))
        """
    )
    tests = str(GUESTS.parent / "tests" / "wit")
    out = subprocess.run([sys.executable, "-c", script, tests], capture_output=True, text=True, check=True).stdout
    default, kept, after = json.loads(out)
    assert kept is True
    assert default > 30_000  # 80 MB of fresh pages each way
    # what is left: the 1 MiB bytes object the host keeps (256 pages), or, where the address-space
    # layout keeps the heap from growing in place (about one process in eight), also the 48 MiB array
    assert after < default / 3
