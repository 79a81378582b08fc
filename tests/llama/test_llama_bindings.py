"""``llama/bindings.py``: a run loads llama-cpp-python's bindings only, and the package still
completes itself for code that asks for its high-level names."""

from __future__ import annotations

import pathlib
import subprocess
import sys

SCRIPT = """
import importlib.metadata, sys
from wasinn_host import ModelRegistry, WasiNN
nn = WasiNN(registry=ModelRegistry([f"succ:GGML:AUTO:{sys.argv[1]}"]))
with nn.session("succ", {"temp": 0, "n-predict": 4}) as session:
    print(session.complete("abc"))
print(sorted(m for m in ("llama_cpp.llama", "llama_cpp.llama_chat_format", "jinja2") if m in sys.modules))
import llama_cpp
print(llama_cpp.__version__ == importlib.metadata.version("llama_cpp_python"))
from llama_cpp import mtmd_cpp
print(llama_cpp.Llama.__module__, "llama_cpp.llama" in sys.modules, mtmd_cpp.__name__)
nn.close()
"""


def test_a_run_loads_the_bindings_only_and_the_package_completes_on_demand(successor_path: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(successor_path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out == ["defg", "[]", "True", "llama_cpp.llama True llama_cpp.mtmd_cpp"]
