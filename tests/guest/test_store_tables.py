"""The Stores' handle tables: a Store whose idle contexts cannot be reaped (a bug in its front end) is
logged and left, and every other Store's idle contexts are reaped all the same."""

from __future__ import annotations

import logging

import pytest
import wasmtime

from wasinn_host.core.config.limits import Limits
from wasinn_host.guest.store_tables import StoreTable

pytestmark = pytest.mark.fast


class State:
    """A Store's state that counts its reaps, or fails them."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.reaped = 0

    def close(self) -> None:
        pass

    def reap_idle(self, idle_seconds: float) -> int:
        if self.fails:
            raise RuntimeError("a bug in this front end's reaping")
        self.reaped += 1
        return 0


def test_a_store_whose_reaping_fails_leaves_the_others_reaped(caplog: pytest.LogCaptureFixture) -> None:
    table: StoreTable[State] = StoreTable(Limits(), "execution contexts", "not attached")
    engine = wasmtime.Engine()
    stores = [wasmtime.Store(engine) for _ in range(3)]
    states = [table.put(store, State(fails=i == 1)) for i, store in enumerate(stores)]
    with caplog.at_level(logging.ERROR, logger="wasinn_host"):
        table.reap_idle()
    assert [s.reaped for s in states] == [1, 0, 1]
    assert [r.message for r in caplog.records] == ["reaping a Store's idle execution contexts failed"]
    for store in stores:
        table.detach(store)
