"""WavTokenizer spectra to a 24 kHz, 16-bit mono WAV file, as llama.cpp's ``tts`` tool computes it.

The vocoder gives each audio code one frame of 1282 values: 641 log-magnitudes, then 641 phases.  Each
frame becomes a spectrum ``min(exp(m), 100) * e^(i*phase)``, then 1280 samples by the tool's inverse
transform (``Re(sum_m X[m] e^(2 pi i k m / 1280)) / 641``: its "poor man's" irfft, which sums the 641 bins
once each and divides by 641, not the textbook irfft), times a periodic Hann window.  The frames are
overlap-added 320 samples apart, divided by the overlap-added squared window, and cut to
``320 * n_codes`` samples (480 dropped at the start).  The first 0.25 s are zeroed, as the tool and
WasmEdge do, and samples become ``int16(clamp(x * 32767, -32768, 32767))`` (truncated toward zero).
"""

from __future__ import annotations

import struct

import numpy as np

SAMPLE_RATE = 24000
N_FFT = 1280
HOP = 320
N_BINS = N_FFT // 2 + 1
FRAME_WIDTH = 2 * N_BINS
"""Values per code the vocoder must give: 641 magnitudes and 641 phases (WavTokenizer's 1282)."""
PAD = (N_FFT - HOP) // 2
MUTED = SAMPLE_RATE // 4
"""Samples zeroed at the start (0.25 s)."""


def hann_window() -> np.ndarray:
    """The periodic Hann window of ``N_FFT`` points."""
    return 0.5 * (1.0 - np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT))


def _overlap_add(frames: np.ndarray) -> np.ndarray:
    """Frames (n, N_FFT) summed ``HOP`` apart: ``(n - 1) * HOP + N_FFT`` samples."""
    n = len(frames)
    per_hop = N_FFT // HOP
    out = np.zeros((n + per_hop - 1) * HOP)
    for part in range(per_hop):
        out[part * HOP : (part + n) * HOP] += frames[:, part * HOP : (part + 1) * HOP].reshape(-1)
    return out


def spectrum_to_audio(frames: np.ndarray) -> np.ndarray:
    """Vocoder frames (n_codes, 1282) to ``320 * n_codes`` samples (float, about -1..1)."""
    frames = np.asarray(frames, dtype=np.float64)
    magnitude = np.minimum(np.exp(frames[:, :N_BINS]), 100.0)
    phase = frames[:, N_BINS:FRAME_WIDTH]
    spectrum = np.zeros((len(frames), N_FFT), dtype=np.complex128)
    spectrum[:, :N_BINS] = magnitude * np.exp(1j * phase)
    window = hann_window()
    samples = np.fft.ifft(spectrum, axis=1).real * (N_FFT / N_BINS) * window
    audio = _overlap_add(samples)
    envelope = _overlap_add(np.broadcast_to(window * window, samples.shape))
    end = PAD + HOP * len(frames)
    return audio[PAD:end] / envelope[PAD:end]


def wav_bytes(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A mono 16-bit PCM WAV file of ``samples`` (floats; NaN gives 0)."""
    pcm = np.clip(np.nan_to_num(np.asarray(samples, dtype=np.float64)) * 32767.0, -32768.0, 32767.0).astype("<i2")
    data = pcm.tobytes()
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(data),
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        1,  # mono
        sample_rate,
        sample_rate * 2,
        2,
        16,
        b"data",
        len(data),
    )
    return header + data


def speech_wav(frames: np.ndarray) -> bytes:
    """The WAV file of vocoder ``frames``: the audio with its first 0.25 s zeroed."""
    audio = spectrum_to_audio(frames)
    audio[:MUTED] = 0.0
    return wav_bytes(audio)
