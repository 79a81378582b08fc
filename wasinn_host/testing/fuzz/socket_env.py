"""The socket fuzzer's run: its statistics, the log it checks, and the layer, probes and peers its examples share."""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

import wasmtime

from wasinn_host.sockets import SocketLayer, SocketPolicy
from wasinn_host.sockets.policy import parse_rules
from wasinn_host.testing.fuzz.socket_peers import CallWatch, Peers
from wasinn_host.testing.fuzz.socket_values import MEMORY_PAGES
from wasinn_host.testing.socket_probe import probe_wat


@dataclass
class SocketFuzzStats:
    """What the fuzzer did: calls per import and errno, examples, cancels, wasmtime's traps, time."""

    calls: int = 0
    examples: int = 0
    cancels: int = 0
    nudged: int = 0
    wasmtime_traps: int = 0
    warnings: int = 0
    by_import: collections.Counter[str] = field(default_factory=collections.Counter)
    by_import_errno: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    slowest: dict[str, float] = field(default_factory=dict)

    def record(self, name: str, rc: int, seconds: float) -> None:
        """Count one call's return code and time."""
        self.calls += 1
        self.by_import[name] += 1
        self.by_import_errno[(name, rc)] += 1
        self.slowest[name] = max(seconds, self.slowest.get(name, 0.0))

    def report(self) -> str:
        """A summary of the calls made."""
        lines = [
            f"calls: {self.calls} in {self.examples} examples; {self.warnings} logged a line, {self.nudged} "
            f"waited for the peers, {self.cancels} were cancelled (example ended), {self.wasmtime_traps} "
            "trapped in wasmtime's own functions (not a socket)"
        ]
        for name in sorted(self.by_import):
            per = " ".join(f"{rc}:{n}" for (imp, rc), n in sorted(self.by_import_errno.items()) if imp == name)
            lines.append(f"  {name:20s} {self.by_import[name]:6d}  {per}  (slowest {self.slowest[name] * 1000:.0f} ms)")
        return "\n".join(lines)


class LogWatcher(logging.Handler):
    """The host's log records at WARNING and above, per call."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record."""
        self.records.append(record)

    def take(self) -> list[logging.LogRecord]:
        """The records since the last call (and forget them)."""
        out, self.records = self.records, []
        return out


@dataclass
class SocketFuzzEnv:
    """One engine, socket layer, pair of compiled probes and set of peers shared by a run's examples."""

    layer: SocketLayer
    modules: dict[str, wasmtime.Module]
    peers: Peers
    watch: CallWatch
    stats: SocketFuzzStats = field(default_factory=SocketFuzzStats)
    logs: LogWatcher = field(default_factory=LogWatcher)

    def close(self) -> None:
        """End the watcher and close the peers."""
        self.watch.close()
        self.peers.close()


def make_env(*, cancel_after: float = 0.4, hard_after: float = 60.0) -> SocketFuzzEnv:
    """A socket layer whose guests may bind loopback (the default) and connect to loopback only, and
    resolve names only numerically (no DNS: ``resolve_names`` off despite the connect rules)."""
    engine = wasmtime.Engine()
    policy = SocketPolicy(connect=tuple(parse_rules("127.0.0.1") + parse_rules("::1")), resolve_names=False)
    layer = SocketLayer(engine, policy)
    modules = {v: wasmtime.Module(engine, probe_wat(v, MEMORY_PAGES)) for v in ("v1", "v2")}
    peers = Peers()
    watch = CallWatch(peers, nudge_after=0.05, cancel_after=cancel_after, hard_after=hard_after)
    return SocketFuzzEnv(layer, modules, peers, watch)
