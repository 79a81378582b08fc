"""A tiny vision model built by the project: a random-weight CLIP projector GGUF, its text model, images.

:func:`write_vision_model` writes two files with the ``gguf`` package, as ``gguf_models.py`` writes
text models: ``text.gguf``, a seeded random llama (64-wide, 2 layers, the successor vocabulary) and
``mmproj.gguf``, a LLaVA-style projector (``clip.projector_type = "mlp"``: a 1-layer ViT of width 32
over 8x8 patches of a 32x32 image, then the two-layer MLP ``mm.0`` / ``mm.2`` into the text model's
64-wide embedding space) that llama.cpp's libmtmd loads.  An image becomes 16 image tokens.  The
weights are random, so the greedy continuation of a prompt depends on the image's pixels: a
different image gives a different answer, the same image the same answer.  ``kind="gemma3"``
writes a Gemma 3-style projector instead (SigLIP encoder, RMS norm and input projection, image
tokens decoded with non-causal attention); ``kind="qwen2vl"`` a Qwen2-VL pair (a ``qwen2vl`` text
model with M-RoPE and a ``qwen2vl_merger`` projector: two patch convolutions, no position
embedding, 2x2 patches merged into one image token, whose positions are 2-D).

:func:`png_bytes` encodes an RGB image as PNG (stored zlib, no dependencies) for tests, and
:func:`img_tag` puts an image inline in a prompt.
"""

from __future__ import annotations

import base64
import os
import pathlib
import struct
import zlib

import numpy as np

from .gguf_models import write_random_model

TEXT_EMBD = 64
IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
"""Image tokens one image becomes (the class embedding is dropped by LLaVA's projector)."""
GUEST_LOGIT_STD = 1000.0
"""Spread of the text model's logits: so wide that WasmEdge's vision guests, which send no ``temp``,
get the greedy answer from default sampling (their outputs are known in advance)."""
PROJECTOR_TYPES = {"llava": "mlp", "gemma3": "gemma3", "qwen2vl": "qwen2vl_merger"}
"""The projector kinds :func:`write_projector` writes, and their ``clip.projector_type``."""


