"""One prompt-cache entry on disk: a token prefix and the KV state of a sequence holding it.

Layout (little-endian)::

    magic       8 bytes  b"WNNKV\\x00\\x01\\n"
    header_len  u32      length of the JSON header
    header      JSON     {"model": identity, "n_tokens": N, "state_bytes": S}
    tokens      N x i32  the prefix the state was decoded from
    state       S bytes  ``llama_state_seq_get_data`` of that sequence
    checksum    32 bytes sha256 of everything before it

Writers go through a temporary file in the same directory and ``os.replace``, so a reader sees
a whole entry or none.  Readers check the size (a truncated file), the checksum (a corrupt one),
the model identity and the tokens (a foreign or replaced one) before the state is used.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

import orjson

MAGIC = b"WNNKV\x00\x01\n"
TEMP_PREFIX = ".tmp-"
"""Temporary files being written (never read as entries; stale ones are removed by eviction)."""
_LEN = struct.Struct("<I")
_CHECKSUM_BYTES = 32
_MAX_HEADER = 1 << 16


class EntryError(Exception):
    """An entry that cannot be used; the message says why in a few words.  ``corrupt`` is False when
    the file only changed or went away while it was read (another process replaced or evicted it)."""

    def __init__(self, message: str, corrupt: bool = True) -> None:
        super().__init__(message)
        self.corrupt = corrupt


@dataclass(frozen=True)
class EntryInfo:
    """What the header of an entry says, and the file it was read from."""

    path: Path
    model: str
    tokens: tuple[int, ...]
    state_bytes: int
    size: int
    mtime_ns: int


def _tokens_bytes(tokens: tuple[int, ...] | list[int]) -> bytes:
    data = array("i", tokens)
    if data.itemsize != 4:  # pragma: no cover - every supported platform has 32-bit C ints
        raise EntryError("C int is not 32 bits")
    if sys.byteorder != "little":  # pragma: no cover
        data.byteswap()
    return data.tobytes()


def _tokens_from(data: bytes | memoryview) -> tuple[int, ...]:
    tokens = array("i")
    tokens.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover
        tokens.byteswap()
    return tuple(tokens)


def entry_size(n_tokens: int, header_len: int, state_bytes: int) -> int:
    """Bytes of a whole entry file."""
    return len(MAGIC) + _LEN.size + header_len + 4 * n_tokens + state_bytes + _CHECKSUM_BYTES


def write_entry(path: Path, model: str, tokens: tuple[int, ...] | list[int], state: memoryview | bytes) -> int:
    """Write an entry atomically (temporary file, fsync, rename); return its size in bytes."""
    header = orjson.dumps({"model": model, "n_tokens": len(tokens), "state_bytes": len(state)})
    parts = (MAGIC, _LEN.pack(len(header)), header, _tokens_bytes(tokens), state)
    digest = hashlib.sha256()
    fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            for part in parts:
                digest.update(part)
                handle.write(part)
            handle.write(digest.digest())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return entry_size(len(tokens), len(header), len(state))


def read_header(path: Path) -> EntryInfo:
    """The header of an entry (EntryError if it is not one, or its size is not what it says)."""
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            head = handle.read(len(MAGIC) + _LEN.size)
            if len(head) < len(MAGIC) + _LEN.size or not head.startswith(MAGIC):
                raise EntryError("not a prompt-cache entry")
            (header_len,) = _LEN.unpack_from(head, len(MAGIC))
            if header_len > _MAX_HEADER:
                raise EntryError("header too long")
            fields = orjson.loads(handle.read(header_len))
            model, n_tokens, state_bytes = str(fields["model"]), int(fields["n_tokens"]), int(fields["state_bytes"])
            if n_tokens < 0 or state_bytes < 0:
                raise EntryError("negative sizes")
            if stat.st_size != entry_size(n_tokens, header_len, state_bytes):
                raise EntryError(f"truncated or padded ({stat.st_size} bytes)")
            tokens = _tokens_from(handle.read(4 * n_tokens))
    except OSError as exc:
        raise EntryError(f"unreadable: {exc.strerror or exc}", corrupt=False) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise EntryError(f"unreadable header: {exc}") from None
    return EntryInfo(path, model, tokens, state_bytes, stat.st_size, stat.st_mtime_ns)


def read_state(info: EntryInfo) -> memoryview:
    """The state of an entry whose header was read, after checking the whole file against its
    checksum, model and tokens (EntryError otherwise); writable, so llama.cpp can read it in place."""
    try:
        with open(info.path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != info.size:
                raise EntryError("changed since it was indexed", corrupt=False)
            data = bytearray(size)
            if handle.readinto(data) != size:
                raise EntryError("short read", corrupt=False)
    except OSError as exc:
        raise EntryError(f"unreadable: {exc.strerror or exc}", corrupt=False) from None
    view = memoryview(data)
    body, checksum = view[: size - _CHECKSUM_BYTES], view[size - _CHECKSUM_BYTES :]
    if hashlib.sha256(body).digest() != checksum:
        raise EntryError("checksum mismatch")
    (header_len,) = _LEN.unpack_from(view, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    fields = orjson.loads(bytes(view[start : start + header_len]))
    tokens_at = start + header_len
    state_at = tokens_at + 4 * len(info.tokens)
    if fields.get("model") != info.model or _tokens_from(view[tokens_at:state_at]) != info.tokens:
        raise EntryError("model or tokens differ from its index entry", corrupt=False)
    return view[state_at : size - _CHECKSUM_BYTES]
