"""``llama/bindings.py``: a run loads llama-cpp-python's bindings only, and the package still
completes itself for code that asks for its high-level names; a call made through ``holding_gil`` keeps
the interpreter, and the model's pieces and end-of-generation answers made that way are llama.cpp's."""

from __future__ import annotations

import ctypes
import pathlib
import subprocess
import sys
import threading
from collections.abc import Callable

from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.gil_calls import holding_gil
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.model import LlamaModel

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


def _counted_during(call: Callable[[], object]) -> int:
    """How far a Python thread counts while ``call`` runs on this one."""
    count, started, stop = [0], threading.Event(), threading.Event()

    def counter() -> None:
        started.set()
        while not stop.is_set():
            count[0] += 1

    thread = threading.Thread(target=counter)
    thread.start()
    started.wait()
    before = count[0]
    call()
    during = count[0] - before
    stop.set()
    thread.join()
    return during


def test_holding_gil_keeps_the_interpreter_during_the_call() -> None:
    libc = ctypes.CDLL(None)
    usleep = libc.usleep
    usleep.argtypes, usleep.restype = [ctypes.c_uint], ctypes.c_int
    held = holding_gil(usleep)
    assert held(0) == 0  # the same function, the same result
    free = _counted_during(lambda: usleep(200_000))  # a plain ctypes call: the thread counts meanwhile
    kept = _counted_during(lambda: held(200_000))  # held: it counts only in the switches around the call
    assert kept * 4 < free, (kept, free)


def test_pieces_and_end_of_generation_are_the_bindings_answers(successor_path: pathlib.Path) -> None:
    model = LlamaModel(successor_path, ModelParams())
    try:
        buf = ctypes.create_string_buffer(64)
        for token in range(model.n_vocab):
            n = llama_cpp.llama_token_to_piece(model.vocab, token, buf, len(buf), 0, True)
            assert model.piece(token) == buf.raw[:n]
            assert model.is_eog(token) == bool(llama_cpp.llama_vocab_is_eog(model.vocab, token))
    finally:
        model.close()
