"""Which llama.cpp is linked: llama-cpp-python's version, the vendored commit and its release number
(what ``wasinn info`` and the ABI's version metadata report, as WasmEdge reports its build)."""

from __future__ import annotations

import ctypes

from .bindings import ggml_library, llama_cpp

LLAMA_CPP_PYTHON_VERSION: str = llama_cpp.__version__
# llama.cpp revision vendored by each supported llama-cpp-python release (its CHANGELOG), and that
# revision's release tag bNNNN (llama.cpp's LLAMA_BUILD_NUMBER, which WasmEdge reports).
_LLAMA_COMMITS = {"0.3.36": "0c1e57098"}
_BUILD_NUMBERS = {"0c1e570": 11312}


def _linked_commit() -> str:
    """The llama.cpp commit of the linked libraries (``ggml_commit()``), else the version table's."""
    try:
        ggml = ggml_library("libggml-base.so")
        ggml.ggml_commit.restype = ctypes.c_char_p
        commit = (ggml.ggml_commit() or b"").decode().removesuffix("-dirty")
    except (OSError, AttributeError, UnicodeDecodeError):
        commit = ""
    return commit if commit and commit != "unknown" else _LLAMA_COMMITS.get(LLAMA_CPP_PYTHON_VERSION, "unknown")


LLAMA_COMMIT: str = _linked_commit()
LLAMA_BUILD_NUMBER: int = _BUILD_NUMBERS.get(LLAMA_COMMIT[:7], 0)
"""The bNNNN tag of the linked commit, from the table above (libllama does not expose it); 0 if unknown."""
