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

The directory may hold anything a neighbour puts there, so reading is defensive: only a regular
file is opened (``O_NONBLOCK`` and ``O_NOFOLLOW``, then ``fstat``: a named pipe or a device never
blocks the reader, a link is never followed); indexing reads the header and the first
:data:`HEAD_TOKENS` tokens only; matching a prompt reads no more of an entry's tokens than the
prompt has; and verifying streams the tokens through the checksum, so memory holds the state and
one chunk, whatever number of tokens a header claims.
"""

from __future__ import annotations

import hashlib
import os
import stat as stat_module
import struct
import sys
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..tokens import common_prefix

MAGIC = b"WNNKV\x00\x01\n"
TEMP_PREFIX = ".tmp-"
"""Temporary files being written (never read as entries; stale ones are removed by eviction)."""
_LEN = struct.Struct("<I")
_CHECKSUM_BYTES = 32
_MAX_HEADER = 1 << 16
HEAD_TOKENS = 64
"""Tokens of an entry kept in the cache's index (a prompt that differs within them skips the file)."""
_CHUNK = 1 << 20
"""Bytes read at a time when tokens are compared or checksummed."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class EntryError(Exception):
    """An entry that cannot be used; the message says why in a few words.  ``corrupt`` is False when
    the file only changed or went away while it was read (another process replaced or evicted it)."""

    def __init__(self, message: str, corrupt: bool = True) -> None:
        super().__init__(message)
        self.corrupt = corrupt


@dataclass(frozen=True)
class EntryInfo:
    """What the header of an entry says (with its first tokens), and the file version it was read from."""

    path: Path
    model: str
    n_tokens: int
    head: tuple[int, ...]
    """The first ``min(n_tokens, HEAD_TOKENS)`` tokens."""
    state_bytes: int
    header_len: int
    size: int
    mtime_ns: int

    @property
    def tokens_at(self) -> int:
        """Offset of the token list in the file."""
        return len(MAGIC) + _LEN.size + self.header_len


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


def _header(model: str, n_tokens: int, state_bytes: int) -> bytes:
    return orjson.dumps({"model": model, "n_tokens": n_tokens, "state_bytes": state_bytes})


def planned_size(model: str, n_tokens: int, state_bytes: int) -> int:
    """Bytes the entry :func:`write_entry` would write for these sizes."""
    return entry_size(n_tokens, len(_header(model, n_tokens, state_bytes)), state_bytes)


def write_entry(path: Path, model: str, tokens: tuple[int, ...] | list[int], state: memoryview | bytes) -> int:
    """Write an entry atomically (temporary file, fsync, rename); return its size in bytes."""
    header = _header(model, len(tokens), len(state))
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


def is_regular(path: Path) -> bool:
    """Whether ``path`` itself (not a link's target) is a regular file."""
    try:
        return stat_module.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` and its status, if it is a regular file and not a link (EntryError
    otherwise); never blocks, whatever ``path`` is (a named pipe, a device, a link)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise EntryError(f"unreadable: {exc.strerror or exc}", corrupt=False) from None
    try:
        stat = os.fstat(fd)
        if not stat_module.S_ISREG(stat.st_mode):
            raise EntryError("not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, stat


def _read_at(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` (EntryError if the file ends first: it changed while read)."""
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise EntryError("short read", corrupt=False)
    return data


def read_header(path: Path) -> EntryInfo:
    """The header of an entry and its first :data:`HEAD_TOKENS` tokens (EntryError if it is not a
    regular file, not an entry, or its size is not what the header says).  Reads at most the
    header and ``4 * HEAD_TOKENS`` bytes, whatever the header claims."""
    fd, stat = open_regular(path)
    try:
        head = os.pread(fd, len(MAGIC) + _LEN.size, 0)
        if len(head) < len(MAGIC) + _LEN.size or not head.startswith(MAGIC):
            raise EntryError("not a prompt-cache entry")
        (header_len,) = _LEN.unpack_from(head, len(MAGIC))
        if header_len > _MAX_HEADER:
            raise EntryError("header too long")
        fields = orjson.loads(_read_at(fd, len(head), header_len))
        model, n_tokens, state_bytes = str(fields["model"]), int(fields["n_tokens"]), int(fields["state_bytes"])
        if n_tokens < 0 or state_bytes < 0:
            raise EntryError("negative sizes")
        if stat.st_size != entry_size(n_tokens, header_len, state_bytes):
            raise EntryError(f"truncated or padded ({stat.st_size} bytes)")
        first = _tokens_from(_read_at(fd, len(head) + header_len, 4 * min(n_tokens, HEAD_TOKENS)))
    except OSError as exc:
        raise EntryError(f"unreadable: {exc.strerror or exc}", corrupt=False) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise EntryError(f"unreadable header: {exc}") from None
    finally:
        os.close(fd)
    return EntryInfo(path, model, n_tokens, first, state_bytes, header_len, stat.st_size, stat.st_mtime_ns)


def _open_version(info: EntryInfo) -> int:
    """A descriptor of the entry, if the file is still the size it was indexed at."""
    fd, stat = open_regular(info.path)
    if stat.st_size != info.size:
        os.close(fd)
        raise EntryError("changed since it was indexed", corrupt=False)
    return fd


def shared_prefix(info: EntryInfo, tokens: list[int] | tuple[int, ...]) -> int:
    """How many leading tokens the entry shares with ``tokens``: read from the file in chunks, never
    more of them than ``tokens`` has (EntryError if the file cannot be read)."""
    limit = min(info.n_tokens, len(tokens))
    common = common_prefix(info.head, tokens)
    if common < len(info.head) or common >= limit:
        return min(common, limit)
    fd = _open_version(info)
    try:
        step = _CHUNK // 4
        while common < limit:
            count = min(step, limit - common)
            chunk = _tokens_from(_read_at(fd, info.tokens_at + 4 * common, 4 * count))
            same = common_prefix(chunk, tokens[common : common + count])
            common += same
            if same < count:
                break
    except OSError as exc:
        raise EntryError(f"unreadable: {exc.strerror or exc}", corrupt=False) from None
    finally:
        os.close(fd)
    return common


def read_tokens(info: EntryInfo, count: int | None = None) -> tuple[int, ...]:
    """The entry's first ``count`` tokens (all of them without ``count``), unverified."""
    count = info.n_tokens if count is None else min(count, info.n_tokens)
    fd = _open_version(info)
    try:
        return _tokens_from(_read_at(fd, info.tokens_at, 4 * count))
    except OSError as exc:
        raise EntryError(f"unreadable: {exc.strerror or exc}", corrupt=False) from None
    finally:
        os.close(fd)


def read_state(info: EntryInfo, prefix: list[int] | tuple[int, ...] = ()) -> memoryview:
    """The state of an entry whose header was read, after checking the whole file against its
    checksum, its header and first tokens against ``info``, and its tokens against ``prefix``
    (EntryError otherwise); writable, so llama.cpp can read it in place.  One pass over the file:
    the tokens are checksummed a chunk at a time and only the state is kept."""
    fd = _open_version(info)
    try:
        digest = hashlib.sha256()
        top = _read_at(fd, 0, info.tokens_at)
        digest.update(top)
        try:
            fields = orjson.loads(top[len(MAGIC) + _LEN.size :])
            same = (fields.get("model"), fields.get("n_tokens"), fields.get("state_bytes")) == (
                info.model,
                info.n_tokens,
                info.state_bytes,
            )
        except (ValueError, AttributeError):
            same = False
        # the head was compared when ``prefix`` was found, so the longer of the two covers both
        expected = tuple(prefix) if len(prefix) > len(info.head) else info.head
        offset, end, checked = info.tokens_at, info.tokens_at + 4 * info.n_tokens, 0
        while offset < end:
            chunk = _read_at(fd, offset, min(_CHUNK, end - offset))
            digest.update(chunk)
            if checked < len(expected) and same:
                count = min(len(chunk) // 4, len(expected) - checked)
                same = _tokens_from(chunk[: 4 * count]) == expected[checked : checked + count]
                checked += count
            offset += len(chunk)
        state = bytearray(info.state_bytes)
        view = memoryview(state)
        os.lseek(fd, offset, os.SEEK_SET)
        for start in range(0, info.state_bytes, _CHUNK):
            part = view[start : start + _CHUNK]
            if os.readv(fd, [part]) != len(part):
                raise EntryError("short read", corrupt=False)
            digest.update(part)
        checksum = _read_at(fd, end + info.state_bytes, _CHECKSUM_BYTES)
    except OSError as exc:
        raise EntryError(f"unreadable: {exc.strerror or exc}", corrupt=False) from None
    finally:
        os.close(fd)
    if digest.digest() != checksum:
        raise EntryError("checksum mismatch")
    if not same or checked < len(expected):
        raise EntryError("model or tokens differ from its index entry", corrupt=False)
    return view
