"""Images in prompts: a multimodal projector (``mmproj``) through llama.cpp's libmtmd.

A model loaded with a projector gets a :class:`Vision`.  A prompt with images is tokenized into
an :class:`ImagePrompt`: ordinary token ids, with each image standing as a run of negative
*placeholder* ids (one per image token, derived from the image's pixels), so the engine's prefix
comparison keeps the KV cache of a repeated image and re-decodes from the first image that
differs; ``spans`` says where each image starts and holds its libmtmd chunk, which the engine's
worker encodes and decodes into a sequence (:meth:`Vision.decode`).

Projectors with M-RoPE positions (Qwen2-VL, Qwen2.5-VL) give an image fewer positions than
tokens: its tokens sit on a 2-D grid, so the text after it advances by ``n_pos`` (the larger
side of the grid), not ``n_tokens``; the engine maps token indices to positions with the spans.

Images are checked (``images.py``) before libmtmd sees them, and libmtmd's video fallback is
pointed at a directory with no programs; a file that still fails to decode is an invalid
argument, never a crash.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import invalid
from ..core.images import MAX_IMAGES, check_image, image_size
from .bindings import llama_cpp
from .bindings import mtmd_cpp as mtmd


@dataclass(eq=False)
class ImageSpan:
    """One image in a tokenized prompt: where it starts, how many tokens it is, its libmtmd chunk."""

    start: int
    n_tokens: int
    chunk: Any
    n_pos: int
    """Positions the image takes in the sequence (``n_tokens`` unless the projector uses M-RoPE)."""


@dataclass(eq=False)
class ImagePrompt:
    """A prompt tokenized with its images (frees its libmtmd chunks when collected)."""

    tokens: list[int]
    spans: dict[int, ImageSpan] = field(default_factory=dict)
    _chunks: Any = None

    def __del__(self) -> None:
        if self._chunks:
            mtmd.mtmd_input_chunks_free(self._chunks)
            self._chunks = None


class Vision:
    """A loaded projector bound to its text model (thread-safe: one lock around libmtmd)."""

    def __init__(
        self, mmproj: Path, model_ptr: Any, threads: int, log_callback: Any = None, use_gpu: bool = False
    ) -> None:
        if log_callback is not None:  # libmtmd logs on its own, not through llama.cpp's callback
            mtmd.mtmd_log_set(log_callback, ctypes.c_void_p(0))
            mtmd.mtmd_helper_log_set(log_callback, ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.warmup = False
        params.print_timings = False
        self.path = mmproj
        self.ptr = mtmd.mtmd_init_from_file(str(mmproj).encode(), model_ptr, params)
        if not self.ptr:
            raise invalid(f"mmproj {str(mmproj)!r}: libmtmd could not load it as a projector for this model")
        if not mtmd.mtmd_support_vision(self.ptr):
            self.close()
            raise invalid(f"mmproj {str(mmproj)!r} has no vision encoder")
        self.marker: bytes = mtmd.mtmd_default_marker() or b"<__media__>"
        self._lock = threading.Lock()
        self._opt = mtmd.mtmd_helper_init_opt_default()
        self._opt.video_params.ffmpeg_bin_dir = b"/nonexistent"  # never start a program for an image

    def tokenize(self, text: bytes, images: list[bytes]) -> ImagePrompt:
        """``text`` with one marker per image (the caller places them) to tokens and image spans."""
        if len(images) > MAX_IMAGES:
            raise invalid(f"prompt: {len(images)} images; at most {MAX_IMAGES} are accepted")
        for data in images:
            check_image(data)
        with self._lock:
            bitmaps = [self._bitmap(data) for data in images]
            chunks = mtmd.mtmd_input_chunks_init()
            try:
                inp = mtmd.mtmd_input_text()
                inp.text, inp.text_len, inp.add_special, inp.parse_special = text, len(text), True, True
                array = (mtmd.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
                rc = mtmd.mtmd_tokenize(self.ptr, chunks, ctypes.byref(inp), array, len(bitmaps))
            finally:
                for bitmap in bitmaps:
                    mtmd.mtmd_bitmap_free(bitmap)
            if rc != 0:
                mtmd.mtmd_input_chunks_free(chunks)
                raise invalid(f"prompt with {len(images)} image(s): libmtmd could not tokenize it (code {rc})")
            return self._prompt(chunks, images)

    def _bitmap(self, data: bytes) -> Any:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False, self._opt)
        if not bitmap:
            raise invalid(f"image: {image_size(data)[0]} data of {len(data)} bytes could not be decoded")
        return bitmap

    def _prompt(self, chunks: Any, images: list[bytes]) -> ImagePrompt:
        prompt = ImagePrompt([], _chunks=chunks)
        image_index = 0
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            n = ctypes.c_size_t(0)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                prompt.tokens.extend(int(ids[k]) for k in range(n.value))
                continue
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            digest = hashlib.sha256(images[min(image_index, len(images) - 1)]).digest()
            placeholder = -1 - int.from_bytes(digest[:4], "little") % (1 << 31)
            prompt.spans[len(prompt.tokens)] = ImageSpan(len(prompt.tokens), n_tokens, chunk, n_pos)
            prompt.tokens.extend([placeholder] * n_tokens)
            image_index += 1
        return prompt

    def decode(self, context_ptr: Any, span: ImageSpan, pos: int, seq_id: int, n_batch: int) -> int:
        """Encode the image and decode its embeddings into ``seq_id`` at ``pos``; llama.cpp's return code."""
        new_pos = llama_cpp.llama_pos(0)
        with self._lock:
            return int(
                mtmd.mtmd_helper_eval_chunk_single(
                    self.ptr, context_ptr, span.chunk, pos, seq_id, n_batch, False, ctypes.byref(new_pos)
                )
            )

    def close(self) -> None:
        """Free the projector."""
        if self.ptr:
            mtmd.mtmd_free(self.ptr)
            self.ptr = None
