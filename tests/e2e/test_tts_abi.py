"""A TTS graph (issue 32) call by call through the ``wasi_ephemeral_nn`` ABI, on the project's tiny models.

The metadata counts the prompt's tokens and, after compute, the audio codes (as WasmEdge reports them);
a fixed seed gives the same WAV and another seed another; OuteTTS 0.3 prompts use ``<|space|>``; and the
errors are WasmEdge's: a missing or wrong vocoder and a bad speaker file are invalid arguments (1), an
output larger than the guest's buffer is too large (7) with the size needed, a file that cannot be
written a runtime error (5) with the WAV still in the output.
"""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Iterator

import pytest

from wasinn_host import Errno, ModelRegistry, WasiNN
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.tts.speaker import default_speaker_words
from wasinn_host.llama.model import LlamaModel
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.tts_models import (
    CHAIN,
    TEST_SPEAKER,
    write_outetts_model,
    write_speaker_file,
    write_wavtokenizer_model,
)

TTS = {"tts": True, "model-vocoder": "voc.gguf", "tts-speaker-file": "speaker.json", "batch-size": 512}
WAV_BYTES = 44 + 2 * 320 * len(CHAIN)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("tts-abi")
    write_outetts_model(folder / "tts02.gguf")
    write_outetts_model(folder / "tts03.gguf", version="0.3")
    write_outetts_model(folder / "tts-random.gguf", random_codes=True)
    write_wavtokenizer_model(folder / "voc.gguf")
    write_speaker_file(folder / "speaker.json", TEST_SPEAKER)
    (folder / "bad-speaker.json").write_text('{"words": [{"word": "hi", "codes": [1]}]}')
    return folder


@pytest.fixture(scope="module")
def nn(files: pathlib.Path) -> Iterator[WasiNN]:
    registry = ModelRegistry([f"{name}:GGML:AUTO:{files / name}.gguf" for name in ("tts02", "tts03", "tts-random")])
    yield WasiNN(registry=registry)
    registry.close()


def guest(nn: WasiNN, files: pathlib.Path) -> AbiGuest:
    return AbiGuest.create(nn, dirs=[(str(files), ".")])


def speak(g: AbiGuest, name: str, config: dict[str, object], text: str = "Hello world") -> tuple[int, int]:
    """Load ``name`` with ``config``, set ``text``; return (compute errno, context)."""
    rc, graph = g.load_by_name(name, json.dumps(config))
    assert rc == 0
    rc, ctx = g.init(graph)
    assert rc == 0 and g.set_input(ctx, 0, text) == 0
    return g.call("compute", ctx), ctx


def metadata(g: AbiGuest, ctx: int) -> dict[str, object]:
    rc, raw = g.get_output(ctx, 1)
    assert rc == 0
    return dict(json.loads(raw))


def test_metadata_counts_prompt_tokens_and_audio_codes(nn: WasiNN, files: pathlib.Path) -> None:
    g = guest(nn, files)
    rc, ctx = speak(g, "tts02", {**TTS, "tts-output-file": "out02.wav"})
    assert rc == 0
    meta = metadata(g, ctx)
    assert meta["output_tokens"] == len(CHAIN)  # the codes, not the <|code_start|> ... <|im_end|> around them
    model = LlamaModel(files / "tts02.gguf", ModelParams())
    try:
        prompt = (
            "<|im_start|>\n<|text_start|>hello<|text_sep|>there<|text_sep|>hello<|text_sep|>world<|text_end|>\n"
            "<|audio_start|>\nhello<|t_0.24|><|code_start|><|3|><|9|><|27|><|17|><|code_end|>\n"
            "there<|t_0.16|><|code_start|><|5|><|33|><|code_end|>\n"
        )
        assert meta["input_tokens"] == len(model.tokenize(prompt.encode()))
    finally:
        model.close()
    rc, wav = g.get_output(ctx, 0, size=WAV_BYTES)
    assert rc == 0 and wav == (files / "out02.wav").read_bytes() and len(wav) == WAV_BYTES


def test_outetts_03_prompt_from_the_chat_template(nn: WasiNN, files: pathlib.Path) -> None:
    """A model whose chat template is ``outetts-0.3`` gets the 0.3 prompt: ``<|space|>`` and no ``<|code_start|>``."""
    g = guest(nn, files)
    rc, ctx = speak(g, "tts03", {**TTS, "tts-output-file": "out03.wav"}, "Hello world")
    assert rc == 0
    model = LlamaModel(files / "tts03.gguf", ModelParams())
    try:
        prompt = (
            "<|im_start|>\n<|text_start|>hello<|space|>there<|space|>hello<|space|>world<|text_end|>\n"
            "<|audio_start|>\nhello<|t_0.24|><|3|><|9|><|27|><|17|><|space|>\nthere<|t_0.16|><|5|><|33|><|space|>\n"
        )
        assert metadata(g, ctx)["input_tokens"] == len(model.tokenize(prompt.encode()))
    finally:
        model.close()
    assert len((files / "out03.wav").read_bytes()) == WAV_BYTES


