"""Logging: the ``wasinn_host`` logger tree, JSON lines, and WasmEdge's log keys.

* ``wasinn_host``: the host's own events (one line per rejected call, model loads...).
  Records may carry ``event``, ``graph`` and ``context`` attributes (``extra=``).
* ``wasinn_host.llama``: llama.cpp's own log, routed through a callback; silent unless
  ``enable-log`` / ``enable-debug-log`` is set or the level is lowered explicitly.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import orjson

HOST_LOGGER = "wasinn_host"
LLAMA_LOGGER = "wasinn_host.llama"
SILENT = logging.CRITICAL + 10


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, event, graph, context, message."""

    def format(self, record: logging.LogRecord) -> str:
        """One record as one JSON line."""
        entry: dict[str, Any] = {
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", "llama.cpp" if record.name == LLAMA_LOGGER else "host"),
            "graph": getattr(record, "graph", None),
            "context": getattr(record, "context", None),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info).splitlines()[-1]
        return orjson.dumps(entry).decode()


def configure_logging(level: str = "WARNING", file: str | None = None, fmt: str = "text") -> None:
    """Send the host's log to stderr (or ``file``) as text or JSON lines (used by the CLI)."""
    handler: logging.Handler = logging.FileHandler(file) if file else logging.StreamHandler()
    handler.setFormatter(
        JsonLineFormatter() if fmt == "json" else logging.Formatter("wasinn: %(levelname)s: %(message)s")
    )
    host = logging.getLogger(HOST_LOGGER)
    for old in list(host.handlers):
        host.removeHandler(old)
    host.addHandler(handler)
    host.propagate = False
    host.setLevel(level)
    logging.getLogger(LLAMA_LOGGER).setLevel(logging.DEBUG if level == "DEBUG" else SILENT)


def apply_logging_keys(config: Any) -> None:
    """``enable-log`` makes the host and llama.cpp log at INFO, ``enable-debug-log`` at DEBUG."""
    keys = getattr(config, "logging", {}) or {}
    if keys.get("enable_debug_log"):
        wanted = logging.DEBUG
    elif keys.get("enable_log"):
        wanted = logging.INFO
    else:
        return
    for name in (HOST_LOGGER, LLAMA_LOGGER):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > wanted:
            logger.setLevel(wanted)


logging.getLogger(LLAMA_LOGGER).setLevel(SILENT)
