"""Soak: drive an OpenAI-compatible chat server with the ``openai`` client and watch a process.

Sends ``--sequential`` chat requests one after another from one client, then ``--clients`` clients
sending ``--per-client`` requests each at the same time, to ``http://HOST:PORT/v1``.  Prints, per
phase, the HTTP status counts (``connection-error`` for a request that got no answer), the latency
percentiles (ms), and, with ``--pid``, the resident memory and open descriptors of that process
(the server: ``wasinn run``) at the start, after ``--warmup`` requests, at the end and at their
highest, and the memory at every tenth of the phase (``rss_mib_every``).  "Flat" means the end is
within ``--rss-slack-mib`` / ``--fd-slack`` of the value after the warm-up.
Exit status 0 when every request got 200 (and, with ``--pid``, memory and descriptors
stayed flat), else 1.

Usage::

    pip install openai
    python scripts/benchmarks/soak_openai.py 127.0.0.1:8080 --pid SERVER_PID \\
        --sequential 10000 --clients 16 --per-client 50 [--model default] [--max-tokens 16]

The server is any OpenAI-compatible one, for example LlamaEdge's ``llama-api-server.wasm`` under
``wasinn run`` (docs/guides/sockets.md).  Run it on loopback; ``openai`` is not a dependency of the
package (``pip install openai``).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

PROMPTS = (
    "What is the capital of France?",
    "Count from one to five.",
    "Name a colour.",
    "Say hello.",
)


@dataclass
class Phase:
    """What one phase of the soak saw."""

    name: str
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies_ms: list[float] = field(default_factory=list)
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    """(requests done, RSS bytes, open descriptors) of the watched process."""
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, status: str, latency_ms: float, error: str = "") -> int:
        """Count one request; return how many this phase has done."""
        with self.lock:
            self.statuses[status] += 1
            self.latencies_ms.append(latency_ms)
            if error and len(self.errors) < 5:
                self.errors.append(error)
            return len(self.latencies_ms)


def process_usage(pid: int) -> tuple[int, int]:
    """(resident bytes, open descriptors) of ``pid`` from /proc."""
    rss = 0
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def openai_module() -> Any:
    """The ``openai`` package (not a dependency of this project: ``pip install openai``)."""
    try:
        return importlib.import_module("openai")
    except ImportError:
        sys.exit("soak_openai: the openai package is missing (pip install openai)")


def new_client(base_url: str, timeout: float) -> Any:
    """An ``openai.OpenAI`` client for ``base_url`` without retries (every failure is counted)."""
    return openai_module().OpenAI(base_url=base_url, api_key="soak", max_retries=0, timeout=timeout)


def chat_once(client: Any, model: str, prompt: str, max_tokens: int) -> tuple[str, str]:
    """One chat request: (status, error text)."""
    openai = openai_module()
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
        )
        raw.parse()
        return str(raw.status_code), ""
    except openai.APIStatusError as err:
        return str(err.status_code), str(err)[:200]
    except openai.APIConnectionError as err:
        return "connection-error", str(err)[:200]


def run_client(
    phase: Phase, base_url: str, args: argparse.Namespace, count: int, offset: int, start: threading.Barrier | None
) -> None:
    """Send ``count`` requests from one client, sampling the watched process every ``--sample-every``."""
    client = new_client(base_url, args.timeout)
    if start is not None:
        start.wait()
    for i in range(count):
        began = time.perf_counter()
        status, error = chat_once(client, args.model, PROMPTS[(offset + i) % len(PROMPTS)], args.max_tokens)
        done = phase.record(status, (time.perf_counter() - began) * 1000.0, error)
        if args.pid and done % args.sample_every == 0:
            phase.samples.append((done, *process_usage(args.pid)))
    client.close()


def run_phase(name: str, base_url: str, args: argparse.Namespace, clients: int, per_client: int) -> Phase:
    """``clients`` clients at once (one thread each), ``per_client`` requests each."""
    phase = Phase(name)
    if args.pid:
        phase.samples.append((0, *process_usage(args.pid)))
    began = time.perf_counter()
    if clients == 1:
        run_client(phase, base_url, args, per_client, 0, None)
    else:
        barrier = threading.Barrier(clients)
        threads = [
            threading.Thread(target=run_client, args=(phase, base_url, args, per_client, i, barrier))
            for i in range(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    phase.seconds = time.perf_counter() - began
    if args.pid:
        phase.samples.append((len(phase.latencies_ms), *process_usage(args.pid)))
    return phase


def summary(phase: Phase, warmup: int) -> dict[str, Any]:
    """The figures of one phase as a JSON-able dict."""
    lat = phase.latencies_ms
    out: dict[str, Any] = {
        "phase": phase.name,
        "requests": len(lat),
        "seconds": round(phase.seconds, 1),
        "statuses": dict(phase.statuses),
        "latency_ms": {
            "p50": round(percentile(lat, 0.50), 2),
            "p90": round(percentile(lat, 0.90), 2),
            "p99": round(percentile(lat, 0.99), 2),
            "max": round(max(lat, default=0.0), 2),
            "mean": round(statistics.fmean(lat), 2) if lat else 0.0,
        },
    }
    if phase.errors:
        out["first_errors"] = phase.errors
    if phase.samples:
        after = [s for s in phase.samples if s[0] >= warmup] or phase.samples[-1:]
        out["rss_mib"] = {
            "start": round(phase.samples[0][1] / 2**20, 1),
            "after_warmup": round(after[0][1] / 2**20, 1),
            "end": round(phase.samples[-1][1] / 2**20, 1),
            "max": round(max(s[1] for s in phase.samples) / 2**20, 1),
        }
        out["fds"] = {
            "start": phase.samples[0][2],
            "after_warmup": after[0][2],
            "end": phase.samples[-1][2],
            "max": max(s[2] for s in phase.samples),
        }
        step = max(1, len(lat) // 10)
        out["rss_mib_every"] = {s[0]: round(s[1] / 2**20, 1) for s in phase.samples if s[0] % step == 0}
    return out


def flat(report: dict[str, Any], rss_slack_mib: float, fd_slack: int) -> bool:
    """Whether memory and descriptors at the end are within the slack of their value after the warm-up."""
    rss, fds = report.get("rss_mib"), report.get("fds")
    if rss is None or fds is None:
        return True
    return bool(rss["end"] - rss["after_warmup"] <= rss_slack_mib and fds["end"] - fds["after_warmup"] <= fd_slack)


def main(argv: list[str] | None = None) -> int:
    """Run both phases, print one JSON report per phase; 0 if all were 200 and flat."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address", help="HOST:PORT of the server (http://HOST:PORT/v1)")
    parser.add_argument("--sequential", type=int, default=10_000, help="requests one after another (default 10000)")
    parser.add_argument("--clients", type=int, default=16, help="clients of the concurrent phase (default 16)")
    parser.add_argument("--per-client", type=int, default=50, help="requests per concurrent client (default 50)")
    parser.add_argument("--pid", type=int, default=0, help="the server's process id: watch its RSS and descriptors")
    parser.add_argument("--model", default="default", help="the model name sent (default: default)")
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request (default 16)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take (default 120)")
    parser.add_argument("--warmup", type=int, default=1000, help="requests before memory must stay flat")
    parser.add_argument("--sample-every", type=int, default=100, help="sample the process every N requests")
    parser.add_argument("--rss-slack-mib", type=float, default=16.0, help="allowed RSS growth after the warm-up")
    parser.add_argument("--fd-slack", type=int, default=4, help="allowed descriptor growth after the warm-up")
    args = parser.parse_args(argv)
    base_url = f"http://{args.address}/v1"
    reports = []
    if args.sequential > 0:
        reports.append(summary(run_phase("sequential", base_url, args, 1, args.sequential), args.warmup))
        print(json.dumps(reports[-1]), flush=True)
    if args.clients > 0 and args.per_client > 0:
        reports.append(summary(run_phase("concurrent", base_url, args, args.clients, args.per_client), 0))
        print(json.dumps(reports[-1]), flush=True)
    all_ok = all(set(r["statuses"]) <= {"200"} for r in reports)
    all_flat = all(flat(r, args.rss_slack_mib, args.fd_slack) for r in reports)
    print(f"all 200: {all_ok}; flat after the warm-up: {all_flat}")
    return 0 if all_ok and all_flat else 1


if __name__ == "__main__":
    sys.exit(main())
