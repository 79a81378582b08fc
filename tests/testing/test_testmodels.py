"""The generated test models behave as documented when llama.cpp runs them."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from wasinn_host.testing.gguf_models import (
    BOS_ID,
    EOS_ID,
    SUCCESSOR_VOCAB_SIZE,
    byte_token_id,
    char_token_id,
    successor_ends_with_eos,
    successor_text,
    successor_tokenize,
    write_random_model,
    write_successor_model,
)

ALPHABET_AFTER_A = "bcdefghijklmnopqrstuvwxyz"


def _load(path: pathlib.Path, n_ctx: int = 256, **kwargs: Any) -> Any:
    """A ``llama_cpp.Llama`` on ``path``: small context, 2 threads, quiet."""
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=2, verbose=False, **kwargs)


def _greedy(llm: Any, prompt: str, max_tokens: int) -> tuple[str, str]:
    """Greedy completion text and finish reason (``"stop"`` at EOS, ``"length"`` at the cap)."""
    out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
    choice = out["choices"][0]
    return choice["text"], choice["finish_reason"]


@pytest.fixture(scope="module")
def successor_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_successor_model(tmp_path_factory.mktemp("models") / "successor.gguf")


@pytest.fixture(scope="module")
def successor(successor_path: pathlib.Path) -> Any:
    return _load(successor_path)


# ---------------------------------------------------------------------------------------------
# Pure Python: the table and the expected continuations
# ---------------------------------------------------------------------------------------------


def test_vocab_ids() -> None:
    assert SUCCESSOR_VOCAB_SIZE == 354
    assert byte_token_id(0) == 3 and byte_token_id(255) == 258
    assert char_token_id(" ") == 259 and char_token_id("a") == 259 + ord("a") - 0x20
    assert char_token_id("~") == SUCCESSOR_VOCAB_SIZE - 1
    assert successor_tokenize("hi") == [BOS_ID, char_token_id("h"), char_token_id("i")]
    assert successor_tokenize("é", add_bos=False) == [byte_token_id(0xC3), byte_token_id(0xA9)]


def test_successor_text_table() -> None:
    assert successor_text("a") == ALPHABET_AFTER_A
    assert successor_text("") == "a" + ALPHABET_AFTER_A
    assert successor_text("XY") == "Z"
    assert successor_text("7", 12) == "890123456789"
    assert successor_text("hello!") == ""
    assert successor_text("a", 3) == "bcd"
    assert successor_ends_with_eos("a") and not successor_ends_with_eos("a", 25)
    assert successor_ends_with_eos("a", 26)
    assert not successor_ends_with_eos("9")
    with pytest.raises(ValueError):
        successor_text("9")


def test_files_are_reproducible(tmp_path: pathlib.Path) -> None:
    first = write_successor_model(tmp_path / "one.gguf").read_bytes()
    assert write_successor_model(tmp_path / "two.gguf").read_bytes() == first

    def small(name: str, seed: int = 0) -> bytes:
        path = write_random_model(tmp_path / name, n_layer=1, n_embd=64, n_head=2, n_ff=64, n_vocab=400, seed=seed)
        return path.read_bytes()

    first = small("r1.gguf")
    assert small("r2.gguf") == first
    assert small("r3.gguf", seed=1) != first


# ---------------------------------------------------------------------------------------------
# llama.cpp runs the successor model as predicted
# ---------------------------------------------------------------------------------------------


def test_alphabet_then_eos(successor: Any) -> None:
    assert _greedy(successor, "a", 64) == (ALPHABET_AFTER_A, "stop")


def test_digit_cycle_runs_to_max_tokens(successor: Any) -> None:
    assert _greedy(successor, "7", 12) == ("890123456789", "length")


@pytest.mark.parametrize("prompt", ["a", "m", "Hello", "XY", "abc 12", "zz", "?", "a b", "café", "9"])
def test_successor_text_matches_llama_cpp(successor: Any, prompt: str) -> None:
    text, reason = _greedy(successor, prompt, 30)
    assert text == successor_text(prompt, 30)
    assert (reason == "stop") == successor_ends_with_eos(prompt, 30)


def test_tokenization_one_token_per_char(successor: Any) -> None:
    tokens = successor.tokenize(b"hello")
    assert tokens == [BOS_ID] + [char_token_id(c) for c in "hello"]
    for text in ["a b~", "tab\there", "naïve"]:
        assert successor.tokenize(text.encode()) == successor_tokenize(text)
        assert successor.detokenize(successor_tokenize(text, add_bos=False)).decode() == text
    assert successor.token_bos() == BOS_ID and successor.token_eos() == EOS_ID
    assert successor.n_vocab() == SUCCESSOR_VOCAB_SIZE


def test_deeper_f16_model(tmp_path: pathlib.Path) -> None:
    path = write_successor_model(tmp_path / "s16.gguf", n_layer=3, f16=True, context_length=64)
    llm = _load(path, n_ctx=64)
    assert _greedy(llm, "a", 64) == (ALPHABET_AFTER_A, "stop")
    assert _greedy(llm, "3", 10) == ("4567890123", "length")


def test_small_gap_samples_randomly(tmp_path: pathlib.Path) -> None:
    llm = _load(write_successor_model(tmp_path / "noisy.gguf", logit_gap=1.0), seed=1)

    def sample(seed: int) -> str:
        llm.set_seed(seed)
        out = llm.create_completion("a", max_tokens=8, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
        return str(out["choices"][0]["text"])

    samples = {sample(seed) for seed in range(4)}
    assert len(samples) > 1
    assert ALPHABET_AFTER_A[:8] not in samples
    assert sample(7) == sample(7)


def test_default_gap_sampling_is_deterministic(successor: Any) -> None:
    for seed in range(3):
        successor.set_seed(seed)
        out = successor.create_completion("a", max_tokens=64, temperature=1.0, top_k=0, top_p=1.0)
        assert out["choices"][0]["text"] == ALPHABET_AFTER_A


# ---------------------------------------------------------------------------------------------
# The random model
# ---------------------------------------------------------------------------------------------


def test_random_model_greedy_is_repeatable(tmp_path: pathlib.Path) -> None:
    path = write_random_model(tmp_path / "random.gguf", n_layer=2, n_embd=256, n_head=4, n_ff=512)
    prompt = "The quick brown fox"
    first = _load(path)
    tokens = first.tokenize(prompt.encode())
    assert tokens == successor_tokenize(prompt)
    greedy = _greedy_tokens(first, tokens, 24)
    assert len(greedy) == 24
    assert _greedy_tokens(first, tokens, 24) == greedy
    assert _greedy_tokens(_load(path), tokens, 24) == greedy


def _greedy_tokens(llm: Any, prompt_tokens: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after a fresh reset (no EOS stop: the random model rarely emits it)."""
    llm.reset()
    out: list[int] = []
    for token in llm.generate(prompt_tokens, temp=0.0, reset=True):
        out.append(token)
        if len(out) == n:
            break
    return out
