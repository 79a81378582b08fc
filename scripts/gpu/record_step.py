#!/usr/bin/env python3
"""One step of ``scripts/gpu/on_device.sh`` recorded: appended to the steps file, and ``figures.json``
under ``$OUT`` rewritten at once, so a run cut off (a batch job's time limit) still keeps every step done.

Usage: ``python3 scripts/gpu/record_step.py STEPS.jsonl OUT NAME RC T0 OUTPUT.txt STARTED DRY``
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

KEEP = 6000
"""Characters of each step's output kept (its end: the figures are printed last)."""


def main() -> int:
    steps_file, out, name, rc, t0, output, started, dry = sys.argv[1:9]
    text = pathlib.Path(output).read_text(encoding="utf-8", errors="replace")
    record = {"step": name, "rc": int(rc), "seconds": round(time.time() - float(t0), 1), "output": text[-KEEP:]}
    with open(steps_file, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    steps = [json.loads(line) for line in pathlib.Path(steps_file).read_text(encoding="utf-8").splitlines()]
    try:
        info = json.loads((pathlib.Path(out) / "info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = {}
    figures = {
        "dry_run": dry == "1",
        "seconds_so_far": round(time.time() - float(started)),
        "devices": info.get("devices"),
        "gpu_offload": info.get("gpu_offload"),
        "build_seconds": next((s["seconds"] for s in steps if s["step"] == "build_llama_cpp"), None),
        "steps": steps,
    }
    (pathlib.Path(out) / "figures.json").write_text(json.dumps(figures, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
