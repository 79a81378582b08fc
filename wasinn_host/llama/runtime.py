"""The real :class:`~wasinn_host.core.runtime.Runtime`: llama.cpp through llama-cpp-python's
low-level API, in typed wrappers that know nothing about guests or handles.

``model.py`` loads weights (and reads a GGUF's chat template), ``context.py`` decodes batches and edits
the KV cache per sequence, ``sampler.py`` builds sampler chains, ``version.py`` names the linked
llama.cpp.  The other modules that touch ``llama_cpp`` do so for one narrow job each: ``log.py``
(llama.cpp's log), ``model_check.py`` (loading untrusted files in a child process) and
``json_schema.py`` (llama.cpp's JSON-schema-to-grammar converter).  Nothing in ``core/`` imports
``llama_cpp``.
"""

from __future__ import annotations

from pathlib import Path

from ..core.config.params import ModelParams
from ..core.runtime import KvLayout
from .context import LlamaContext
from .model import LlamaModel, kv_cache_bytes
from .version import LLAMA_BUILD_NUMBER, LLAMA_COMMIT


class LlamaRuntime:
    """llama.cpp through llama-cpp-python: the runtime every real model uses."""

    build_number = LLAMA_BUILD_NUMBER
    commit = LLAMA_COMMIT

    def load_model(self, path: Path, params: ModelParams) -> LlamaModel:
        """Load weights and vocabulary (invalid argument with llama.cpp's reason if it cannot)."""
        return LlamaModel(path, params)

    def new_context(self, model: LlamaModel, params: ModelParams, layout: KvLayout) -> LlamaContext:
        """A context laid out as ``layout`` says."""
        return LlamaContext(model, params, layout)

    def kv_cache_bytes(self, model: LlamaModel, n_ctx: int, params: ModelParams) -> int:
        """Bytes of KV cache for ``n_ctx`` cells of the cache types ``params`` name."""
        return kv_cache_bytes(model, n_ctx, params.type_k, params.type_v)

    def check_model_file(self, path: Path) -> None:
        """Load an untrusted file in a child process first (llama.cpp aborts on some files)."""
        from .model_check import check_model_file

        check_model_file(path)
