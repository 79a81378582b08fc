"""The backend-neutral core, in rooms named for what they do, around the modules they all share.

* :mod:`.scheduling`: the scheduler (one worker thread per loaded model, batching every context of it)
  and the modules that plan its steps: slots, batch plans, chunked prefill, speculation, stop rules,
  prefix reuse, streams.
* :mod:`.config`: configuration keys and the parameter records they fill, ``--nn-preload``, the host's
  limits, KV cache types and sizing, model paths.
* :mod:`.prompt_cache`: prompt prefixes' KV state on disk, for warm starts across processes.
* :mod:`.tts`: text to speech (OuteTTS prompts in, a WAV file out).

The modules at the top are the ones every room shares or that stand above them: :mod:`.errors`
(:class:`~wasinn_host.core.errors.WasiNNError` with an :class:`~wasinn_host.core.errors.ErrorKind`),
:mod:`.generation` (a generation's request and result), :mod:`.runtime` (the protocols a runtime
implements), :mod:`.tokens`, :mod:`.heap_trim`; the model registry (:mod:`.registry`) and inference
contexts (:mod:`.inference`), with what a context does with its prompt and output: chat templates
(:mod:`.chat_template`, :mod:`.chat_prompt`), images (:mod:`.images`), reranking (:mod:`.rerank`),
embeddings (:mod:`.embedding`), streamed UTF-8 (:mod:`.utf8_pieces`) and idle contexts on disk
(:mod:`.cold_store`).  ``preload.py`` only keeps an old import path working.

The rooms import each other downwards only, ``scheduling`` and ``tts`` above ``config`` above
``prompt_cache`` (``tests/package/test_layers.py``).  Nothing here knows an errno, a tensor index, guest
memory or llama.cpp (its runtime is in :mod:`wasinn_host.llama`, given to the registry by
:mod:`wasinn_host.backend.local`).
"""
