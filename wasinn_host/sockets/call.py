"""What one socket host call works with: the Store's state, its memory and the way back to WASI."""

from __future__ import annotations

import wasmtime

from .guest_view import GuestView
from .passthrough import PassThrough, caller_object
from .policy import SocketPolicy
from .table import SocketState


class Call:
    """One call of a socket function by a guest."""

    __slots__ = ("state", "view", "policy", "_caller", "_trampoline", "_wasi_linker")

    def __init__(
        self,
        state: SocketState,
        view: GuestView,
        policy: SocketPolicy,
        caller: int,
        trampoline: wasmtime.Module,
        wasi_linker: wasmtime.Linker,
    ) -> None:
        self.state = state
        self.view = view
        self.policy = policy
        self._caller = caller
        self._trampoline = trampoline
        self._wasi_linker = wasi_linker

    def passthrough(self, name: str, *args: int) -> int:
        """Run wasmtime's own WASI ``name`` (for a descriptor that is not a socket)."""
        caller = caller_object(self._caller)
        try:
            if self.state.passthrough is None:
                self.state.passthrough = PassThrough(caller, self._trampoline, self._wasi_linker)
            result: int = self.state.passthrough.call(caller, name, *args)
            return result
        finally:
            caller._invalidate()
