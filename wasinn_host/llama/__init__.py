"""The llama.cpp backend, behind the core's protocols (:mod:`wasinn_host.core.runtime`).

:mod:`.runtime` (the runtime the registry loads models with), :mod:`.model` (weights, vocabulary,
sizes), :mod:`.context` (batches, decoding, per-sequence KV), :mod:`.sampler` (the sampler chain),
:mod:`.version` (the linked llama.cpp),
:mod:`.bindings` (llama-cpp-python's ctypes bindings without its high-level layer, loaded after
:mod:`.openmp` set how llama.cpp's OpenMP threads wait), :mod:`.log`
(llama.cpp's log), :mod:`.grammar_sampling` and :mod:`.piece_trie` (grammar-constrained sampling),
:mod:`.json_schema` (a config's JSON schema as the GBNF grammar it enforces),
:mod:`.vision` (images through libmtmd), :mod:`.devices`, :mod:`.offload` and :mod:`.gguf_layout`
(how many layers go to a GPU), :mod:`.model_check` (untrusted model files loaded in a child first) and
:mod:`.load_errors` (llama.cpp's reasons for a failed load, in one line).
"""
