"""Child process of the two-device tests: load a model through the host under the environment it was
started with (``GGML_VK_VISIBLE_DEVICES=0,0``: lavapipe twice), answer one prompt greedily, and print
one JSON object: the GPU devices, llama.cpp's log lines about devices and buffers, and the answer.

Usage: ``python tests/gpu/two_devices.py MODEL.gguf CONFIG_JSON PROMPT``
"""

from __future__ import annotations

import json
import logging
import sys

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.llama import devices
from wasinn_host.observability.log_setup import LLAMA_LOGGER


class Lines(logging.Handler):
    """Keeps every message logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> int:
    model, config, prompt = sys.argv[1:4]
    lines = Lines()
    logging.getLogger("wasinn_host").addHandler(lines)  # llama.cpp's logger propagates to it
    for name in ("wasinn_host", LLAMA_LOGGER):
        logging.getLogger(name).setLevel(logging.INFO)
    gpus = [
        {"name": d.name, "description": d.description, "free_bytes": d.free_bytes}
        for d in devices.devices()
        if d.is_gpu
    ]
    reg = ModelRegistry([f"m:GGML:AUTO:{model}"])
    try:
        with WasiNN(registry=reg).session("m", json.loads(config)) as session:
            answer = session.complete(prompt)
    finally:
        reg.close()
    print(json.dumps({"gpus": gpus, "gpu_free_bytes": devices.gpu_free_bytes(), "answer": answer, "log": lines.lines}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
