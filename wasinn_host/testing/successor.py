"""The successor model's table, for tests and benchmarks: re-exported from :mod:`wasinn_host.backend.successor`,
where the fake runtime (:mod:`wasinn_host.backend.fake`) that computes it lives."""

from __future__ import annotations

from ..backend.successor import *  # noqa: F403
from ..backend.successor import __all__ as __all__
