"""The fake backend runs guests through the whole host without importing llama.cpp at all."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast

SCRIPT = """
import json, sys, pathlib
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host import WasiNN
from wasinn_host.backend.fake import fake_backend
model = pathlib.Path(sys.argv[1])
guest = AbiGuest.create(WasiNN(backend=fake_backend([f"succ:GGML:AUTO:{model}"])))
print(guest.generate(guest.load_by_name("succ")[1], "a"))
print(guest.generate(guest.load_by_name("succ")[1], "a", json.dumps({"json-schema": json.dumps({"type": "integer"})})))
print("llama_cpp" in sys.modules)
"""


def test_fake_backend_never_imports_llama_cpp(fake_model: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(fake_model)], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert out == ["(0, 'bcdefghijklmnopqrstuvwxyz</s>')"] * 2 + ["False"]  # a JSON schema is llama.cpp's to convert
