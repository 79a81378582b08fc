"""Resident memory of the benchmark process: now (VmRSS) and the peak over a ``with`` block."""

from __future__ import annotations

import threading


def rss_bytes() -> int:
    """Resident memory of this process (VmRSS) in bytes."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """Samples VmRSS in a background thread while in a ``with`` block; ``peak`` is the maximum."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
