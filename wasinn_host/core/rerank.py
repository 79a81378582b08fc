"""A reranker's input: a query and the documents to score against it (config key ``reranking``).

``reranking: true`` loads the model as WasmEdge's GGML plugin does: an embedding model with rank pooling
(llama.cpp's ``LLAMA_POOLING_TYPE_RANK``), whose classification head gives each sequence a score.  The
prompt is either

* llama-server's ``/rerank`` request: a JSON object with ``query`` (a string) and ``documents`` (Jina's
  name) or ``texts`` (TEI's name), a non-empty array of strings; other members (``top_n``, ``model``) are
  ignored.  Each document is scored with the query, formatted as llama-server formats the pair (the
  model's ``rerank`` chat template, or BOS query EOS SEP document EOS: ``LlamaModel.rerank_tokens``);
* anything else (plain text, a JSON value without ``query``): one sequence, scored as it is, as
  WasmEdge's plugin scores the prompt a guest formatted itself.

The output is one score per document, in the documents' order, as WasmEdge's embedding JSON:
``{"n_embedding": K, "embedding": [s0,s1,...]}``.  Scores are the head's raw outputs (llama-server's
``score``): ``embd-normalize`` does not apply to them.
"""

from __future__ import annotations

import orjson

from .errors import invalid

DOCUMENT_KEYS = ("documents", "texts")


def parse_rerank_input(data: bytes) -> tuple[bytes, list[bytes]] | None:
    """(query, documents) of a ``/rerank`` request; None if ``data`` is not one (a prompt scored as it is).

    A JSON object with a ``query`` member whose query or documents are malformed is an invalid
    argument naming what is wrong and what is accepted."""
    if not data.lstrip().startswith(b"{"):
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or "query" not in doc:
        return None
    query = doc["query"]
    if not isinstance(query, str):
        raise invalid("rerank input: 'query' must be a string (with 'documents': a non-empty array of strings)")
    documents = next((doc[key] for key in DOCUMENT_KEYS if key in doc), None)
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise invalid(
            "rerank input: 'documents' (or 'texts') must be a non-empty array of strings, "
            'as in {"query": "...", "documents": ["...", "..."]}'
        )
    return query.encode(), [d.encode() for d in documents]
