"""Config keys naming the guest's own files, kept on the client side of an RPC connection.

A server refuses keys that name files (``remote_config.py``): its files are not the guest's.  So
the remote backend takes these keys out of a config before sending it:

* ``image``: the file is read here, through the guest's preopened directories as a local host
  reads it, and sent in the prompt as an inline ``<img src="data:image/...;base64,...">`` where a
  local host places it (at the prompt's ``<image>`` marker, else before the text);
* ``mmproj``: dropped; the projector is the one the server's host configured for the model (a
  WasmEdge guest names it only because WasmEdge's plugin loads it from there).
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from ..core.config.keys import SECTIONS, ParsedConfig, canonical_key, parse_config
from ..core.images import MODEL_MARKER

CLIENT_KEYS = frozenset({"image", "mmproj"})


def _strip(doc: dict[str, Any]) -> bool:
    """Remove the client keys from ``doc`` and its sections; whether any was there."""
    found = [key for key in doc if canonical_key(key) in CLIENT_KEYS]
    for key in found:
        del doc[key]
    nested = [_strip(doc[section]) for section in SECTIONS if isinstance(doc.get(section), dict)]
    return bool(found) or any(nested)


def without_client_keys(config: ParsedConfig) -> tuple[ParsedConfig, str | None]:
    """``config`` as the server may see it (no ``image``, no ``mmproj``) and the ``image`` path, if any."""
    image = config.options.get("image") or None
    if not config.source.strip():
        return config, image
    doc = orjson.loads(config.source)  # parse_config accepted it, so it is a JSON object
    if not isinstance(doc, dict) or not _strip(doc):
        return config, image
    return parse_config(orjson.dumps(doc) if doc else b""), image


def inline_image(prompt: bytes, image: bytes) -> bytes:
    """``prompt`` with ``image`` as an inline tag at its first ``<image>``, else before the text."""
    tag = b'<img src="data:image/any;base64,' + base64.b64encode(image) + b'">'
    at = prompt.find(MODEL_MARKER)
    if at < 0:
        return tag + prompt
    return prompt[:at] + tag + prompt[at + len(MODEL_MARKER) :]