def test_a_fixed_seed_gives_the_same_wav(nn: WasiNN, files: pathlib.Path) -> None:
    """Sampled codes (a model drawing each code uniformly): the same seed the same WAV; another seed another."""
    wavs = []
    for seed in (7, 7, 8):
        g = guest(nn, files)
        rc, ctx = speak(g, "tts-random", {**TTS, "seed": seed, "temp": 1.0, "n-predict": 64, "tts-output-file": ""})
        assert rc == 0
        n_codes = metadata(g, ctx)["output_tokens"]
        rc, wav = g.get_output(ctx, 0, size=0x10000)
        assert rc == 0 and n_codes == 63 and len(wav) == 44 + 640 * 63  # n-predict 64: <|code_start|>, 63 codes
        assert struct.unpack("<I", wav[24:28]) == (24000,)
        wavs.append(wav)
    assert wavs[0] == wavs[1] and wavs[0] != wavs[2]


def test_output_larger_than_the_guest_buffer_is_too_large(nn: WasiNN, files: pathlib.Path) -> None:
    g = guest(nn, files)
    rc, ctx = speak(g, "tts02", {**TTS, "tts-output-file": ""})
    assert rc == 0
    assert g.get_output(ctx, 0, size=WAV_BYTES - 1) == (Errno.TOO_LARGE, b"")
    assert g.u32(g.OUT32) == WAV_BYTES  # the size needed, as WasmEdge's master reports it


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"tts": True}, "needs 'model-vocoder'"),
        ({"tts": True, "model-vocoder": "missing.gguf"}, "'missing.gguf' is not a file inside"),
        ({"tts": True, "model-vocoder": "/etc/passwd"}, "'/etc/passwd' is not a file inside"),
        ({"tts": True, "model-vocoder": "tts02.gguf"}, "expected a WavTokenizer decoder"),
    ],
)
def test_a_missing_or_wrong_vocoder_fails_the_load(
    nn: WasiNN, files: pathlib.Path, caplog: pytest.LogCaptureFixture, config: dict[str, object], needle: str
) -> None:
    g = guest(nn, files)
    assert g.load_by_name("tts02", json.dumps(config))[0] == Errno.INVALID_ARGUMENT
    assert needle in caplog.text


def test_a_bad_speaker_file_fails_set_input(nn: WasiNN, files: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """WasmEdge fails ``set_input`` when the speaker profile cannot be read; the key may change per context."""
    g = guest(nn, files)
    rc, graph = g.load_by_name("tts02", json.dumps(TTS))
    assert rc == 0
    for speaker, needle in (
        ("bad-speaker.json", "is not a speaker profile ('duration')"),
        ("nope.json", "cannot read"),
    ):
        rc, ctx = g.init(graph)
        assert g.set_input(ctx, 1, json.dumps({"tts-speaker-file": speaker})) == 0
        assert g.set_input(ctx, 0, "hi") == Errno.INVALID_ARGUMENT
        assert needle in caplog.text


def test_an_unwritable_output_file_is_a_runtime_error_with_the_wav_kept(nn: WasiNN, files: pathlib.Path) -> None:
    g = guest(nn, files)
    rc, ctx = speak(g, "tts02", {**TTS, "tts-output-file": "../outside.wav"})
    assert rc == Errno.RUNTIME_ERROR
    assert not (files.parent / "outside.wav").exists()
    rc, wav = g.get_output(ctx, 0, size=WAV_BYTES)
    assert rc == 0 and wav[:4] == b"RIFF" and len(wav) == WAV_BYTES


def test_the_same_model_without_tts_answers_text(nn: WasiNN, files: pathlib.Path) -> None:
    """``tts`` off (or absent): the prompt is the text as given and the output the generated tokens' text."""
    g = guest(nn, files)
    rc, graph = g.load_by_name("tts02", json.dumps({"tts": False, "model-vocoder": "voc.gguf"}))
    assert rc == 0
    rc, text = g.generate(graph, "hi\n", '{"temp": 0}')
    codes = "".join(f"<|{code}|>" for code in CHAIN)
    assert rc == 0 and text == f"<|code_start|>{codes}<|code_end|><|audio_end|><|im_end|>"


def test_without_a_speaker_file_the_default_speaker_speaks(nn: WasiNN, files: pathlib.Path) -> None:
    """WasmEdge's default speaker (OuteTTS's en_female_1, 40 words) when no ``tts-speaker-file`` is given."""
    g = guest(nn, files)
    config = {"tts": True, "model-vocoder": "voc.gguf", "ctx-size": 16384, "batch-size": 4096, "tts-output-file": ""}
    rc, ctx = speak(g, "tts02", config, "Hi")
    assert rc == 0
    meta = metadata(g, ctx)
    words = default_speaker_words()
    text = "".join(f"{word}<|text_sep|>" for word, _, _ in words)
    data = "".join(
        f"{word}<|t_{duration:.2f}|><|code_start|>{''.join(f'<|{c}|>' for c in codes)}<|code_end|>\n"
        for word, duration, codes in words
    )
    prompt = f"<|im_start|>\n<|text_start|>{text}hi<|text_end|>\n<|audio_start|>\n{data}"
    model = LlamaModel(files / "tts02.gguf", ModelParams())
    try:
        assert meta["input_tokens"] == len(model.tokenize(prompt.encode()))
    finally:
        model.close()
    assert meta["output_tokens"] == len(CHAIN)
