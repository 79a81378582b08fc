"""The output metadata JSON (``get_output`` index 1) exactly as WasmEdge writes it, then ours.

WasmEdge writes ``{"input_tokens": N, "output_tokens": M, "llama_build_number": B,
"llama_commit": "C"}`` with a space after each colon and comma; guests that parse it by hand
rely on that.  This host keeps those four first, byte for byte, and appends its additions
(stop reason, timings, reused tokens, probabilities) in compact JSON.
"""

from __future__ import annotations

from typing import Any

import orjson

HEAD_KEYS = ("input_tokens", "output_tokens", "llama_build_number", "llama_commit")


def metadata_json(meta: dict[str, Any]) -> bytes:
    """``meta`` (from a context's ``metadata()``) as WasmEdge's string plus this host's keys."""
    head = ", ".join(f'"{key}": {orjson.dumps(meta[key]).decode()}' for key in HEAD_KEYS)
    extra = {key: value for key, value in meta.items() if key not in HEAD_KEYS}
    if not extra:
        return ("{" + head + "}").encode()
    return ("{" + head + ", " + orjson.dumps(extra).decode()[1:]).encode()


def embedding_json(vector: list[float]) -> bytes:
    """An embedding as WasmEdge's GGML plugin returns it: ``{"n_embedding": N, "embedding": [...]}``."""
    values = ",".join(format(v, ".10g") for v in vector)
    return f'{{"n_embedding": {len(vector)}, "embedding": [{values}]}}'.encode()
