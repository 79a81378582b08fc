"""What the suite assumes about llama.cpp's numerics, measured on the machine it runs on.

A test may compare texts made under different batch shapes only in three ways
(:mod:`wasinn_host.testing.numerics`): against llama.cpp making the same calls; on a constructed
model whose margins dwarf the noise; or token by token within ``MARGIN`` of llama.cpp's best for the
same prefix.  This file checks the facts those rest on, here, on this CPU: the real models' gaps
between tokens move by less than ``MARGIN`` between the shapes the host decodes in (alone, on one
thread or two, a prompt in two pieces, four sequences per batch, a draft's tokens verified
together); the constructed models give bit-identical logits in all of them (on the CPU; with the
layers on a GPU, within a stated tolerance); the demo model's
hard-coded answers lead by a wide margin; and the rule's own bookkeeping.  A failure here names the
shape and the numbers, before any test comparing texts fails for a reason it cannot name.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from wasinn_host.llama import devices
from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.gguf_models import write_successor_model
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.numerics import MARGIN, Step, check_forced, check_greedy, forced, gap_drift, step_of
from wasinn_host.testing.real_models import real_model_or_skip

ROOT = Path(__file__).resolve().parents[2]
N_STEPS = 8
N_CTX = 512
PROMPTS = [
    b"1 2 3 4 5 6 7",
    b"The recipe for pancakes:",
    b"Once upon a time in a small village",
    b"The museum opens at nine in the morning and closes at six in the evening. Tickets cost twelve euros for "
    b"adults and six euros for children under fourteen. Guided tours start every hour from the main hall. "
    b"Photographs without flash are allowed",
]
"""Short and long prompts: the last is over 64 tokens, where flash attention tiles the queries."""

Logits = list[list[np.ndarray]]
"""Per prompt, the logits of each step."""


def _batch() -> Any:
    return llama_cpp.llama_batch_init(2048, 0, len(PROMPTS))


def alone(native: NativeModel, prompts: list[list[int]], tokens: list[list[int]], threads: int = 0) -> Logits:
    """Each prompt in its own context, in one decode, then one token per decode (as the host alone)."""
    out: Logits = []
    for prompt, continuation in zip(prompts, tokens):
        ctx, batch = native.context(N_CTX, threads=threads), _batch()
        try:
            native.decode(ctx, batch, prompt, 0)
            steps = [native.logits(ctx)]
            for i, token in enumerate(continuation[:-1]):
                native.decode(ctx, batch, [token], len(prompt) + i)
                steps.append(native.logits(ctx))
            out.append(steps)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
    return out


def one_thread(native: NativeModel, prompts: list[list[int]], tokens: list[list[int]]) -> Logits:
    return alone(native, prompts, tokens, threads=1)


def split(native: NativeModel, prompts: list[list[int]], tokens: list[list[int]]) -> Logits:
    """Each prompt decoded in two pieces (as a prompt after reused or copied cells), then alone."""
    out: Logits = []
    for prompt, continuation in zip(prompts, tokens):
        ctx, batch, half = native.context(N_CTX), _batch(), len(prompt) // 2
        try:
            native.decode_items(ctx, batch, [(t, i, 0, False) for i, t in enumerate(prompt[:half])])
            native.decode(ctx, batch, prompt[half:], half)
            steps = [native.logits(ctx)]
            for i, token in enumerate(continuation[:-1]):
                native.decode(ctx, batch, [token], len(prompt) + i)
                steps.append(native.logits(ctx))
            out.append(steps)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
    return out


def batched(native: NativeModel, prompts: list[list[int]], tokens: list[list[int]]) -> Logits:
    """All prompts in one decode of a context of several sequences, then one token of each per decode."""
    ctx, batch = native.context(N_CTX, n_seq=len(prompts)), _batch()
    out: Logits = [[] for _ in prompts]
    try:
        items = [(t, i, s, i == len(p) - 1) for s, p in enumerate(prompts) for i, t in enumerate(p)]
        native.decode_items(ctx, batch, items)
        ends = np.cumsum([len(p) for p in prompts]) - 1
        for s in range(len(prompts)):
            out[s].append(native.logits(ctx, int(ends[s])))
        for step in range(N_STEPS - 1):
            native.decode_items(ctx, batch, [(tokens[s][step], len(p) + step, s, True) for s, p in enumerate(prompts)])
            for s in range(len(prompts)):
                out[s].append(native.logits(ctx, s))
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return out


def verified(native: NativeModel, prompts: list[list[int]], tokens: list[list[int]]) -> Logits:
    """Each prompt alone, then its tokens four per decode with logits at each (a draft's verification)."""
    out: Logits = []
    for prompt, continuation in zip(prompts, tokens):
        ctx, batch = native.context(N_CTX), _batch()
        try:
            native.decode(ctx, batch, prompt, 0)
            steps = [native.logits(ctx)]
            rest = continuation[:-1]
            for start in range(0, len(rest), 4):
                chunk = rest[start : start + 4]
                native.decode_items(ctx, batch, [(t, len(prompt) + start + i, 0, True) for i, t in enumerate(chunk)])
                steps += [native.logits(ctx, i) for i in range(len(chunk))]
            out.append(steps)
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
    return out


SHAPES: dict[str, Callable[[NativeModel, list[list[int]], list[list[int]]], Logits]] = {
    "one thread": one_thread,
    "prompt in two pieces": split,
    "four sequences per batch": batched,
    "four tokens verified together": verified,
}


def reference(native: NativeModel, prompts: list[bytes]) -> tuple[list[list[int]], list[list[int]], Logits]:
    """The prompts' tokens, the greedy continuations decoded alone, and their logits."""
    tokens = [native.tokenize(p) for p in prompts]
    continuations = [native.generate(p, N_STEPS, n_ctx=N_CTX) for p in tokens]
    continuations = [c + [c[-1]] * (N_STEPS - len(c)) for c in continuations]  # an early end: fed on the same
    return tokens, continuations, alone(native, tokens, continuations)


@dataclass
class Measured:
    """A model with :data:`PROMPTS`' tokens, their greedy continuations alone and those steps' logits."""

    name: str
    native: NativeModel
    prompts: list[list[int]]
    continuations: list[list[int]]
    expected: Logits


@pytest.fixture(scope="module", params=["smollm2", "gemma3", "demo"])
def real(request: pytest.FixtureRequest) -> Iterator[Measured]:
    """The real models, and the demo model (trained, F16) for comparison."""
    path = DEMO_MODEL_PATH if request.param == "demo" else real_model_or_skip(request.param)
    native = NativeModel(path, threads=2)
    yield Measured(request.param, native, *reference(native, PROMPTS))
    native.close()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_real_model_gaps_move_less_than_the_margin(
    real: Measured, shape: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The margin rule holds on this CPU: between decoding alone and ``shape``, no gap between a step's
    best token and its runners-up moves by ``MARGIN`` or more."""
    got = SHAPES[shape](real.native, real.prompts, real.continuations)
    drift = max(gap_drift(e, g) for es, gs in zip(real.expected, got) for e, g in zip(es, gs))
    with capsys.disabled():
        print(f"\n{real.name}, {shape}: gaps moved by up to {drift:.4f} logits (margin {MARGIN})")
    assert drift < MARGIN, f"{real.name}, {shape}: a gap moved by {drift:.3f} logits; the rule assumes < {MARGIN}"


# -- constructed models: exact whatever the batch ---------------------------------------


@pytest.fixture(scope="module")
def constructed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("exact")
    return {
        "successor": write_successor_model(directory / "successor.gguf"),
        "successor F16": write_successor_model(directory / "successor-f16.gguf", f16=True, n_layer=3),
        "noisy (gap 1)": write_successor_model(directory / "noisy.gguf", logit_gap=1.0),
        "mixed (gap 4)": write_successor_model(directory / "mixed.gguf", logit_gap=4.0),
    }


OFFLOADED = devices.can_offload() and llama_cpp.llama_model_default_params().n_gpu_layers != 0
"""Whether ``NativeModel`` (llama.cpp's default model parameters) puts the layers on a GPU here."""
OFFLOADED_RTOL = 2.0**-8
"""On a GPU, how far a constructed model's logit may move between shapes, relative to the step's largest:
a batch's matrix products there may round the activations (and the products) to F16 or TF32, 2**-11
each, where one token's keep F32.  The successor still leads by 20 (1 and 4 in the noisy models) less
0.4 %, so greedy texts are equal; a sampled token's probability moves by under 0.4 % of itself."""


@pytest.mark.parametrize("name", ["successor", "successor F16", "noisy (gap 1)", "mixed (gap 4)"])
def test_constructed_models_give_the_same_logits_in_every_shape(constructed: dict[str, Path], name: str) -> None:
    """The successor models' logits are exact on the CPU (one nonzero product per logit), so tests may
    compare their texts, sampled ones too, across batch shapes, threads and CPUs.  With the layers on a
    GPU, which does not promise that, they are within ``OFFLOADED_RTOL`` and pick the same greedy token."""
    native = NativeModel(constructed[name], threads=2)
    try:
        prompts, continuations, expected = reference(native, [b"abc", b"hello world", b"0123", b"xy" * 50])
        for shape, run in SHAPES.items():
            got = run(native, prompts, continuations)
            for es, gs in zip(expected, got):
                for step, (e, g) in enumerate(zip(es, gs)):
                    where = f"{name}, {shape}, step {step}"
                    if not OFFLOADED:
                        assert np.array_equal(e, g), f"{where}: logits differ"
                        continue
                    moved, bound = float(np.abs(e - g).max()), OFFLOADED_RTOL * float(np.abs(e).max())
                    assert moved <= bound, f"{where}: a logit moved by {moved:.5f}, over {bound:.5f} (on a GPU)"
                    assert int(np.argmax(e)) == int(np.argmax(g)), f"{where}: another greedy token (on a GPU)"
    finally:
        native.close()


# -- the demo model's answers the suite spells out ----------------------------------------

DEMO_MARGIN = MARGIN
"""The demo model's gaps move far less than the real models' (measured above); its spelled-out answers
lead by more than the real models' bound all the same."""


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n", "42"),
        ("<|im_start|>user\n12+30=<|im_end|>\n<|im_start|>assistant\n", "42"),
        ("<|im_start|>user\nWhat is 7-19?<|im_end|>\n<|im_start|>assistant\n", "-12"),
        (
            "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 5+5?<|im_end|>\n"
            "<|im_start|>assistant\n10<|im_end|><|im_end|>\n<|im_start|>user\nWhat is 12+30?<|im_end|>\n"
            "<|im_start|>assistant\n",
            "42",
        ),
    ],
)
def test_demo_model_answers_lead_by_a_wide_margin(prompt: str, answer: str) -> None:
    """``test_demo_model``, ``test_cli`` and ``test_pytest_plugin`` expect these answers on any machine."""
    native = NativeModel(DEMO_MODEL_PATH, threads=2)
    try:
        tokens = native.tokenize(prompt.encode())
        expected = native.tokenize((prompt + answer + "<|im_end|>").encode())[len(tokens) :]
        steps = native.follow(tokens, expected, n_ctx=N_CTX)
        assert [s.best for s in steps] == expected
        assert min(s.margin for s in steps) > DEMO_MARGIN, [round(s.margin, 2) for s in steps]
    finally:
        native.close()


# -- the rule itself -----------------------------------------------------------------------


def test_step_of_reads_the_best_the_shortfall_and_the_margin() -> None:
    step = step_of(np.array([1.0, 5.0, 4.5, -2.0], dtype=np.float32), 2)
    assert (step.token, step.best) == (2, 1)
    assert step.shortfall == pytest.approx(0.5) and step.margin == pytest.approx(0.5)
    assert step.rival_mass == pytest.approx(math.exp(-4) + math.exp(-0.5) + math.exp(-7))
    assert step_of(np.array([3.0, 3.0], dtype=np.float32), 1).best == 0  # the first of equal maxima


def test_check_greedy_allows_close_calls_and_refuses_a_clear_loser() -> None:
    close = [Step(7, 7, 0.0, 5.0, 0.0), Step(3, 4, MARGIN - 0.01, 0.1, 0.9), Step(4, 4, 0.0, MARGIN, 0.1)]
    assert check_greedy(close) == 2  # steps 0 and 2 were forced
    with pytest.raises(AssertionError, match=r"step 1: token 3 is 2\.500 logits below"):
        check_greedy([Step(7, 7, 0.0, 5.0, 0.0), Step(3, 4, 2.5, 2.5, 0.1)])


def test_check_forced_only_where_no_draw_can_differ() -> None:
    sure = Step(5, 5, 0.0, 9.0, 1e-4)  # top-p 0.95 keeps the best alone, even 2 logits closer
    wide = Step(6, 5, 1.0, 1.0, 0.5)  # a draw may well give another token
    assert forced(sure, top_p=0.95) and not forced(wide, top_p=0.95)
    assert forced(Step(5, 5, 0.0, 5.1, 0.2), top_p=0.95, min_p=0.05)  # min-p: the rest 5.1 > 2 + 3.0 below
    assert not forced(Step(5, 5, 0.0, 4.9, 0.2), top_p=0.95, min_p=0.05)
    assert check_forced([sure, wide], top_p=0.95) == 1
    with pytest.raises(AssertionError, match="step 0: token 6 where top-p"):
        check_forced([Step(6, 5, 9.0, 9.0, 1e-4)], top_p=0.95)


# -- CI names the machine -------------------------------------------------------------------


def test_ci_names_the_machine_before_the_tests() -> None:
    """``.ci/run`` prints the CPU, its SIMD flags and llama.cpp's system info (``.ci/machine``) before
    the tests, so a failure on another kind of CPU says which."""
    run = (ROOT / ".ci" / "run").read_text()
    assert run.index(".ci/machine") < run.index("python3 -m pytest")
    done = subprocess.run([str(ROOT / ".ci" / "machine")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = {line.split(maxsplit=1)[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "cores" in lines["cpu"] and len(lines["simd"].split()) > 2, done.stdout
    info = (llama_cpp.llama_print_system_info() or b"").decode().strip()
    assert lines["system"] == f"system info       {info}", done.stdout
