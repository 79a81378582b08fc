"""Typed parameter records: what a model is loaded with and what a context generates with.

:class:`ModelParams` are load-time parameters (one llama.cpp model and context per distinct
set); :class:`ContextParams` (sampling, stop rules, prompt options) belong to one execution
context and may change between its computations.  ``keys.py`` fills them from JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

from .preload import Target

DEFAULT_SEED = 0xFFFF_FFFF
POOLING_RANK = 4
"""llama.cpp's ``LLAMA_POOLING_TYPE_RANK``: a reranker's classification head scores each sequence."""
DEFAULT_STEP_BUDGET = 7.0
"""A step with prompt tokens costs at most this many times a decode step of the generating guests.
``bench_mixed_load.py`` (2-core Intel Xeon, 7 streams + a 2,300-token prompt, 6 runs each alternating,
2026-11-28): 7 gives the streams' gap p99/p50 7.1 (6.3-11.3), the long prompt's first token 6.9 s and
llama.cpp 10.9 s; 8 gives 8.1 (7.6-12.3), 7.2 s and 11.3 s.  The planner aims at the budget and its cost
model misses by 10-20 %, so a budget at the p99/p50 a user wants (8) lands above it as often as below.
Before the planner took 64-row chunks late in a long prompt (prefill_budget.py), 7 fell into flash
attention's slow path (llama.cpp's time 2.1x); earlier figures: docs/benchmarks-history.md."""
DEFAULT_LOGITS_ROWS = 0
"""Rows of logits one ``llama_decode`` computes at most by default (``decode-logits-rows``): no cap.
Measured with 32 Gemma 3 guests on 2 cores, a cap of 16 lowered the peak RSS by 33 MiB (+21.3 % to
+16.2 % over weights + KV) and cost 10 % of the tokens per second (two decodes a step), so it is opt-in."""
SPEC_TYPES = ("none", "ngram-simple")
"""``spec-type`` values: no speculation (the default) or prompt lookup."""


@dataclass(frozen=True)
class ModelParams:
    """Load-time parameters: one llama.cpp model + context is created per distinct set."""

    n_gpu_layers: int | None = None
    """Layers offloaded to the GPU (-1 = all); None: chosen from ``target`` (see ``offload.py``)."""
    main_gpu: int = 0
    target: Target | None = None
    """The execution target the caller asked for (``load``'s argument, or the preload's); None = AUTO."""
    use_mmap: bool = True
    use_mlock: bool = False
    ctx_size: int = 0
    """Tokens per execution context (sequence); 0 = the model's training context, at most 4096."""
    batch_size: int = 2048
    ubatch_size: int = 512
    threads: int = 0
    """Generation threads; 0 = all CPU cores."""
    threads_batch: int = 0
    """Prompt-processing threads; 0 = same as ``threads``."""
    n_parallel: int = 0
    """Sequences decoded together.  0 (the default): as many as are computing, up to a cap, in one
    shared KV pool; N: at most N, each with its own ``ctx-size`` cells."""
    embedding: bool = False
    flash_attn: str = "auto"
    type_k: str = "f16"
    """KV cache type of K (``type-k``: llama.cpp's ``--cache-type-k`` names, see ``kv_types.py``)."""
    type_v: str = "f16"
    """KV cache type of V (``type-v``); a quantized one needs flash attention."""
    prefill_step_budget: float = DEFAULT_STEP_BUDGET
    """While guests generate, a step with prompt tokens costs at most this many plain decode steps
    (chunked prefill, see ``scheduling/prefill_budget.py``); 0 = off (prompts take the whole batch)."""
    decode_logits_rows: int = DEFAULT_LOGITS_ROWS
    """Logits rows one ``llama_decode`` computes at most: a step sampling more is decoded in parts of
    this many (see ``scheduling/decode_parts.py``); 0 = no cap (one decode a step)."""
    mmproj: str = ""
    """The multimodal projector of the model's name ("" = text only): the one the host configured, or
    a file the guest named inside its preopened directories (see ``core/registry.py``), never another host file."""
    mmproj_from_guest: bool = False
    """``mmproj`` is a host path the front end resolved through the guest's preopened directories (set
    by the front end only: no config key reaches it)."""
    reranking: bool = False
    """A reranker: ``embedding`` on, ``pooling_type`` rank (the config sets both, as WasmEdge does)."""
    pooling_type: int = -1
    """llama.cpp's ``llama_pooling_type`` for embeddings: -1 the model's, 0 none, 1 mean, 2 CLS, 3 last, 4 rank."""
    attention_type: int = -1
    """llama.cpp's ``llama_attention_type`` for embeddings: -1 the model's, 0 causal, 1 non-causal."""
    rope_scaling_type: int = -1
    """llama.cpp's ``llama_rope_scaling_type``: -1 the model's, 0 none, 1 linear, 2 YaRN, 3 LongRoPE."""
    rope_freq_base: float = 0.0
    """RoPE base frequency; 0 = the model's."""
    rope_freq_scale: float = 0.0
    """RoPE frequency scaling factor (linear: training context / context); 0 = the model's."""
    yarn_ext_factor: float | None = None
    """YaRN extrapolation mix factor; None = llama.cpp's default (negative: the model's)."""
    yarn_attn_factor: float | None = None
    """YaRN magnitude scaling factor; None = llama.cpp's default."""
    yarn_beta_fast: float | None = None
    """YaRN low correction dimension; None = llama.cpp's default."""
    yarn_beta_slow: float | None = None
    """YaRN high correction dimension; None = llama.cpp's default."""
    yarn_orig_ctx: int = 0
    """YaRN original context size; 0 = the model's training context."""
    cpu_moe: bool = False
    """Keep every layer's mixture-of-experts expert tensors in CPU memory (a tensor-buffer override)."""
    n_cpu_moe: int = 0
    """Keep the expert tensors of the first N layers in CPU memory."""
    tensor_split: tuple[float, ...] = ()
    """Proportion of the model offloaded to each GPU, in device order (empty: llama.cpp's choice)."""
    split_mode: str = "layer"
    """How a model is split over several GPUs: ``none``, ``layer`` or ``row``."""
    no_kv_offload: bool = False
    """Keep the KV cache (and the attention over it) in CPU memory when layers are offloaded."""
    tts: bool = False
    """Text to speech (OuteTTS): prompts become OuteTTS prompts and the output a WAV file (``tts/graph.py``)."""
    vocoder: str = ""
    """The WavTokenizer vocoder of a ``tts`` graph: a file the guest named inside its preopened directories."""
    vocoder_from_guest: bool = False
    """``vocoder`` is a host path the front end resolved through the guest's preopened directories."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-context sampling parameters (one llama.cpp sampler chain per context)."""

    temp: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typ_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    mirostat: int = 0
    mirostat_eta: float = 0.1
    mirostat_ent: float = 5.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    last_n_penalty: int = 64
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    min_keep: int = 0
    seed: int = DEFAULT_SEED
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str = ""
    """A GBNF grammar the output must match (``""``: none)."""
    json_schema: str = ""
    """A JSON schema the output must match (``""``: none), kept as the guest gave it: the backend turns it
    into what it enforces (llama.cpp: a grammar, in place of ``grammar``).  A config that sets a schema clears
    ``grammar``; one that sets a grammar clears the schema."""
    grammar_first: bool = False
    """Mask with the grammar before every draw instead of only after the chain's draw is refused."""
    n_probs: int = 0
    top_n_sigma: float = -1.0
    """Keep the tokens within this many standard deviations of the top logit (<= 0: off)."""
    n_prev: int = 64
    """Tokens of history llama.cpp's ``common_sampler`` keeps for its text of previous tokens (no effect on draws)."""

    @property
    def greedy(self) -> bool:
        """``temp <= 0`` means always take the most likely token."""
        return self.temp <= 0.0


