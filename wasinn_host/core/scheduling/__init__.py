"""The scheduler and the modules that plan its steps.

:mod:`.scheduler`'s :class:`~wasinn_host.core.scheduling.scheduler.ModelWorker` is one thread per loaded
model that owns its inference context and batches every computing context of it into each decode.  Its
state is :mod:`.slot_state`'s (jobs, slots, context states); its helpers are functions over that state:

* admitting a job: :mod:`.prefix_reuse` (the KV cells it keeps or copies from another sequence) and
  :mod:`.prompt_cache_use` (the on-disk prompt cache read, restored and saved);
* planning a step: :mod:`.batch_plan`, with chunked prefill (:mod:`.prefill_budget` over the cost model
  of :mod:`.step_cost`) and speculation (:mod:`.speculation`: prompt-lookup drafts of
  :mod:`.ngram_drafts`, as long as :mod:`.draft_budget` finds worth their cost);
* decoding and sampling: :mod:`.decode_parts` (a step in parts of at most ``decode-logits-rows``),
  :mod:`.stop_rules`, and :mod:`.stream_feed` (a stream's tokens sampled ahead of its guest);
* :mod:`.step_clock`: where the worker's time goes, phase by phase.
"""
