"""Embedding wasinn-host in a Python application: a guest run, a Linker of your own, a Session.

Uses the embedded demo model, so it runs offline: ``python scripts/examples/embed_example.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import wasmtime

from wasinn_host import RunOptions, WasiNN
from wasinn_host.models import DEMO_MODEL_PATH

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    nn = WasiNN(preload=[f"default:GGML:AUTO:{DEMO_MODEL_PATH}"])

    # 1. one call: run a WASI guest with WASI-NN, capture its output in a file
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.txt"
        prompt = "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n"
        code = nn.run(
            ROOT / "guest_examples" / "complete.wasm",
            ["default", prompt],
            RunOptions(env={"temp": "0"}, stdout=str(out)),
        )
        print(f"guest exit code {code}, answer: {out.read_text().strip()}")

    # 2. your own Linker and Store (the Store's handles are freed when it is)
    linker = wasmtime.Linker(nn.engine)
    linker.define_wasi()
    nn.add_to_linker(linker)
    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    print(
        "imports defined:",
        sorted(
            e.name or ""
            for e in nn.load_module(ROOT / "guest_examples" / "chat.wasm").imports
            if e.module == "wasi_ephemeral_nn"
        ),
    )

    # 3. no guest: a Session, with the host applying the model's chat template
    messages = [{"role": "user", "content": "What is 700-58?"}]
    with nn.session("default", {"temp": 0, "chat-template": True}) as session:
        answer = session.complete(json.dumps(messages))
        print(f"session answer: {answer!r}; streamed:", b"".join(session.stream(json.dumps(messages))).decode())
        print("metadata:", session.metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
