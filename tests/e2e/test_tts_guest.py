"""Text to speech as WasmEdge's GGML plugin does it (issue 32), on the project's tiny OuteTTS and WavTokenizer models.

``guest_examples/tts.wasm`` (a C port of WasmEdge-WASINN-examples' ``wasmedge-ggml/tts``: same environment
variables and keys) runs through ``wasinn run`` with WasmEdge's command line and through ``WasiNN.run``;
the WAV it gets from ``get_output(0)`` and the file the host writes must be the same bytes, a valid 24 kHz
16-bit mono WAV of 320 samples per audio code, and equal to a reference computed here from the same codes:
the vocoder's frames from llama.cpp directly, then the tool's inverse transform written out with numpy.
"""

from __future__ import annotations

import ctypes
import pathlib
import struct
import subprocess
import sys

import llama_cpp
import numpy as np
import pytest

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.llama import devices
from wasinn_host.testing.tts_models import (
    CHAIN,
    TEST_SPEAKER,
    write_outetts_model,
    write_speaker_file,
    write_wavtokenizer_model,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUEST = ROOT / "guest_examples" / "tts.wasm"
TEXT = "Hello, world 42."
PCM_TOLERANCE = 10 if devices.can_offload() else 1
"""How far (in 16-bit sample units) the host's WAV may be from the numpy reference.  On the CPU 1: the
host's inverse transform (``core/tts/audio.py``) and this one differ in their last rounding.  On a build
with a GPU backend (``devices.can_offload()``) the vocoder's frames come from the GPU's kernels, which do
not promise the same floats in the host's call and the reference's: the samples differed by up to 5 there
(an H100, CUDA 13.0), so twice that is allowed."""


@pytest.fixture(scope="module")
def tts_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A directory with the OuteTTS model, the vocoder and a speaker file (the guest's ``.``)."""
    folder = tmp_path_factory.mktemp("tts")
    write_outetts_model(folder / "outetts.gguf")
    write_wavtokenizer_model(folder / "wavtokenizer.gguf")
    write_speaker_file(folder / "speaker.json", TEST_SPEAKER)
    return folder


def guest_env(seed: int | None = None) -> dict[str, str]:
    env = {
        "tts": "true",
        "tts_output_file": "output.wav",
        "tts_speaker_file": "speaker.json",
        "model_vocoder": "wavtokenizer.gguf",
    }
    return env if seed is None else {**env, "seed": str(seed), "temp": "1.0"}


def native_frames(vocoder: pathlib.Path, codes: list[int]) -> np.ndarray:
    """llama.cpp alone: the vocoder's 1282 outputs per code (``llama_encode`` of one batch, as the tool does)."""
    model = llama_cpp.llama_model_load_from_file(str(vocoder).encode(), llama_cpp.llama_model_default_params())
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 512
    cparams.embeddings = True
    context = llama_cpp.llama_init_from_model(model, cparams)
    batch = llama_cpp.llama_batch_init(len(codes), 0, 1)
    try:
        for i, code in enumerate(codes):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = code, i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(codes)
        assert llama_cpp.llama_encode(context, batch) == 0
        width = llama_cpp.llama_model_n_embd_out(model)
        data = ctypes.cast(llama_cpp.llama_get_embeddings(context), ctypes.POINTER(ctypes.c_float))
        return np.array(data[: len(codes) * width], dtype=np.float32).reshape(len(codes), width)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)


def reference_pcm(frames: np.ndarray) -> np.ndarray:
    """llama.cpp's ``embd_to_audio`` and ``save_wav16`` written out: the tool's DFT sum per frame, Hann
    window, fold with pad 480, division by the folded squared window, 0.25 s muted, int16."""
    n_codes, n_fft, n_hop, n_pad, n_bins = len(frames), 1280, 320, 480, 641
    k = np.arange(n_fft)[:, None]
    m = np.arange(n_bins)[None, :]
    cos, sin = np.cos(2 * np.pi * k * m / n_fft), np.sin(2 * np.pi * k * m / n_fft)
    hann = 0.5 * (1 - np.cos(2 * np.pi * np.arange(n_fft) / n_fft))
    n_out = (n_codes - 1) * n_hop + n_fft
    audio, env = np.zeros(n_out), np.zeros(n_out)
    for col in range(n_codes):
        mag = np.minimum(np.exp(frames[col, :n_bins].astype(np.float64)), 100.0)
        phi = frames[col, n_bins:].astype(np.float64)
        re, im = mag * np.cos(phi), mag * np.sin(phi)
        frame = (cos @ re - sin @ im) / n_bins * hann
        for j in range(n_fft):
            at = col * n_hop - n_pad + j
            if 0 <= at < n_out:
                audio[at] += frame[j]
                env[at] += hann[j] * hann[j]
    out = audio[: n_out - 2 * n_pad] / env[: n_out - 2 * n_pad]
    out[:6000] = 0.0
    return np.trunc(np.clip(out * 32767.0, -32768, 32767)).astype(np.int16)


def parse_wav(data: bytes) -> tuple[int, np.ndarray]:
    """(sample rate, samples) of a 16-bit mono PCM WAV, its header checked field by field."""
    riff, size, wave, fmt, fmt_size, pcm, channels, rate, byte_rate, align, bits, tag, n = struct.unpack(
        "<4sI4s4sIHHIIHH4sI", data[:44]
    )
    assert (riff, wave, fmt, tag) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert (size, fmt_size, pcm, channels, bits) == (len(data) - 8, 16, 1, 1, 16)
    assert (byte_rate, align, n) == (rate * 2, 2, len(data) - 44)
    return rate, np.frombuffer(data[44:], dtype="<i2")


def test_wasmedge_command_line_writes_the_wav(tts_dir: pathlib.Path) -> None:
    """WasmEdge's README command line, through ``wasinn run``: the file and ``get_output(0)`` are one WAV of
    the 40 codes the model generates, equal to the reference from the same codes."""
    for old in ("output.wav", "output-buffer.wav"):
        (tts_dir / old).unlink(missing_ok=True)
    env_args = [arg for key, value in guest_env().items() for arg in ("--env", f"{key}={value}")]
    result = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "run", "--dir", ".:.", *env_args, "--nn-preload"]
        + ["default:GGML:AUTO:outetts.gguf", str(GUEST), "default", TEXT],
        capture_output=True,
        text=True,
        cwd=tts_dir,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"Prompt:\n{TEXT}\n" in result.stdout and "[INFO] Number of input tokens: " in result.stdout
    wav = (tts_dir / "output.wav").read_bytes()
    assert (tts_dir / "output-buffer.wav").read_bytes() == wav
    rate, samples = parse_wav(wav)
    assert rate == 24000 and len(samples) == 320 * len(CHAIN)
    expected = reference_pcm(native_frames(tts_dir / "wavtokenizer.gguf", list(CHAIN)))
    assert np.abs(samples.astype(np.int32) - expected).max() <= PCM_TOLERANCE
    assert np.abs(samples[6000:]).max() > 100 and not samples[:6000].any()


def test_embedding_api_gives_the_same_wav(tts_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``WasiNN.run`` with the same environment (files in another directory): the same bytes as the CLI's."""
    for name in ("outetts.gguf", "wavtokenizer.gguf", "speaker.json"):
        (tmp_path / name).write_bytes((tts_dir / name).read_bytes())  # a link out of the dir is refused
    registry = ModelRegistry()
    try:
        nn = WasiNN(preload=[f"default:GGML:AUTO:{tts_dir / 'outetts.gguf'}"], registry=registry)
        options = RunOptions(env=guest_env(), dirs=[(str(tmp_path), ".")])
        assert nn.run(GUEST, ["default", TEXT], options) == 0
    finally:
        registry.close()
    wav = (tmp_path / "output.wav").read_bytes()
    rate, samples = parse_wav(wav)
    assert rate == 24000 and len(samples) == 320 * len(CHAIN)
    expected = reference_pcm(native_frames(tts_dir / "wavtokenizer.gguf", list(CHAIN)))
    assert np.abs(samples.astype(np.int32) - expected).max() <= PCM_TOLERANCE
