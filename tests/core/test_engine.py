"""The engine's scheduling and stop rules, driven directly on the fake runtime (no llama.cpp)."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from wasinn_host.backend.fake import FakeModel, FakeRuntime
from wasinn_host.core.config.params import ModelParams, SamplingParams, StopParams
from wasinn_host.core.errors import ErrorKind
from wasinn_host.core.generation import GenerationRequest, GenerationResult, StopReason
from wasinn_host.core.runtime import Context, KvLayout
from wasinn_host.core.scheduling.context_growth import Growth
from wasinn_host.core.scheduling.scheduler import ContextState, ModelWorker
from wasinn_host.testing.successor import successor_text, successor_tokenize

pytestmark = pytest.mark.fast

GREEDY = SamplingParams(temp=0.0)
WAIT = 30.0
"""The longest a test waits for the worker to reach a state (only a failure waits that long)."""


def make_worker(
    model_path: pathlib.Path,
    n_seq: int = 4,
    batch: int = 64,
    n_ctx_seq: int = 64,
    delay: float = 0.0,
    grow_to: int = 0,
    beside: bool = True,
    maker: Callable[[Callable[[], Context]], Callable[[], Context]] | None = None,
) -> ModelWorker:
    """A worker on the fake runtime with ``n_seq`` sequences of ``n_ctx_seq`` cells; with ``grow_to``,
    it may grow to that many sequences when more contexts compute at once (``beside``: the bigger
    context made while the worker steps on; ``maker`` wraps the maker of each bigger context)."""
    runtime = FakeRuntime(decode_delay=delay)
    params = ModelParams(n_parallel=n_seq, batch_size=batch)
    model = runtime.load_model(model_path, params)

    def grow(wanted: int) -> Growth | None:  # as the registry does: at least double, up to the cap
        n = min(max(wanted, 2 * made.context.n_seq), grow_to)
        if n <= made.context.n_seq:
            return None
        make: Callable[[], Context] = functools.partial(runtime.new_context, model, params, KvLayout(n_ctx_seq, n))
        return Growth(maker(make) if maker is not None else make, beside)

    layout = KvLayout(n_ctx_seq, n_seq)
    made = ModelWorker(model, runtime.new_context(model, params, layout), "fake", grow if grow_to else None)
    return made


@pytest.fixture
def worker(fake_model: pathlib.Path) -> Iterator[ModelWorker]:
    w = make_worker(fake_model)
    yield w
    w.close()


def request(prompt: str, limit: int = 100, stopping: StopParams | None = None, **kwargs: Any) -> GenerationRequest:
    """A greedy request for ``prompt``; ``kwargs`` set the other :class:`GenerationRequest` fields."""
    made = GenerationRequest(tuple(successor_tokenize(prompt)), limit, GREEDY, stopping or StopParams())
    return dataclasses.replace(made, **kwargs)


def text(result: GenerationResult) -> str:
    return bytes(result.text).decode()


def test_stop_reasons(worker: ModelWorker) -> None:
    state = ContextState()
    eos = worker.submit(request("w"), state)
    assert (text(eos), eos.stop_reason, eos.error) == ("xyz</s>", StopReason.EOS, None)
    assert worker.submit(request("a", limit=3), state).stop_reason is StopReason.N_PREDICT
    assert worker.submit(request("a", limit=0), state).stop_reason is StopReason.LIMIT
    stop = worker.submit(request("a", stopping=StopParams(stop=("ef",))), state)
    assert (text(stop), stop.stop_reason) == ("bcd", StopReason.STOP)
    full = worker.submit(request("7"), state)  # an endless digit cycle: 64 cells hold BOS, "7" and 62 tokens
    assert (full.stop_reason, len(full.generated)) == (StopReason.CONTEXT_FULL, 64 - 2 + 1)  # + one not decoded
    step = worker.submit(request("a", limit=1, streaming=True), state)
    assert (text(step), step.stop_reason) == ("b", StopReason.TOKEN)


def test_output_limit_is_an_error_with_the_output_kept(worker: ModelWorker) -> None:
    result = worker.submit(request("a", max_output_bytes=3), ContextState())
    assert result.error is not None and result.error.kind is ErrorKind.TOO_LARGE
    assert (text(result), result.stop_reason) == ("bcde", StopReason.OUTPUT_LIMIT)


def test_prefix_is_reused_and_a_long_prompt_is_decoded_in_chunks(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, batch=4)
    state = ContextState()
    first = worker.submit(request("ABCDEFGHIJ", limit=1), state)  # 11 tokens in batches of at most 4
    assert (text(first), first.reused_tokens) == ("K", 0)
    second = worker.submit(request("ABCDEFGHIJKLM", limit=1), state)
    assert (text(second), second.reused_tokens) == ("N", 11)
    assert worker.decode_calls == 3 + 1
    worker.close()


def test_contexts_decode_together(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, delay=0.005)
    results: list[GenerationResult] = []
    threads = [
        threading.Thread(target=lambda: results.append(worker.submit(request("a"), ContextState()))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [text(r) for r in results] == ["bcdefghijklmnopqrstuvwxyz</s>"] * 4
    assert worker.sequences_decoded / worker.decode_calls > 2.0, "four sequences share most decodes"
    worker.close()


def gate_decodes(worker: ModelWorker) -> tuple[threading.Event, threading.Event, list[int]]:
    """Make ``worker``'s decodes wait until the returned ``gate`` is set; ``entered`` is set once the first
    decode waits there, and every token decoded is appended to the returned list (on the worker's thread)."""
    gate, entered = threading.Event(), threading.Event()
    decoded: list[int] = []
    decode = worker.context.decode

    def gated(batch: Any, first: int = 0, count: int | None = None) -> int:
        entered.set()
        assert gate.wait(WAIT), "the test never opened the gate"
        tokens = batch.tokens[first:] if count is None else batch.tokens[first : first + count]
        decoded.extend(token for token, *_ in tokens)
        return decode(batch, first, count)

    worker.context.decode = gated  # type: ignore[method-assign]
    return gate, entered, decoded


def wait_until(condition: Callable[[], bool]) -> None:
    """Wait for a state of the worker that another thread brings about (failing after :data:`WAIT` s)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the worker never reached the state the test waits for"
        time.sleep(0.001)


def test_priority_then_arrival_order(fake_model: pathlib.Path) -> None:
    """One sequence, held by a running job while three requests queue (low, then high, then low2): once it
    is free they start by priority, then in arrival order.  The running job's first decode waits on a gate
    until all three are queued, so none can start early however the threads are scheduled; each request's
    prompt is its own letter, so the order is read from the tokens the worker decoded, in its own thread,
    not from the order in which the callers' threads woke up."""
    queue = (("low", "a", 0), ("high", "h", 5), ("low2", "p", 0))  # (name, prompt, priority) in arrival order
    worker = make_worker(fake_model, n_seq=1)
    gate, entered, decoded = gate_decodes(worker)
    blocker = threading.Thread(target=worker.submit, args=(request("7", limit=30), ContextState()))
    blocker.start()
    assert entered.wait(WAIT) and worker.active == 1
    results: dict[str, GenerationResult] = {}

    def run(name: str, prompt: str, priority: int) -> None:
        results[name] = worker.submit(request(prompt, limit=1, priority=priority), ContextState())

    def queued(n: int) -> Callable[[], bool]:
        return lambda: worker.queued == n

    threads = [threading.Thread(target=run, args=item) for item in queue]
    for n, thread in enumerate(threads, 1):
        thread.start()
        wait_until(queued(n))
    assert worker.active == 1 and decoded == []  # all three wait while the blocker's first decode does
    gate.set()
    for thread in [blocker, *threads]:
        thread.join()
    letters = {successor_tokenize(prompt)[-1]: name for name, prompt, _ in queue}
    assert [letters[token] for token in decoded if token in letters] == ["high", "low", "low2"]
    assert {name: text(result) for name, result in results.items()} == {"low": "b", "high": "i", "low2": "q"}
    worker.close()


def test_full_queue_is_busy_and_cancel_is_a_runtime_error(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model, n_seq=1, delay=0.01)
    state = ContextState()
    blocker = threading.Thread(target=worker.submit, args=(request("7", limit=1000), state))
    blocker.start()
    while worker.active != 1:
        pass
    busy = worker.submit(request("a", max_queue=0), ContextState())
    assert busy.error is not None and busy.error.kind is ErrorKind.BUSY
    state.cancelled = True
    blocker.join()
    again = worker.submit(request("a"), state)
    assert again.error is not None and again.error.kind is ErrorKind.RUNTIME_ERROR
    worker.close()


def test_context_shift_keeps_generating(worker: ModelWorker) -> None:
    result = worker.submit(request("7", limit=200, ctx_shift=True, n_keep=1), ContextState())
    assert (result.stop_reason, len(result.generated)) == (StopReason.N_PREDICT, 200)
    assert text(result) == ("8901234567" * 20)


def test_embedding_mode_frees_the_cells(fake_model: pathlib.Path) -> None:
    worker = make_worker(fake_model)
    result = worker.submit(request("abc", embed=True, limit=0), ContextState())
    assert result.stop_reason is StopReason.EMBEDDING and len(result.embedding) == 8
    assert all(not slot.kv for slot in worker.slots)
    worker.close()


def test_request_records_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        request("a").limit = 3  # type: ignore[misc]  # mypy rejects writing a frozen field: the test checks it fails


def test_fake_model_tokenizes_like_the_real_vocabulary(fake_model: pathlib.Path) -> None:
    model = FakeModel(fake_model, 512)
    assert model.tokenize(b"a b") == successor_tokenize("a b")
    assert model.tokenize("é".encode()) == successor_tokenize("é")
    assert b"".join(model.piece(t) for t in model.tokenize(b"<s>x</s>", add_special=False)) == b"<s>x</s>"


@pytest.mark.parametrize("beside", [True, False], ids=["made beside", "made in place"])
def test_sequences_grow_when_more_contexts_compute(fake_model: pathlib.Path, beside: bool) -> None:
    """Two sequences to start with; eight contexts computing at once make the worker move to bigger
    contexts (the running jobs' cells moved over) until all eight decode together."""
    worker = make_worker(fake_model, n_seq=2, delay=0.002, grow_to=8, beside=beside)
    results: list[GenerationResult] = []

    def run(prompt: str) -> None:
        results.append(worker.submit(request(prompt, limit=20), ContextState()))

    threads = [threading.Thread(target=run, args=("a",)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [text(r) for r in results] == ["bcdefghijklmnopqrstu"] * 8
    assert (len(worker.slots), worker.sequences_high_water) == (8, 8)
    assert worker.growths in (1, 2), "2 -> 8, or 2 -> 4 -> 8 when the contexts arrive one by one"
    worker.close()


def test_running_jobs_decode_while_a_bigger_context_is_made(fake_model: pathlib.Path) -> None:
    """With room in the budget the bigger context is made on a thread of its own: the jobs already
    running go on stepping until it is there (none waits for the new KV cache), then the worker moves
    to it and the jobs that waited for a sequence start; every output is the one decoded alone."""
    release = threading.Event()
    asked = threading.Event()

    def held(make: Callable[[], Context]) -> Callable[[], Context]:
        def made() -> Context:
            asked.set()
            release.wait(WAIT)
            return make()

        return made

    worker = make_worker(fake_model, n_seq=2, delay=0.001, grow_to=8, maker=held)
    results: dict[int, GenerationResult] = {}

    def run(i: int) -> None:
        results[i] = worker.submit(request("a", limit=40), ContextState())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    assert asked.wait(WAIT), "four contexts on two sequences ask for a bigger context"
    steps = worker.steps
    deadline = time.monotonic() + WAIT
    while worker.steps < steps + 10 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert worker.steps >= steps + 10, "the running jobs step while the bigger context is made"
    assert len(worker.slots) == 2 and worker.growths == 0
    release.set()
    for thread in threads:
        thread.join()
    assert [text(results[i]) for i in range(4)] == [text(worker.submit(request("a", limit=40), ContextState()))] * 4
    assert (len(worker.slots), worker.growths) == (4, 1)
    worker.close()


def test_guests_arriving_over_several_steps_decode_together_in_one_pass(fake_model: pathlib.Path) -> None:
    """After 32 contexts grew the model and left their cells behind, 8 new contexts arriving one step
    apart, whose prompts start as some of the old ones did, take the lowest free sequences: once the
    last arrived, every step decodes all 8 in one pass (llama.cpp splits a batch at each gap in its
    sequence ids, and each pass costs a step's fixed cost on a GPU)."""
    worker = make_worker(fake_model, n_seq=4, delay=0.001, grow_to=64)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def run_all(prompts: list[str], gap_steps: int = 0) -> list[GenerationResult]:
        results: dict[int, GenerationResult] = {}

        def run(i: int) -> None:
            state = ContextState()
            results[i] = worker.submit(request(prompts[i], limit=40), state)
            worker.release(state)

        threads = []
        for i in range(len(prompts)):
            steps = worker.steps
            threads.append(threading.Thread(target=run, args=(i,)))
            threads[-1].start()
            while gap_steps and worker.steps < steps + gap_steps and any(t.is_alive() for t in threads):
                time.sleep(0.0002)
        for thread in threads:
            thread.join()
        return [results[i] for i in range(len(prompts))]

    run_all([letters[i % 26] + "5" for i in range(32)])
    assert len(worker.slots) >= 16
    seen: list[list[int]] = []
    decode = worker.context.decode

    def recording(batch: Any, first: int = 0, count: int | None = None) -> int:
        tokens = batch.tokens[first:] if count is None else batch.tokens[first : first + count]
        seen.append(sorted({seq for _, _, seq, _ in tokens}))
        return decode(batch, first, count)

    worker.context.decode = recording  # type: ignore[method-assign]
    prompts = [letters[i] + str(i % 10) for i in range(0, 16, 2)]  # each shares BOS and a letter with old cells
    results = run_all(prompts, gap_steps=1)
    assert [text(r) for r in results] == [successor_text(p, 40) for p in prompts]
    arrived = next(i for i in range(len(seen)) if len(set().union(*seen[: i + 1])) == 8)
    together = [i for i, seqs in enumerate(seen) if len(seqs) == 8]
    assert together[0] == arrived, "the last guest's first decode is every guest's"
    assert together == list(range(arrived, together[-1] + 1)) and len(together) >= 10, "together until one ends"
    for seqs in seen:
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"a gap in the sequence ids {seqs}"
    worker.close()


@dataclasses.dataclass
class _Span:
    """An image's place in a prompt, as ``vision.ImageSpan`` holds it (without its libmtmd chunk)."""

    start: int
    n_tokens: int
    n_pos: int


def test_positions_after_m_rope_images_advance_by_their_positions_not_their_tokens() -> None:
    from wasinn_host.core.scheduling.scheduler import Job

    job = Job(GenerationRequest((1,) * 20, 0, GREEDY, StopParams()), ContextState())
    job.images = {3: _Span(3, 4, 2), 10: _Span(10, 6, 6)}  # an M-RoPE image, then an ordinary one
    assert [job.position(i) for i in range(20)] == [0, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]


def test_steps_with_nothing_arriving_admit_nothing_and_decode_the_plan_carried(fake_model: pathlib.Path) -> None:
    """Admission looks at the queue only when a job waits, and a plan of one token for each running job
    is decoded again without planning (each job's token and position written where its last one was)
    until a job starts or ends; the outputs are those of each job alone."""
    worker = make_worker(fake_model, n_seq=4)
    endless = StopParams(ignore_eos=True)
    alone = {p: text(worker.submit(request(p, limit=30, stopping=endless), ContextState())) for p in "abc"}
    assert worker.admissions == 3
    steps, carried, rewrites = worker.steps, worker.carried_plans, worker._batch.rewrites  # type: ignore[attr-defined]
    results: dict[str, GenerationResult] = {}
    barrier = threading.Barrier(3)

    def run(prompt: str, limit: int) -> None:
        barrier.wait()
        results[prompt] = worker.submit(request(prompt, limit=limit, stopping=endless), ContextState())

    threads = [threading.Thread(target=run, args=(p, n)) for p, n in (("a", 30), ("b", 30), ("c", 12))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {p: text(r) for p, r in results.items()} == {"a": alone["a"], "b": alone["b"], "c": alone["c"][:12]}
    assert worker.steps - steps >= 30
    assert 4 <= worker.admissions <= 6, "one pass per arrival at most, none on the steps between"
    # at most a few steps are planned: the jobs' arrivals, their prompts' step, and "c" ending
    assert worker.carried_plans - carried >= worker.steps - steps - 8
    assert worker._batch.rewrites - rewrites >= 2 * 18 + 3  # type: ignore[attr-defined]
    worker.close()


def test_a_carried_plan_of_greedy_jobs_takes_each_rows_argmax_after_its_first_token(fake_model: pathlib.Path) -> None:
    """Four greedy contexts that computed their prompt first (``n-predict`` 1) ask for more together: the
    first step decodes each one's last prompt token again (a plan carried from its first step), the next
    steps read row i as job i's (no per-job dispatch), and each answers as it does alone, its first token
    timed (the step that samples it goes through the general path)."""
    worker = make_worker(fake_model, delay=0.002)
    fast: list[int] = []
    use_greedy_rows = worker._use_greedy_rows

    def counted(jobs: list[Any]) -> None:
        fast.append(len(jobs))
        use_greedy_rows(jobs)

    worker._use_greedy_rows = counted  # type: ignore[method-assign]
    prompts, limits = ["a", "k3", "q", "5"], [20, 12, 9, 16]
    results: dict[int, GenerationResult] = {}
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        state = ContextState()
        assert text(worker.submit(request(prompts[i], limit=1), state)) == successor_text(prompts[i], 1)
        barrier.wait()
        results[i] = worker.submit(request(prompts[i], limit=limits[i]), state)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    worker.close()
    assert [text(results[i]) for i in range(4)] == [successor_text(p, n) for p, n in zip(prompts, limits)]
    assert all(results[i].reused_tokens > 0 for i in range(4)), "the second computes kept their prompts' cells"
    assert all(results[i].generation_ms > 0 for i in range(4)), "each first token was timed"
    assert sum(fast) >= 20, "the carried steps took the greedy rows together"
