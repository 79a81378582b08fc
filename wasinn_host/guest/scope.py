"""What every front end knows of one guest besides its handles: its limits, the model names it may
load, its preopened directories, where its ``stream-stdout`` pieces go, the process's context count."""

from __future__ import annotations

from typing import Iterable, Sequence

from ..core.config.limits import Limits
from ..core.errors import ErrorKind, WasiNNError
from .piece_queue import PieceQueue
from .stdout import PieceSink, guarded, inherited_stdout
from .store_tables import ContextCounter


class GuestScope:
    """The base of a front end's per-Store state (and of an RPC session's scope); ``what`` names the
    guest's stdout in the one line logged if writing a piece there fails."""

    def __init__(
        self,
        limits: Limits,
        counter: ContextCounter,
        allowed: Iterable[str] | None = None,
        dirs: Sequence[tuple[str, str]] = (),
        stdout: PieceSink = inherited_stdout,
        what: str = "the guest's stdout",
    ) -> None:
        self.limits = limits
        self.stdout = PieceQueue(guarded(stdout, what))
        """Receives the ``stream-stdout`` pieces of this Store's computes (where its guest's stdout goes),
        written by the queue's own thread (:mod:`.piece_queue`)."""
        self.dirs = tuple(dirs)
        """The guest's preopened (host dir, guest dir) pairs: where its ``image`` and ``mmproj`` files may be."""
        self.allowed = frozenset(allowed) if allowed is not None else None
        self._counter = counter

    def check_name(self, name: str) -> None:
        """Refuse (not found) a model name this guest may not load."""
        if self.allowed is not None and name not in self.allowed:
            allowed = ", ".join(sorted(self.allowed)) or "(none)"
            raise WasiNNError(
                ErrorKind.NOT_FOUND, f"model name {name!r} is not allowed for this guest; allowed: {allowed}"
            )
