"""Files a guest names (``image``, ``mmproj``, and a TTS graph's ``model-vocoder``, ``tts-speaker-file`` and
``tts-output-file``), resolved only through the directories it was given.

A guest path is looked up in the Store's preopened ``(host dir, guest dir)`` mappings, the
longest guest prefix first (a relative path is relative to the guest's ``.``); the result must
stay inside that host directory once ``..`` and symbolic links are resolved.  Anything else is
refused with an invalid argument and one log line: a guest never reads or writes a host file it was
not given.  Reads are capped at ``limit`` bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
from pathlib import Path
from typing import Any, Sequence

from ..core.config.keys import ParsedConfig
from ..core.errors import invalid
from ..core.images import MAX_IMAGE_BYTES

log = logging.getLogger("wasinn_host")


def find_guest_path(path: str, dirs: Sequence[tuple[str, str]]) -> Path | None:
    """The host file behind guest ``path`` through the preopened ``dirs``, or None if none holds it."""
    guest = posixpath.normpath(path if path.startswith("/") else posixpath.join(".", path))
    candidates = []
    for host_dir, guest_dir in dirs:
        base = posixpath.normpath(guest_dir)
        if base == ".":
            if not path.startswith("/") and not guest.startswith(".."):
                candidates.append((0, host_dir, guest))
        elif guest == base or guest.startswith(base.rstrip("/") + "/"):
            candidates.append((len(base), host_dir, posixpath.relpath(guest, base)))
    for _, host_dir, rest in sorted(candidates, reverse=True):
        root = Path(os.path.realpath(host_dir))
        target = Path(os.path.realpath(root / rest))
        if target == root or root in target.parents:
            return target
    return None


def resolve_guest_path(path: str, dirs: Sequence[tuple[str, str]], what: str = "image") -> Path:
    """The host file behind guest ``path`` (what ``what`` names); invalid argument if no preopened directory has it."""
    target = find_guest_path(path, dirs)
    if target is not None:
        return target
    log.warning("%s %r refused: it is outside the directories preopened for the guest", what, path)
    mapped = ", ".join(g for _, g in dirs) or "none"
    raise invalid(f"{what} {path!r} is outside the guest's preopened directories ({mapped}); map one with --dir")


def with_guest_projector(config: ParsedConfig, dirs: Sequence[tuple[str, str]]) -> ParsedConfig:
    """``config`` with its ``mmproj`` and ``model-vocoder`` keys resolved to the host files they name inside
    the guest's preopened ``dirs`` (the backend then loads those); a key is left as it is if it is absent or
    names no such file (the registry then takes a projector only if it names the host's configured one,
    and a vocoder not at all)."""
    if not dirs:
        return config
    model = dict(config.model)
    for field in ("mmproj", "vocoder"):
        asked = model.get(field)
        target = find_guest_path(str(asked), dirs) if asked else None
        if target is not None and target.is_file():
            model[field], model[f"{field}_from_guest"] = str(target), True
    return dataclasses.replace(config, model=model) if model != config.model else config


def read_guest_file(path: str, dirs: Sequence[tuple[str, str]], limit: int, what: str = "image") -> bytes:
    """The bytes of guest ``path`` (at most ``limit``); invalid argument if missing, too large or not mapped."""
    target = resolve_guest_path(path, dirs, what)
    try:
        size = target.stat().st_size
        if size > limit:
            raise invalid(f"{what} {path!r}: {size} bytes is more than the limit of {limit} bytes")
        with open(target, "rb") as handle:
            return handle.read(limit + 1)[:limit]
    except OSError as exc:
        raise invalid(f"{what} {path!r}: cannot read it: {exc.strerror or exc}") from None


class GuestFiles:
    """One guest's files through its preopened ``dirs``: a TTS graph's speaker file in, its WAV out
    (``core/tts/graph.py``'s ``FileAccess``)."""

    def __init__(self, dirs: Sequence[tuple[str, str]]) -> None:
        self.dirs = tuple(dirs)

    def read(self, path: str, limit: int, key: str) -> bytes:
        """The bytes of guest ``path`` (at most ``limit``); invalid argument if missing, too large or not mapped."""
        return read_guest_file(path, self.dirs, limit, f"config key {key!r}:")

    def write(self, path: str, data: bytes, key: str) -> None:
        """Write ``data`` to guest ``path`` (created or replaced); invalid argument if not mapped or unwritable."""
        target = resolve_guest_path(path, self.dirs, f"config key {key!r}:")
        try:
            with open(target, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            raise invalid(f"config key {key!r}: {path!r}: cannot write it: {exc.strerror or exc}") from None


def give_image_reader(context: Any, dirs: Sequence[tuple[str, str]]) -> bool:
    """Let a local backend's execution context read its ``image`` key's file through ``dirs`` (at most
    ``MAX_IMAGE_BYTES``), and a TTS graph's speaker and output files (:class:`GuestFiles`); False for a
    context that reads no files (a remote one)."""
    if not hasattr(context, "read_image"):
        return False
    mapped = list(dirs)
    context.read_image = lambda path: read_guest_file(path, mapped, MAX_IMAGE_BYTES)
    context.guest_files = GuestFiles(mapped)
    return True
