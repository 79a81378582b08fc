"""Text to speech (``tts: true``): OuteTTS prompts in, a 24 kHz WAV file out, as WasmEdge's GGML plugin
and llama.cpp's ``tts`` tool do it.

:mod:`.graph` is what the core does around an ordinary generation (the keys checked at load, the
prompt, the speech written); :mod:`.prompt` builds the OuteTTS prompt from the guest's text, normalised
by :mod:`.text`, and a speaker (:mod:`.speaker`: WasmEdge's default); :mod:`.audio` turns the vocoder's
spectra into the WAV (numpy, imported only by graphs that speak).  The vocoder itself runs in the
backend (``llama/vocoder.py``).
"""
