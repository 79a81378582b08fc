"""The embedded demo model answers held-out arithmetic in ChatML conversations, through a guest."""

from __future__ import annotations

import pathlib

import pytest
import wasmtime

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.demo_data import VARIANTS, make_problems

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUESTS = ROOT / "guest_examples"

N_PROBLEMS = 200
TARGET = 0.97


@pytest.fixture(scope="module")
def demo() -> WasiNN:
    return WasiNN(preload=[f"default:GGML:AUTO:{DEMO_MODEL_PATH}"], registry=ModelRegistry())


def ask(nn: WasiNN, tmp_path: pathlib.Path, module: wasmtime.Module, prompt: str) -> str:
    out = tmp_path / "answer.txt"
    code = nn.run(
        module,
        ["default", prompt],
        RunOptions(env={"temp": "0", "n_predict": "8"}, stdout=str(out), stderr=str(tmp_path / "err")),
    )
    assert code == 0
    return out.read_text().removesuffix("\n")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_held_out_accuracy_through_a_guest(
    demo: WasiNN, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], variant: str
) -> None:
    """Every spelling of ChatML that real clients use (LlamaEdge's missing newline after
    ``assistant``, a space or newline after the question, history with a repeated end token ...)."""
    module = demo.load_module(GUESTS / "complete.wasm")
    problems = make_problems(N_PROBLEMS, seed=2026, style=VARIANTS[variant])
    wrong = [
        (prompt, expected, got)
        for prompt, expected in problems
        if (got := ask(demo, tmp_path, module, prompt)) != expected + "<|im_end|>"
    ]
    accuracy = 1 - len(wrong) / len(problems)
    with capsys.disabled():
        print(f"\ndemo model, {variant}: {accuracy:.1%} of {len(problems)} held-out problems correct")
    assert accuracy >= TARGET, wrong[:5]


@pytest.mark.parametrize("question,answer", [("What is 12+30?", "42"), ("12+30=", "42"), ("What is 7-19?", "-12")])
def test_both_question_forms_with_history_and_system(
    demo: WasiNN, tmp_path: pathlib.Path, question: str, answer: str
) -> None:
    module = demo.load_module(GUESTS / "complete.wasm")
    bare = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    history = (
        "<|im_start|>system\nYou are a calculator.<|im_end|>\n"
        "<|im_start|>user\nWhat is 5+5?<|im_end|>\n<|im_start|>assistant\n10<|im_end|><|im_end|>\n"
    ) + bare
    assert ask(demo, tmp_path, module, bare) == answer + "<|im_end|>"
    assert ask(demo, tmp_path, module, history) == answer + "<|im_end|>"
