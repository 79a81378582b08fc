"""Images in prompts, before any model sees them: inline ``<img>`` tags, markers, format and size checks.

No llama.cpp here (the fake backend never imports it): ``vision.py`` does the decoding.

* :func:`split_inline_images` takes WasmEdge's inline form ``<img src="data:image/...;base64,...">``
  out of a prompt, leaving the projector's marker in its place.
* :func:`place_images` puts a marker for an image given otherwise (the ``image`` key) where the
  prompt has the model's image marker (``<image>``), else before the text.
* :func:`check_image`: PNG, JPEG, GIF or BMP only (by signature, so nothing else reaches libmtmd's
  audio and video fallbacks), at most :data:`MAX_IMAGE_BYTES`, and at most :data:`MAX_IMAGE_PIXELS`
  by the dimensions in the header (checked before anything is decoded).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct

from .errors import invalid

MAX_IMAGE_BYTES = 20 << 20
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_IMAGES = 16
"""Images in one prompt."""
MODEL_MARKER = b"<image>"
IMG_TAG = re.compile(rb"""<img\s+src=(["'])data:image/[a-zA-Z0-9.+-]+;base64,([A-Za-z0-9+/=\s]*)\1\s*/?>""")
"""An inline image as WasmEdge's GGML plugin reads it: ``<img src="data:image/...;base64,...">``."""


def image_size(data: bytes) -> tuple[str, int, int]:
    """(format, width, height) from an image's header; invalid argument for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return "PNG", width, height
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return "GIF", width, height
    if data.startswith(b"BM") and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        return "BMP", abs(width), abs(height)
    if data.startswith(b"\xff\xd8"):
        pos = 2
        while pos + 9 <= len(data) and data[pos] == 0xFF:
            marker, length = data[pos + 1], struct.unpack(">H", data[pos + 2 : pos + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
                return "JPEG", width, height
            pos += 2 + length
        raise invalid("image: a JPEG file without a readable frame header")
    raise invalid(f"image: not a PNG, JPEG, GIF or BMP file (starts with {data[:8]!r})")


def check_image(data: bytes) -> None:
    """Refuse (invalid argument) an image that is too large or not a supported format."""
    if len(data) > MAX_IMAGE_BYTES:
        raise invalid(f"image: {len(data)} bytes is more than the limit of {MAX_IMAGE_BYTES} bytes")
    kind, width, height = image_size(data)
    if width <= 0 or height <= 0 or width * height > MAX_IMAGE_PIXELS:
        raise invalid(f"image: a {kind} of {width}x{height} pixels; accepted: 1 to {MAX_IMAGE_PIXELS} pixels")


def split_inline_images(prompt: bytes, marker: bytes) -> tuple[bytes, list[bytes]]:
    """Replace each ``<img src="data:image/...;base64,...">`` by ``marker``; return the text and the images."""
    images: list[bytes] = []

    def take(match: re.Match[bytes]) -> bytes:
        try:
            images.append(base64.b64decode(b"".join(match.group(2).split()), validate=True))
        except (binascii.Error, ValueError):
            raise invalid("prompt: an <img> tag's base64 data is not valid base64") from None
        return marker

    return IMG_TAG.sub(take, prompt), images


def inline_image_bytes(prompt: bytes) -> int:
    """Bytes of ``prompt`` taken by inline ``<img src="data:...">`` tags (counted against the image limit)."""
    if b"<img" not in prompt:
        return 0
    return sum(match.end() - match.start() for match in IMG_TAG.finditer(prompt))


def place_image(text: bytes, images: list[bytes], image: bytes, marker: bytes) -> tuple[bytes, list[bytes]]:
    """Add ``image`` (the ``image`` key's) to a prompt whose ``images`` already have their markers: at the
    first model image marker (``<image>``) if the prompt has one, else before the text."""
    at = text.find(MODEL_MARKER) if MODEL_MARKER != marker else -1
    if at < 0:
        return marker + text, [image, *images]
    before = text[:at].count(marker)
    return text[:at] + marker + text[at + len(MODEL_MARKER) :], [*images[:before], image, *images[before:]]
