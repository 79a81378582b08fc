"""The ``wasi:nn`` WIT versions this host serves, what differs between them, and the one-line refusal
of the others.

Three snapshots of WebAssembly/wasi-nn's ``wit/wasi-nn.wit`` are served, each shipped beside this
module (``wasi-nn.wit``, ``wasi-nn-0.2.0-rc-2024-08-19.wit``, ``wasi-nn-0.2.0-rc-2024-06-25.wit``).
Their ``tensor`` and ``graph`` interfaces are the same; two things differ:

* ``inference``: 2024-10-28 has ``compute(inputs: list<named-tensor>) -> result<list<named-tensor>,
  error>``; the two older ones have ``set-input(name, tensor)``, ``compute()`` and
  ``get-output(name)`` on the execution context instead;
* ``errors``: 2024-06-25 also lets a guest construct an ``error(code, data)``.

Every version is defined on the same host resources and functions (:mod:`.imports`): a component
gets the same models, batches and answers whichever one it was built against.  A component built for
another ``wasi:nn`` version fails to instantiate with wasmtime's account of a definition it could not
match (as 08-19 components did before they were served: "instance export `tensor` has the wrong
type"); :func:`unserved_message` says why in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class WitVersion:
    """One served ``wasi:nn`` version and the shape of its interfaces."""

    version: str
    set_input: bool
    """``inference`` has ``set-input``/``compute()``/``get-output`` (else ``compute(inputs)``)."""
    error_constructor: bool
    """``errors`` has ``[constructor]error(code, data)``."""

    def interface(self, name: str) -> str:
        """The full name of the interface ``name`` (``tensor``, ``errors``, ``inference``, ``graph``)."""
        return f"wasi:nn/{name}@{self.version}"


CURRENT = WitVersion("0.2.0-rc-2024-10-28", set_input=False, error_constructor=False)
SERVED = (
    CURRENT,
    WitVersion("0.2.0-rc-2024-08-19", set_input=True, error_constructor=False),
    WitVersion("0.2.0-rc-2024-06-25", set_input=True, error_constructor=True),
)
"""Newest first."""
SERVED_NAMES = ", ".join(v.version for v in SERVED)

_PREFIX = "wasi:nn/"


def nn_versions(import_names: Iterable[str]) -> list[str]:
    """The ``wasi:nn`` versions named by a component's import names, in order of first appearance
    (``""`` for an unversioned ``wasi:nn/...`` import)."""
    found: list[str] = []
    for name in import_names:
        if name.startswith(_PREFIX):
            version = name.partition("@")[2]
            if version not in found:
                found.append(version)
    return found


def unserved_message(import_names: Iterable[str]) -> str | None:
    """One line naming the ``wasi:nn`` version a component imports that this host does not serve
    (None when every ``wasi:nn`` import is of a served version)."""
    served = {v.version for v in SERVED}
    unserved = [v for v in nn_versions(import_names) if v not in served]
    if not unserved:
        return None
    named = " and ".join(f"wasi:nn@{v}" if v else "an unversioned wasi:nn" for v in unserved)
    return f"the component imports {named}, which this host does not serve (it serves wasi:nn {SERVED_NAMES})"
