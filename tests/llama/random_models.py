"""Small random-weight models, written and loaded for one test module (the shape of the fast-step
model at a smaller size: what a test of logits rows needs, in milliseconds)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from contextlib import contextmanager

from wasinn_host.core.config.params import ModelParams
from wasinn_host.llama.model import LlamaModel
from wasinn_host.testing.gguf_models import write_random_model


@contextmanager
def loaded_random_model(directory: pathlib.Path, n_vocab: int, seed: int, n_layer: int = 2) -> Iterator[LlamaModel]:
    """A random model of ``n_vocab`` tokens (64-wide, 2 heads) written in ``directory``, loaded with 2
    threads, closed after the block."""
    path = write_random_model(
        directory / "random.gguf", n_layer=n_layer, n_embd=64, n_head=2, n_ff=128, n_vocab=n_vocab, seed=seed
    )
    model = LlamaModel(path, ModelParams(threads=2))
    try:
        yield model
    finally:
        model.close()