@dataclass(frozen=True)
class StopParams:
    """Per-context stop rules and output options."""

    n_predict: int = -1
    reverse_prompt: str = ""
    stop: tuple[str, ...] = ()
    max_time_ms: int = 0
    ignore_eos: bool = False
    stream_stdout: bool = False


MAX_STREAM_INTERVAL = 8
"""The ``stream-interval`` key's upper bound: half a stream's lookahead (16 tokens), so that a stream's job
never pauses for a guest that waits to be woken."""


@dataclass(frozen=True)
class PromptOptions:
    """Per-context prompt handling, scheduling and embedding options."""

    chat_template: bool | str = False
    """True: the prompt is JSON messages rendered with the model's template; a string: that template."""
    cache_prompt: bool = True
    ctx_shift: bool = False
    n_keep: int = 0
    priority: int = 0
    queue_timeout_ms: int = -1
    """-1: the host's default (``Limits.queue_timeout_ms``)."""
    stream_interval: int = 1
    """A guest streaming with ``compute_single`` is woken once this many tokens are ready (1 to 8; the first
    token and the end at once): fewer thread hand-offs a token, tokens in bursts."""
    embd_normalize: int = 2
    image: str = ""
    """An image file for the next prompt, as the guest named it (its front end resolves and reads it)."""
    spec_type: str = "none"
    """Speculative decoding: ``none`` or ``ngram-simple`` (prompt-lookup drafts)."""
    draft_max: int = 16
    draft_min: int = 0
    draft_p_min: float = 0.0
    spec_ngram_size_n: int = 3
    spec_ngram_size_m: int = 48
    always_regenerate_image_embd: bool = False
    """Decode the prompt's images on every compute instead of keeping them in the KV cache between computes."""
    path_prompt_cache: str = ""
    """The entry of the host's prompt cache this context's prompts are saved under (a name inside the
    cache directory, never a host path; "" = named by content; ignored without a cache)."""
    tts_output_file: str = "output.wav"
    """Where a ``tts`` graph's WAV is written, as the guest names it (inside its preopened directories)."""
    tts_speaker_file: str = ""
    """An OuteTTS speaker profile (JSON) for a ``tts`` graph's prompts, as the guest names it; "" = the default."""


@dataclass(frozen=True)
class ContextParams:
    """Everything an execution context may change with a metadata ``set_input``."""

    sampling: SamplingParams = SamplingParams()
    stopping: StopParams = StopParams()
    options: PromptOptions = PromptOptions()
