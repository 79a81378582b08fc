"""Split steps on real llama.cpp: when the worker's cost model says a step of stream tokens and a prompt
chunk costs less as two ``llama_decode`` calls than as one, the worker decodes the streams' tokens first
and the chunk in a call of its own (``split_steps`` counts such steps), and every sequence's greedy
tokens are the ones the same load gives in one decode a step.

The cost model is one taught synthetic decodes (:mod:`wasinn_host.testing.step_costs`: a CPU's flash
attention, where a cell attended in a pass of 2-63 rows per sequence costs 5x, or a device where every
pass costs alike) and then kept from learning this machine's decodes, so the shapes the policy chooses
do not depend on how fast the machine is.  The batch holds 67 tokens: beside three generating
sequences, a prompt takes 64 a step (``prefill-step-budget`` 0, so no budget cuts it); in one decode
llama.cpp would pass over 63 of them on their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from wasinn_host.core.config.params import ModelParams, SamplingParams, StopParams
from wasinn_host.core.generation import GenerationRequest, GenerationResult
from wasinn_host.core.runtime import KvLayout
from wasinn_host.core.scheduling.scheduler import ContextState, ModelWorker
from wasinn_host.core.scheduling.step_cost import Pass, StepCost
from wasinn_host.llama.model import LlamaModel
from wasinn_host.llama.runtime import LlamaRuntime
from wasinn_host.testing.gguf_models import write_random_model
from wasinn_host.testing.step_costs import even, flash_cpu, learned

STREAMS = 3
BATCH = 64 + STREAMS
STREAM_TOKENS = 120
PROMPT = [(17 * i) % 900 + 50 for i in range(300)]
WAIT = 120.0


class Frozen(StepCost):
    """A cost model taught synthetic decodes that the worker's own decodes change no more."""

    def __init__(self, taught: StepCost) -> None:
        super().__init__()
        self.__dict__.update(taught.__dict__)

    def record(self, n_tokens: int, n_passes: int, cells: int, seconds: float) -> None:
        """Nothing."""

    def record_passes(self, shapes: Sequence[Pass], seconds: float) -> None:
        """Nothing."""

    def record_single_rows(self, n_tokens: int, n_passes: int, cells: int, seconds: float) -> None:
        """Nothing."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    path = tmp_path_factory.mktemp("split") / "random.gguf"
    write_random_model(path, n_layer=2, n_embd=64, n_head=2, n_ff=128, n_vocab=1000, seed=3, logit_std=50.0)
    loaded = LlamaRuntime().load_model(path, ModelParams(threads=2))
    yield loaded
    loaded.close()


def request(tokens: Sequence[int], limit: int) -> GenerationRequest:
    return GenerationRequest(tuple(tokens), limit, SamplingParams(temp=0.0), StopParams(ignore_eos=True))


def run(model: LlamaModel, cost: StepCost) -> tuple[ModelWorker, list[list[int]], list[list[tuple[int, int]]]]:
    """Three sequences generating and, once they have 20 tokens each, the prompt: every sequence's greedy
    tokens, the prompt's last, and the ``(sequence id, tokens)`` of each decode call from then on."""
    params = ModelParams(threads=2, n_parallel=STREAMS + 1, batch_size=BATCH)
    context = LlamaRuntime().new_context(model, params, KvLayout(512, STREAMS + 1))
    worker = ModelWorker(model, context, "split", prefill_step_budget=0.0)
    worker.step_cost = Frozen(cost)
    calls: list[list[tuple[int, int]]] = []
    decode, watching = context.decode, threading.Event()

    def recorded(batch: object, first: int = 0, count: int | None = None) -> int:
        if watching.is_set():
            counts, taken = worker._batch_counts, 0
            call = []
            for seq, n in counts:
                if first <= taken < first + (count if count is not None else BATCH):
                    call.append((seq, n))
                taken += n
            calls.append(call)
        return decode(batch, first, count)  # type: ignore[arg-type]

    context.decode = recorded  # type: ignore[method-assign]
    results: list[GenerationResult] = []

    def generate(i: int) -> None:
        results.append(worker.submit(request([5 + i, 300 + 7 * i, 11], STREAM_TOKENS), ContextState()))

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WAIT
    while worker.generated_tokens < STREAMS * 20:
        assert time.monotonic() < deadline, "the sequences never generated"
        time.sleep(0.001)
    watching.set()
    prompt = worker.submit(request(PROMPT, 4), ContextState())
    for thread in threads:
        thread.join(WAIT)
    worker.close()
    context.close()
    streams = sorted(list(r.generated) for r in results)
    return worker, [*streams, list(prompt.generated)], calls


def chunk_calls(calls: list[list[tuple[int, int]]]) -> tuple[int, list[list[tuple[int, int]]]]:
    """The prompt's sequence (the one decoded more than a token at once) and the calls with its chunks."""
    (prompt_seq,) = {seq for call in calls for seq, n in call if n > 1}
    return prompt_seq, [call for call in calls if any(seq == prompt_seq and n > 1 for seq, n in call)]


def test_a_chunk_that_costs_more_beside_the_streams_is_decoded_apart(model: LlamaModel) -> None:
    split_worker, split_out, split_calls = run(model, learned(flash_cpu))
    one_worker, one_out, one_calls = run(model, learned(even))
    assert split_out == one_out, "the same greedy tokens, split or not"
    assert all(len(tokens) == STREAM_TOKENS for tokens in split_out[:STREAMS]) and len(split_out[-1]) == 4
    assert one_worker.split_steps == 0
    assert split_worker.split_steps == 4
    prompt_seq, chunks = chunk_calls(split_calls)
    assert chunks[:4] == [[(prompt_seq, 64)]] * 4
    # the last 44: in one decode or two, the chunk's pass is of the same row class (32-63): one decode
    streams = sorted(seq for seq, _ in split_calls[split_calls.index(chunks[0]) - 1])
    assert chunks[4:] == [sorted([*((seq, 1) for seq in streams), (prompt_seq, len(PROMPT) - 4 * 64)])]
    for call in chunks[:4]:  # the call before each chunk's: the three streams' tokens, one each
        before = split_calls[split_calls.index(call) - 1]
        assert len(before) == STREAMS and all(n == 1 and seq != prompt_seq for seq, n in before), before
    prompt_seq, together = chunk_calls(one_calls)
    assert [len(call) for call in together[:-1]] == [STREAMS + 1] * 4, "one decode: the streams and the chunk"
