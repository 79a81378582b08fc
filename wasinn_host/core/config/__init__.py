"""Configuration: what a model is loaded with and a context runs with, and the limits they must keep.

:mod:`.keys` turns configuration JSON (WasmEdge's GGML key names) into the typed records of
:mod:`.params`, which hold every key's default (the scheduler's modules import the ones they use from
there); :mod:`.preload` parses ``--nn-preload``; :mod:`.limits` are what one guest and the whole
process may use; :mod:`.kv_types` (``type-k``, ``type-v``) and :mod:`.kv_sizing` (sequences and cells
within ``max_kv_bytes``) size the KV cache; :mod:`.model_path` checks a model's path before a backend
opens it.  Of the other rooms it imports only :mod:`wasinn_host.core.prompt_cache` (a cache entry's
name is a key's value).
"""