def write_projector(
    path: str | os.PathLike[str],
    *,
    kind: str = "llava",
    n_embd_text: int = TEXT_EMBD,
    n_embd: int = 32,
    n_ff: int = 64,
    seed: int = 0,
) -> pathlib.Path:
    """Write a random CLIP projector to ``path`` (F32); return the path.

    ``kind`` "llava": a ViT with a class embedding, then the MLP ``mm.0`` / ``mm.2``.  "gemma3": a
    SigLIP-style ViT (patch bias, no class embedding, ``v.post_ln``), then Gemma 3's RMS norm and
    input projection, pooling factor 1 (so also 16 image tokens); libmtmd decodes its image tokens
    with non-causal attention and wraps them in ``<start_of_image>`` / ``<end_of_image>`` text.
    """
    import gguf

    if kind not in PROJECTOR_TYPES:
        raise ValueError(f"projector kind {kind!r}: expected one of {', '.join(PROJECTOR_TYPES)}")
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, PROJECTOR_TYPES[kind])
    writer.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, True)
    if kind == "llava":
        writer.add_bool(gguf.Keys.Clip.HAS_LLAVA_PROJECTOR, True)
    elif kind == "gemma3":
        writer.add_uint32("clip.vision.projector.scale_factor", 1)
    vision = gguf.Keys.ClipVision
    for key, value in (
        (vision.IMAGE_SIZE, IMAGE_SIZE),
        (vision.PATCH_SIZE, PATCH_SIZE),
        (vision.EMBEDDING_LENGTH, n_embd),
        (vision.FEED_FORWARD_LENGTH, n_ff),
        (vision.PROJECTION_DIM, n_embd_text),
        (vision.BLOCK_COUNT, 1),
        ("clip.vision.attention.head_count", 2),
    ):
        writer.add_uint32(key, value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_array(vision.IMAGE_MEAN, [0.5, 0.5, 0.5])
    writer.add_array(vision.IMAGE_STD, [0.5, 0.5, 0.5])
    writer.add_bool(vision.USE_GELU, True)

    def random(name: str, *shape: int, scale: float = 0.2) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    random("v.patch_embd.weight", n_embd, 3, PATCH_SIZE, PATCH_SIZE)
    if kind == "llava":
        random("v.position_embd.weight", IMAGE_TOKENS + 1, n_embd, scale=0.5)
        random("v.class_embd", n_embd, scale=0.5)
    elif kind == "gemma3":
        random("v.patch_embd.bias", n_embd, scale=0.1)
        random("v.position_embd.weight", IMAGE_TOKENS, n_embd, scale=0.5)
    else:  # positions come from M-RoPE; the second convolution is the temporal patch's other frame
        random("v.patch_embd.weight.1", n_embd, 3, PATCH_SIZE, PATCH_SIZE)
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        random(f"v.blk.0.{name}.weight", n_embd, n_embd)
        random(f"v.blk.0.{name}.bias", n_embd, scale=0.1)
    for name in ("ln1", "ln2"):
        writer.add_tensor(f"v.blk.0.{name}.weight", np.ones(n_embd, np.float32))
        writer.add_tensor(f"v.blk.0.{name}.bias", np.zeros(n_embd, np.float32))
    random("v.blk.0.ffn_up.weight", n_ff, n_embd)
    random("v.blk.0.ffn_up.bias", n_ff, scale=0.1)
    random("v.blk.0.ffn_down.weight", n_embd, n_ff)
    random("v.blk.0.ffn_down.bias", n_embd, scale=0.1)
    if kind == "llava":
        random("mm.0.weight", n_embd_text, n_embd, scale=0.5)
        random("mm.0.bias", n_embd_text, scale=0.5)
        random("mm.2.weight", n_embd_text, n_embd_text, scale=0.5)
        random("mm.2.bias", n_embd_text, scale=0.5)
    elif kind == "qwen2vl":  # the merger: 2x2 neighbouring patches concatenated, then an MLP
        random("mm.0.weight", 4 * n_embd, 4 * n_embd, scale=0.3)
        random("mm.0.bias", 4 * n_embd, scale=0.3)
        random("mm.2.weight", n_embd_text, 4 * n_embd, scale=0.3)
        random("mm.2.bias", n_embd_text, scale=0.3)
    else:
        writer.add_tensor("v.post_ln.weight", np.ones(n_embd, np.float32))
        writer.add_tensor("v.post_ln.bias", np.zeros(n_embd, np.float32))
        random("mm.input_projection.weight", n_embd, n_embd_text, scale=4.0)
        writer.add_tensor("mm.soft_emb_norm.weight", np.ones(n_embd, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return pathlib.Path(path)


def write_vision_model(
    directory: str | os.PathLike[str], seed: int = 0, kind: str = "llava"
) -> tuple[pathlib.Path, pathlib.Path]:
    """Write ``text.gguf`` and ``mmproj.gguf`` (a ``kind`` projector) into ``directory``; return both paths."""
    folder = pathlib.Path(directory)
    text = write_random_model(
        folder / "text.gguf",
        n_layer=2,
        n_embd=TEXT_EMBD,
        n_head=4,
        n_ff=128,
        context_length=512,
        seed=seed,
        f16=False,
        arch="qwen2vl" if kind == "qwen2vl" else "llama",
        logit_std=GUEST_LOGIT_STD,
    )
    return text, write_projector(folder / "mmproj.gguf", kind=kind, seed=seed)


def png_bytes(width: int, height: int, rgb: bytes | list[int]) -> bytes:
    """``width`` x ``height`` RGB pixels (row by row) as a PNG file."""
    data = bytes(rgb)
    if len(data) != width * height * 3:
        raise ValueError(f"{len(data)} bytes of pixels for a {width}x{height} RGB image; expected {width * height * 3}")
    rows = b"".join(b"\x00" + data[y * width * 3 : (y + 1) * width * 3] for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def solid_png(red: int, green: int, blue: int, size: int = IMAGE_SIZE) -> bytes:
    """A one-colour square PNG."""
    return png_bytes(size, size, [red, green, blue] * (size * size))


def img_tag(image: bytes, mime: str = "png") -> str:
    """``image`` as an inline prompt tag, ``<img src="data:image/MIME;base64,...">``."""
    return f'<img src="data:image/{mime};base64,{base64.b64encode(image).decode()}">'
