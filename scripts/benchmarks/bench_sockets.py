"""Benchmark: the socket layer's cost per keep-alive HTTP request.

Runs ``guest_examples/socket_server.wasm`` through :class:`wasinn_host.WasiNN` (in this process)
and sends ``GET /health`` on one keep-alive connection with ``http.client`` from another process.  Prints, as the
median of ``--runs`` runs of ``--requests`` requests:

* **latency**: milliseconds per request end to end (client, guest, socket layer; target <= 1 ms);
* **layer**: milliseconds per request spent in the socket layer's host functions, not counting
  the time ``poll_oneoff``/blocking calls wait for the network (the layer's own overhead);
* **calls**: socket-layer host calls per request.

Usage: ``python scripts/benchmarks/bench_sockets.py [--requests 500] [--runs 5]``
"""

from __future__ import annotations

import argparse
import functools
import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from wasinn_host import RunOptions, WasiNN
from wasinn_host.sockets import linking
from wasinn_host.sockets.table import SocketState

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "guest_examples" / "socket_server.wasm"


CLIENT = """
import http.client, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
conn.request("GET", "/health"); conn.getresponse().read()
n = int(sys.argv[2]); started = time.perf_counter()
for _ in range(n):
    conn.request("GET", "/health"); conn.getresponse().read()
print((time.perf_counter() - started) / n * 1000)
"""
"""The client, in its own process (in this one it would contend with the guest for the GIL)."""


class Meter:
    """Time in socket-layer calls, minus time spent waiting."""

    def __init__(self) -> None:
        self.calls = 0
        self.busy = 0.0
        self.waiting = 0.0

    def wrap_calls(self) -> None:
        for variants in linking.VARIANTS.values():
            for arity, impl in list(variants.items()):
                variants[arity] = self._timed(impl)
        wait = SocketState.wait

        def timed_wait(state: SocketState, interests: list[tuple[int, int]], timeout: float | None) -> dict[int, int]:
            started = time.perf_counter()
            try:
                return wait(state, interests, timeout)
            finally:
                self.waiting += time.perf_counter() - started

        SocketState.wait = timed_wait  # type: ignore[method-assign,assignment]

    def _timed(self, impl: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(impl)
        def timed(*args: Any) -> int:
            started = time.perf_counter()
            try:
                return impl(*args)
            finally:
                self.calls += 1
                self.busy += time.perf_counter() - started

        return timed

    def reset(self) -> None:
        self.calls, self.busy, self.waiting = 0, 0.0, 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    meter = Meter()
    meter.wrap_calls()  # before the layer defines its functions
    nn = WasiNN()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        thread = threading.Thread(
            target=nn.run, args=(SERVER, ["default", "127.0.0.1", "0"], RunOptions(stdout=str(out))), daemon=True
        )
        thread.start()
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text().endswith("\n")):
            if time.monotonic() > deadline:
                print("the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.02)
        port = int(out.read_text().split(":")[1])
        latencies, layer, calls = [], [], []
        for _ in range(args.runs):
            meter.reset()
            client = subprocess.run(
                [sys.executable, "-c", CLIENT, str(port), str(args.requests)],
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            )
            latencies.append(float(client.stdout))
            layer.append((meter.busy - meter.waiting) / args.requests * 1000)
            calls.append(meter.calls / args.requests)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/quit")
        conn.getresponse().read()
        thread.join(30)
    print(
        f"latency: {statistics.median(latencies):.3f} ms per keep-alive request (runs: "
        + ", ".join(f"{x:.3f}" for x in latencies)
        + ")"
    )
    print(f"layer:   {statistics.median(layer):.3f} ms per request in socket host calls, waits excluded")
    print(f"calls:   {statistics.median(calls):.1f} socket-layer host calls per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
