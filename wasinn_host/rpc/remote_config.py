"""Config JSON from a remote client, screened before the server applies it.

A remote client may tune sampling and the model instance but never name a file on the
server (``image``, ``mmproj``, the TTS files: refused with an invalid argument) and never
make the server print (``stream-stdout`` is dropped).
"""

from __future__ import annotations

import dataclasses

import orjson

from ..core.config.keys import SECTIONS, ParsedConfig, canonical_key, parse_config
from ..core.errors import ErrorKind, WasiNNError

PATH_KEYS = frozenset({"image", "mmproj", "tts-output-file", "tts-speaker-file", "model-vocoder"})


def _keys(text: bytes) -> set[str]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return set()  # parse_config reports it
    if not isinstance(doc, dict):
        return set()
    keys = {canonical_key(key) for key in doc}
    for section in SECTIONS:
        if isinstance(doc.get(section), dict):
            keys.update(canonical_key(key) for key in doc[section])
    return keys


def remote_config(text: bytes) -> ParsedConfig:
    """``text`` parsed as any config is, refusing path-bearing keys and without ``stream-stdout``."""
    refused = sorted(_keys(text) & PATH_KEYS) if text.strip() else []
    if refused:
        raise WasiNNError(
            ErrorKind.SECURITY,
            f"config keys naming server files are refused from remote clients: {', '.join(refused)}",
        )
    parsed = parse_config(text)
    if "stream_stdout" not in parsed.stopping:
        return parsed
    stopping = {key: value for key, value in parsed.stopping.items() if key != "stream_stdout"}
    return dataclasses.replace(parsed, stopping=stopping)
