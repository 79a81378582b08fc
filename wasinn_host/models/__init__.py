"""Models shipped inside the package.

``DEMO_MODEL_PATH`` is ``demo-arith.gguf``: a tiny (0.73 M parameters, about 1.5 MB, F16) llama-architecture
model trained from scratch by ``scripts/train_demo_model.py`` (recipe and results in that script's
docstring). It needs no download, loads in milliseconds and lets examples, tests and ``wasinn run`` do
real, checkable inference on a CPU.

What it does: answers 1-3 digit addition and subtraction asked in the last user turn of a ChatML
conversation, greedy-decoding the bare number followed by ``<|im_end|>`` (its eos/eot token)::

    <|im_start|>system\\n...<|im_end|>\\n               (optional, any text)
    <|im_start|>user\\nWhat is 12+30?<|im_end|>\\n      (or the bare form "12-30=")
    <|im_start|>assistant\\n                           -> "42<|im_end|>"  ("-18<|im_end|>")

Earlier user/assistant turns (up to three) may precede the question. Prompts are tokenized with BOS
added and special tokens parsed. Vocabulary: SPM with byte fallback and one token per printable
ASCII character (space is ``▁``, newline the byte token ``<0x0A>``), plus ``<|im_start|>`` and
``<|im_end|>`` as control tokens; the GGUF carries a ChatML ``tokenizer.chat_template`` and
``general.name = wasinn-demo-arith``; context length 512. Anything else (free text, other
operations, longer numbers) yields arbitrary short output.

Held-out accuracy and a reference evaluator: ``scripts/eval_demo_model.py`` (its ``make_problems``
gives held-out prompts with expected answers).
"""

from __future__ import annotations

import pathlib

__all__ = ["DEMO_MODEL_PATH"]

DEMO_MODEL_PATH: pathlib.Path = pathlib.Path(__file__).resolve().parent / "demo-arith.gguf"
