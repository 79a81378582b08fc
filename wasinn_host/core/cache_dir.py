"""Where wasinn-host keeps what it works out once per machine: compiled guests, the CPU probe's verdict."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/wasinn``, else ``~/.cache/wasinn``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "wasinn"
