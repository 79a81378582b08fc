"""An optional Prometheus endpoint (the ``prometheus-client`` library) built from the status dict."""

from __future__ import annotations

from typing import Any, Callable, Iterator

StatusSource = Callable[[], dict[str, Any]]

_MODEL_GAUGES = {
    "busy_sequences": "Sequences decoding now",
    "queued": "Requests waiting for a free sequence",
    "weights_bytes": "Model weights in memory",
    "kv_cache_bytes": "KV cache size",
}
_MODEL_COUNTERS = {
    "requests": "Requests submitted",
    "rejected_busy": "Requests answered Busy",
    "generated_tokens": "Tokens generated",
    "decoded_tokens": "Tokens decoded (prompt and generated)",
    "reused_prompt_tokens": "Prompt tokens reused from the KV cache",
    "prompt_tokens_decoded": "Prompt tokens decoded",
    "shared_prefix_tokens": "Prompt tokens copied from another sequence instead of decoded",
    "draft_tokens": "Draft tokens verified (speculative decoding)",
    "accepted_draft_tokens": "Draft tokens accepted",
    "decode_calls": "llama_decode calls",
}


class StatusCollector:
    """A prometheus_client collector reading the status (see :mod:`.status`) at each scrape."""

    def __init__(self, status: StatusSource) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        """The metric families of one scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        status = self._status()
        for key, doc in _MODEL_GAUGES.items():
            family = GaugeMetricFamily(f"wasinn_{key}", doc, labels=["model"])
            for model in status["models"]:
                family.add_metric([model["name"]], model[key])
            yield family
        for key, doc in _MODEL_COUNTERS.items():
            counter = CounterMetricFamily(f"wasinn_{key}", doc, labels=["model"])
            for model in status["models"]:
                counter.add_metric([model["name"]], model[key])
            yield counter
        steps = CounterMetricFamily(
            "wasinn_step_seconds",
            "Seconds the model's worker spent in each phase of its steps",
            labels=["model", "phase"],
        )
        for model in status["models"]:
            for key, seconds in model["step_time"].items():
                if key.endswith("_s"):
                    steps.add_metric([model["name"], key[: -len("_s")]], seconds)
        yield steps
        step_count = CounterMetricFamily("wasinn_steps", "Steps the model's worker decoded", labels=["model"])
        for model in status["models"]:
            step_count.add_metric([model["name"]], model["step_time"]["steps"])
        yield step_count
        rpc = status.get("rpc")  # `wasinn serve`: contexts are held by remote sessions
        contexts = rpc["contexts"] if rpc is not None else status["sessions"]["execution_contexts"]
        yield GaugeMetricFamily("wasinn_execution_contexts", "Execution contexts alive", value=contexts)
        if rpc is not None:
            yield GaugeMetricFamily("wasinn_rpc_sessions", "Remote client sessions open", value=rpc["sessions"])
        yield GaugeMetricFamily(
            "wasinn_rss_bytes", "Resident memory of the process", value=status["memory"]["rss_bytes"]
        )


def serve_metrics(status: StatusSource, port: int, address: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` on ``address:port`` from a background thread."""
    try:
        from prometheus_client import start_http_server
        from prometheus_client.core import REGISTRY
    except ImportError:
        raise RuntimeError(
            "the Prometheus endpoint needs the prometheus-client package: pip install 'wasinn-host[metrics]'"
        ) from None
    REGISTRY.register(StatusCollector(status))
    start_http_server(port, addr=address)
