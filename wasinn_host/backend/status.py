"""Backend status as one JSON-ready dict (the original design's ``get_backend_status``).

:func:`model_status` gives the backend's sections: ``queue`` (waiting and running requests
per model), ``memory`` (weights, KV cache, process RSS), ``performance`` (requests, tokens,
decode calls, busy sequences per decode; per model, llama.cpp's passes per decode and where the
worker's steps spend their time: :mod:`wasinn_host.core.scheduling.step_clock`), ``models`` and
``preloads``; a front end adds its own ``sessions`` section (Stores and execution contexts).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.config.limits import Limits
    from ..core.registry import LoadedModel, ModelRegistry

_START = time.time()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _model_entry(model: "LoadedModel") -> dict[str, Any]:
    worker = model.worker
    context = worker.context
    return {
        "name": model.name or model.label,
        "path": str(model.path) if model.path else None,
        "description": model.weights.description,
        "stale": model.stale,
        "references": model.refs,
        "weights_bytes": model.weights.size_bytes,
        "kv_cache_bytes": context.kv_bytes,
        "sequences": context.n_seq,
        "sequences_in_use": worker.busy_sequences,
        "sequences_high_water": worker.sequences_high_water,
        "sequences_follow_demand": model.params.n_parallel == 0,
        "sequence_growths": worker.growths,
        "ctx_size_per_sequence": model.n_ctx_seq,
        "busy_sequences": worker.busy_sequences,
        "queued": worker.queued,
        "running": worker.active,
        "requests": worker.requests,
        "rejected_busy": worker.rejected,
        "generated_tokens": worker.generated_tokens,
        "decoded_tokens": worker.decoded_tokens,
        "reused_prompt_tokens": worker.reused_tokens,
        "prompt_tokens_decoded": worker.prompt_tokens_decoded,
        "shared_prefix_tokens": worker.shared_prefix_tokens,
        "draft_tokens": worker.drafted_tokens,
        "accepted_draft_tokens": worker.accepted_draft_tokens,
        "decode_calls": worker.decode_calls,
        "passes_per_decode": round(worker.decode_passes / worker.decode_calls, 3) if worker.decode_calls else 0.0,
        "step_time": worker.clock.report(),
        "carried_plans": worker.carried_plans,
        "split_steps": worker.split_steps,
        "rows_sampled_together": worker.rows_sampled_together,
        "guests_awaited": worker.guests_awaited,
        "late_guests": worker.late_guests,
        "rows_drawn_together": worker.rows_drawn_together,
        "sequences_per_decode": round(worker.sequences_decoded / worker.decode_calls, 3)
        if worker.decode_calls
        else 0.0,
        "params": {k: v for k, v in vars(model.params).items()},
    }


def model_status(registry: "ModelRegistry", limits: "Limits") -> dict[str, Any]:
    """A snapshot of the models, their queues and memory; every value is JSON-serialisable."""
    models = [_model_entry(m) for m in registry.loaded()]
    uptime = time.time() - _START
    generated = sum(m["generated_tokens"] for m in models)
    return {
        "queue": {
            "queued": sum(m["queued"] for m in models),
            "running": sum(m["running"] for m in models),
            "max_queue_per_model": limits.max_queue,
        },
        "memory": {
            "weights_bytes": sum(m["weights_bytes"] for m in models),
            "kv_cache_bytes": sum(m["kv_cache_bytes"] for m in models),
            "kv_budget_bytes": limits.kv_budget(),
            "rss_bytes": _rss_bytes(),
        },
        "performance": {
            "uptime_s": round(uptime, 3),
            "requests": sum(m["requests"] for m in models),
            "rejected_busy": sum(m["rejected_busy"] for m in models),
            "generated_tokens": generated,
            "tokens_per_second_avg": round(generated / uptime, 3) if uptime > 0 else 0.0,
            "decode_calls": sum(m["decode_calls"] for m in models),
        },
        "models": models,
        "preloads": {name: str(p.path) for name, p in registry.preloads().items()},
        "pid": os.getpid(),
    }
