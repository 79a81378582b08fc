"""A Store's contexts spilled least recently named first: naming the same context again moves nothing
(a streaming guest names its context twice a token), and the order stays that of the names."""

from __future__ import annotations

from typing import Any, cast

import pytest

from wasinn_host.core.config.limits import Limits
from wasinn_host.ephemeral.handles import HandleTables
from wasinn_host.guest.store_tables import ContextCounter

pytestmark = pytest.mark.fast


class Held:
    """An execution context as the handle table sees it: spilled on request unless ``pinned``."""

    def __init__(self, pinned: bool = False) -> None:
        self.spilled = False
        self.pinned = pinned
        self.touched = 0.0

    def spill(self) -> bool:
        self.spilled = not self.pinned
        return self.spilled

    def forget_metadata(self) -> None:
        pass


def table(resident: int) -> HandleTables:
    tables = HandleTables(Limits(), ContextCounter())
    tables.resident_contexts = resident
    return tables


def opened(tables: HandleTables, context: Held) -> int:
    return tables.add_context(cast(Any, context))


def test_the_least_recently_named_context_is_spilled_even_when_named_twice_in_a_row() -> None:
    tables = table(2)
    a, b, c = Held(), Held(), Held()
    ha = opened(tables, a)
    tables.context(ha)
    opened(tables, b)  # opening names b, the guest's current context stays a
    tables.context(ha)  # a named again after b: b is now the least recently named
    tables.context(ha)
    opened(tables, c)
    assert (a.spilled, b.spilled, c.spilled) == (False, True, False)


def test_a_context_named_again_after_a_pinned_one_went_back_is_moved_again() -> None:
    tables = table(2)
    pinned, a, h, b = Held(pinned=True), Held(), Held(), Held()
    opened(tables, pinned)
    opened(tables, a)
    hh = opened(tables, h)  # over the limit: the pinned one cannot go and goes back after h; a goes
    assert a.spilled and not pinned.spilled
    tables.context(hh)  # h named again: it must move after the pinned one
    pinned.pinned = False
    opened(tables, b)  # over the limit: the least recently named goes: the formerly pinned one, not h
    assert pinned.spilled and not h.spilled and not b.spilled
