"""``wasi:logging/logging`` ``log``: WasmEdge's logging plugin, which newer LlamaEdge builds import.

``log(level, context_ptr, context_len, message_ptr, message_len)`` with levels trace 0, debug 1,
info 2, warn 3, error 4, critical 5.  As in WasmEdge, the context ``stdout`` or ``stderr`` writes
the message there as a line; any other context goes to the host's log (logger
``wasinn_host.guest``) at the matching level.  A bad pointer or length is one log line.
"""

from __future__ import annotations

import logging
import sys

import wasmtime

MODULE = "wasi:logging/logging"
NAME = "log"
guest_log = logging.getLogger("wasinn_host.guest")
_LEVELS = (logging.DEBUG, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)


def imports_logging(module: wasmtime.Module) -> bool:
    """Whether ``module`` imports ``wasi:logging/logging`` ``log``."""
    return any(imp.module == MODULE and imp.name == NAME for imp in module.imports)


def add_logging_to_linker(linker: wasmtime.Linker) -> None:
    """Define ``wasi:logging/logging`` ``log`` on ``linker``."""
    i32 = wasmtime.ValType.i32()
    linker.define_func(MODULE, NAME, wasmtime.FuncType([i32] * 5, []), _log, access_caller=True)


def _log(caller: wasmtime.Caller, level: int, ctx_ptr: int, ctx_len: int, msg_ptr: int, msg_len: int) -> None:
    memory = caller.get("memory")
    if not isinstance(memory, wasmtime.Memory):
        guest_log.warning("wasi:logging/logging.log: the calling module exports no memory")
        return
    size = memory.data_len(caller)
    ctx_ptr, ctx_len, msg_ptr, msg_len = (v & 0xFFFF_FFFF for v in (ctx_ptr, ctx_len, msg_ptr, msg_len))
    if ctx_ptr + ctx_len > size or msg_ptr + msg_len > size:
        guest_log.warning("wasi:logging/logging.log: the context or message is outside the guest memory")
        return
    context = bytes(memory.read(caller, ctx_ptr, ctx_ptr + ctx_len)).decode("utf-8", "replace")
    message = bytes(memory.read(caller, msg_ptr, msg_ptr + msg_len)).decode("utf-8", "replace")
    if context in ("stdout", "stderr"):
        stream = sys.stdout if context == "stdout" else sys.stderr
        stream.write(message + "\n")
        stream.flush()
        return
    level_no = _LEVELS[level] if 0 <= level < len(_LEVELS) else logging.INFO
    guest_log.log(level_no, "%s%s", f"{context}: " if context else "", message)
