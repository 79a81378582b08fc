"""wasmtime-py's variant lowering made safe for guests running in several threads at once.

wasmtime-py (the pinned 50.x releases) lowers an untagged variant (an ``option``, a ``result``) by
filling a scratch set kept in a module global, ``wasmtime.component._types.case_test_cache``, with
the Python classes of a case and testing the value against them: clear, fill, test.  Guests run in
threads of their own, and the interpreter may switch threads between those steps; another thread's
clear then empties the set, the value matches no case, and a host function's answer fails with
``ValueError: value not valid for this variant`` (seen as an internal error in one of three Hayride
streams run at once, about one run in twenty).  wasmtime-py leaves thread safety to its embedders
(its issue 254); :func:`install` gives every thread a scratch set of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableSet

from wasmtime.component import _types


class PerThreadSet(MutableSet[type]):
    """A set whose contents each thread sees alone: what one thread adds or clears, no other sees."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _own(self) -> set[type]:
        own: set[type] | None = getattr(self._local, "items", None)
        if own is None:
            own = self._local.items = set()
        return own

    def __contains__(self, item: object) -> bool:
        return item in self._own()

    def __iter__(self) -> Iterator[type]:
        return iter(self._own())

    def __len__(self) -> int:
        return len(self._own())

    def add(self, value: type) -> None:
        """Add ``value`` to this thread's set."""
        self._own().add(value)

    def discard(self, value: type) -> None:
        """Remove ``value`` from this thread's set, if there."""
        self._own().discard(value)

    def clear(self) -> None:
        """Empty this thread's set (at once; MutableSet's own pops one by one)."""
        self._own().clear()


def install() -> bool:
    """Give each thread its own variant scratch set in wasmtime-py (once; later calls change nothing).
    Returns False where the installed wasmtime-py keeps no such set."""
    if not hasattr(_types, "case_test_cache"):
        return False
    if not isinstance(_types.case_test_cache, PerThreadSet):
        _types.case_test_cache = PerThreadSet()  # type: ignore[assignment]
    return True
