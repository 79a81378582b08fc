"""Warm starts across processes: the KV state of prompt prefixes kept in a directory.

``wasinn run --nn-prompt-cache DIR`` (or ``WasiNN(prompt_cache=DIR)``) gives the registry a
:class:`PromptCache`; each model's worker gets a :class:`ModelPromptCache` keyed by the model's
identity (file path, size and mtime, or the hash of guest bytes; the llama.cpp build; flash-attn).

1. **Prefetch** (the guest's thread, before the job is queued): the entry of this model sharing the
   longest token prefix with the prompt (stopping before the last token and before any image) is
   read and verified (:mod:`.entry`), if it would save at least ``min_tokens`` over
   what the context's own sequence already holds.
2. **Restore** (the model's worker thread, when the job gets its sequence): the state goes into the
   sequence with ``llama_state_seq_set_data`` and is trimmed to the shared prefix; the job decodes
   only the rest.  A state llama.cpp refuses leaves the sequence empty (one log line).
3. **Save** (the worker thread, once the prompt is decoded): a prompt with at least ``min_tokens``
   freshly decoded tokens (or a ``path-prompt-cache`` name) has its sequence's state copied out;
   a writer thread evicts the least recently used entries until the new one fits in ``max_bytes``
   and writes it atomically; a full disk evicts as many bytes as the entry needs and writes once
   more.  An entry larger than the whole bound is not written (one WARNING per cache).  Prompts
   with images are never saved.

Corrupt, truncated or replaced entries are ignored with one log line (and removed if they are
ours); foreign files in the directory are left alone, and only regular files are ever opened (a
named pipe or a link in the directory is skipped with one log line, never waited on or followed).
No read holds more of an entry's tokens than the prompt it is matched with.  Several processes
may share a directory.
"""

from __future__ import annotations

import atexit
import collections
import errno
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from stat import S_ISREG
from typing import Protocol

from .entry import (
    MAGIC,
    TEMP_PREFIX,
    EntryError,
    EntryInfo,
    is_regular,
    open_regular,
    planned_size,
    read_header,
    read_state,
    shared_prefix,
    write_entry,
)

log = logging.getLogger("wasinn_host")

DEFAULT_MAX_BYTES = 1 << 30
"""Default bound of a cache directory (1 GiB): the oldest entries go first beyond it."""
MIN_TOKENS = 32
"""Prefixes shorter than this are not worth a file (decoding them is as quick as reading them)."""
SUFFIX = ".wnkv"
MAX_PENDING_BYTES = 512 << 20
"""States waiting for the writer thread beyond this are dropped rather than held in memory."""
STALE_TEMP_S = 600.0
FLUSH_TIMEOUT_S = 120.0
"""How long :meth:`PromptCache.flush` (at exit, or when a registry closes) waits for the writer."""
_CANDIDATES = 3
_DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class SequenceState(Protocol):
    """What the cache needs of an inference context (see ``runtime.Context``)."""

    def state_get(self, seq_id: int) -> memoryview:
        """The KV state of one sequence."""

    def state_set(self, seq_id: int, data: memoryview) -> bool:
        """Load a sequence's KV state; False if llama.cpp refuses it."""

    def seq_rm(self, seq_id: int, start: int) -> None:
        """Drop the sequence's cells from ``start`` on."""


def valid_entry_name(name: str) -> bool:
    """Whether a guest's ``path-prompt-cache`` names a file inside the cache directory: relative,
    no ``..``, no empty or hidden-temporary part, no backslash or NUL ("" means no name)."""
    if not name:
        return True
    if "\\" in name or "\0" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return False
    parts = PurePosixPath(name).parts
    return bool(parts) and all(p not in ("..", ".") and not p.startswith(TEMP_PREFIX) for p in parts)


def model_identity(kind: str, where: str, commit: str, flash_attn: str) -> str:
    """The key of a model's entries: a file's resolved path, size and mtime (``kind`` "file") or the
    sha256 of guest bytes ("bytes"), with the llama.cpp build and the flash-attn setting (the KV
    layout depends on both)."""
    if kind == "file":
        stat = os.stat(where)
        source = f"file\0{os.path.realpath(where)}\0{stat.st_size}\0{stat.st_mtime_ns}"
    else:
        source = f"bytes\0{where}"
    return hashlib.sha256(f"{source}\0{commit}\0{flash_attn}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Prefetched:
    """A verified entry read for a job: its header, the prefix it shares with the job (its length and
    tokens), its state."""

    info: EntryInfo
    common: int
    tokens: tuple[int, ...]
    state: memoryview


@dataclass
class _Write:
    path: Path
    model: str
    tokens: tuple[int, ...]
    state: memoryview


class PromptCache:
    """A directory of prompt-prefix states, bounded to ``max_bytes`` (least recently used go first)."""

    def __init__(
        self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES, min_tokens: int = MIN_TOKENS
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._root = os.path.realpath(self.directory)
        self.max_bytes = max_bytes
        self.min_tokens = max(1, min_tokens)
        self._lock = threading.Lock()
        self._index: dict[Path, EntryInfo] = {}
        self._logged: set[tuple[str, int, int]] = set()
        self._cv = threading.Condition()
        self._queue: collections.deque[_Write] = collections.deque()
        self._pending_bytes = 0
        self._writing = False
        self._thread: threading.Thread | None = None
        self._too_large_logged = False
        self.hits = 0
        self.writes = 0
        self.evictions = 0
        self.rejected = 0
        atexit.register(self._flush_at_exit)

    def __repr__(self) -> str:
        return f"PromptCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    def for_model(self, identity: str) -> ModelPromptCache:
        """The view a model's worker uses."""
        return ModelPromptCache(self, identity)

    # -- reading -------------------------------------------------------------------

    def _scan(self) -> list[EntryInfo]:
        """Every entry in the directory (headers re-read only for new or changed files)."""
        index: dict[Path, EntryInfo] = {}
        for folder, dirs, files in os.walk(self._root):
            dirs[:] = [d for d in dirs if not d.startswith(TEMP_PREFIX)]
            for file in files:
                path = Path(folder, file)
                if file.startswith(TEMP_PREFIX):
                    self._remove_stale_temp(path)
                    continue
                try:
                    stat = path.lstat()  # a link is not followed, a named pipe not opened
                except OSError:
                    continue
                if not S_ISREG(stat.st_mode):
                    self._skip_special(path, stat)
                    continue
                with self._lock:
                    known = self._index.get(path)
                if known is not None and (known.size, known.mtime_ns) == (stat.st_size, stat.st_mtime_ns):
                    index[path] = known
                    continue
                try:
                    index[path] = read_header(path)
                except EntryError as err:
                    self._reject(path, stat.st_size, stat.st_mtime_ns, err)
        with self._lock:
            self._index = index
        return list(index.values())

    def _skip_special(self, path: Path, stat: os.stat_result) -> None:
        """A link, named pipe, socket or device in the directory: one log line, left alone."""
        key = (str(path), stat.st_mode, stat.st_mtime_ns)
        if key not in self._logged:
            self._logged.add(key)
            log.warning("prompt cache: ignoring %s: not a regular file (entries are regular files); left alone", path)

    def _remove_stale_temp(self, path: Path) -> None:
        try:
            if time.time() - path.lstat().st_mtime > STALE_TEMP_S:
                path.unlink()
        except OSError:
            pass

    def _reject(self, path: Path, size: int, mtime_ns: int, err: EntryError) -> None:
        """One log line per bad file version; our own corrupt entries are removed (unless another
        process has replaced the file since).  A file that only changed or went away while it was
        read is skipped quietly: the next scan sees it as it is."""
        with self._lock:
            self._index.pop(path, None)
        if not err.corrupt:
            log.debug("prompt cache: %s changed while read (%s); skipped", path, err)
            return
        ours = _starts_with_magic(path) and _same_version(path, size, mtime_ns)
        key = (str(path), size, mtime_ns)
        if key not in self._logged:
            self._logged.add(key)
            self.rejected += 1
            log.warning("prompt cache: ignoring %s: %s%s", path, err, "; removed" if ours else "")
        if ours:
            try:
                path.unlink()
            except OSError:
                pass

    def load(self, model: str, tokens: list[int], limit: int, have: int, name: str = "") -> Prefetched | None:
        """The verified entry of ``model`` sharing the longest prefix of ``tokens[:limit]``, if it
        shares at least ``min_tokens`` more than ``have``; None otherwise.  The entry ``name`` (a
        ``path-prompt-cache``) comes first, whatever its length, if it shares more than ``have``."""
        wanted = tokens[:limit]
        if name and (named := self._named(model, wanted, have, name)) is not None:
            return named
        if limit - have < self.min_tokens:
            return None
        scored = []
        for info in self._scan():
            if info.model == model:
                try:
                    common = shared_prefix(info, wanted)
                except EntryError as err:
                    self._reject(info.path, info.size, info.mtime_ns, err)
                    continue
                if common - have >= self.min_tokens:
                    scored.append((common, info.mtime_ns, info))
        scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
        for common, _mtime, info in scored[:_CANDIDATES]:
            try:
                return _prefetched(info, wanted[:common])
            except EntryError as err:
                self._reject(info.path, info.size, info.mtime_ns, err)
        return None

    def _named(self, model: str, wanted: list[int], have: int, name: str) -> Prefetched | None:
        path = self._entry_path(model, wanted, name)
        if path is None or not is_regular(path):
            return None
        try:
            info = read_header(path)
            if info.model != model:
                return None
            common = shared_prefix(info, wanted)
            if common <= have:
                return None
            return _prefetched(info, wanted[:common])
        except EntryError as err:
            try:
                stat = path.lstat()
            except OSError:
                return None
            self._reject(path, stat.st_size, stat.st_mtime_ns, err)
            return None

    def touch(self, info: EntryInfo) -> None:
        """Mark an entry as just used (eviction removes the least recently used first)."""
        self.hits += 1
        try:
            os.utime(info.path)
        except OSError:
            pass

    def refused(self, info: EntryInfo) -> None:
        """llama.cpp refused an entry's state (another KV layout): one log line, the file stays."""
        key = (str(info.path), info.size, info.mtime_ns)
        if key not in self._logged:
            self._logged.add(key)
            self.rejected += 1
            log.warning("prompt cache: llama.cpp refused the state in %s; its prompt is decoded instead", info.path)

    def holds(self, model: str, tokens: list[int], name: str) -> bool:
        """Whether the entry a save would write already holds exactly these tokens of ``model``."""
        path = self._entry_path(model, tokens, name)
        if path is None:
            return False
        try:
            info = read_header(path)  # the file as it is now (another process may have replaced it)
            return info.model == model and info.n_tokens == len(tokens) and shared_prefix(info, tokens) == len(tokens)
        except EntryError:
            return False

    # -- writing -------------------------------------------------------------------

    def _entry_path(self, model: str, tokens: list[int], name: str) -> Path | None:
        """Where a save goes: ``name`` inside the directory (None if it leads outside, through a
        link), or a file named by the model and a hash of the tokens."""
        if not name:
            digest = hashlib.sha256(b"".join(t.to_bytes(4, "little", signed=True) for t in tokens)).hexdigest()
            return Path(self._root, f"{model[:16]}-{digest[:32]}{SUFFIX}")
        path = Path(self._root, name)
        if not valid_entry_name(name):
            return None
        parent = os.path.realpath(path.parent)
        if parent != self._root and not parent.startswith(self._root + os.sep):
            return None
        return Path(parent, path.name)

    def store(self, model: str, tokens: list[int], state: memoryview, name: str = "") -> bool:
        """Queue a state for the writer thread; False if it is dropped (too large, too much pending,
        or ``name`` leads outside the directory)."""
        path = self._entry_path(model, tokens, name)
        if path is None:
            log.warning("prompt cache: entry name %r leads outside %s; not saved", name, self.directory)
            return False
        size = planned_size(model, len(tokens), len(state))
        if size > self.max_bytes:
            self._too_large(size)
            return False
        with self._cv:
            if self._pending_bytes + len(state) > MAX_PENDING_BYTES:
                log.debug("prompt cache: writer behind; a state of %d bytes is dropped", len(state))
                return False
            self._queue.append(_Write(path, model, tuple(tokens), state))
            self._pending_bytes += len(state)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_loop, name="wasinn-prompt-cache", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return True

    def _too_large(self, size: int) -> None:
        """An entry larger than the whole bound: never written (it would be evicted at once); said
        once per cache at WARNING, later ones at DEBUG."""
        level = logging.DEBUG if self._too_large_logged else logging.WARNING
        self._too_large_logged = True
        log.log(
            level,
            "prompt cache: an entry of %s exceeds --nn-prompt-cache-size (%s); prompts that large are not saved",
            mib(size),
            mib(self.max_bytes),
        )

    def flush(self, timeout: float | None = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every queued state is on disk, at most ``timeout`` seconds (None: for ever);
        False (and one log line) if states were still waiting then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._queue or self._writing:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    waiting = len(self._queue) + int(self._writing)
                    log.warning("prompt cache: %d states still not written after %g s; not waiting", waiting, timeout)
                    return False
                self._cv.wait(0.1 if left is None else min(0.1, left))
        return True

    def _flush_at_exit(self) -> None:
        try:
            self.flush()
        except KeyboardInterrupt:  # a second Ctrl-C while the writer finishes: exit now
            pass

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                item = self._queue.popleft()
                self._writing = True
            try:
                self._write(item)
            except Exception as exc:  # a full disk, a vanished directory: the run goes on
                log.warning("prompt cache: could not write %s: %s", item.path, exc)
            finally:
                with self._cv:
                    self._pending_bytes -= len(item.state)
                    self._writing = False
                    self._cv.notify_all()

    def _write(self, item: _Write) -> None:
        """Make room within the bound, write; on a full disk evict what the entry needs and write once more."""
        item.path.parent.mkdir(parents=True, exist_ok=True)
        size = planned_size(item.model, len(item.tokens), len(item.state))
        self.evict(room=size, replacing=item.path)
        try:
            write_entry(item.path, item.model, item.tokens, item.state)
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            if not self.evict(room=size, replacing=item.path, free=size):
                raise
            write_entry(item.path, item.model, item.tokens, item.state)
        self.writes += 1
        info = read_header(item.path)
        with self._lock:
            self._index[item.path] = info
        self.evict()  # other processes may have written meanwhile

    def evict(self, room: int = 0, replacing: Path | None = None, free: int = 0) -> int:
        """Remove the least recently used entries until the directory holds at most ``max_bytes``
        less ``room`` (the size of an entry about to be written at ``replacing``, whose old version
        does not count) and, with ``free``, until at least ``free`` bytes are gone (a full disk);
        return how many were removed."""
        entries = sorted(self._scan(), key=lambda e: e.mtime_ns)
        total = sum(e.size for e in entries if e.path != replacing)
        limit = self.max_bytes - room
        gone: list[Path] = []
        freed = 0
        for entry in entries:
            if total <= limit and freed >= free:
                break
            try:
                entry.path.unlink()
            except FileNotFoundError:
                pass  # another process evicted it
            except OSError:
                continue
            gone.append(entry.path)
            freed += entry.size
            if entry.path != replacing:
                total -= entry.size
        if gone:
            self.evictions += len(gone)
            with self._lock:
                for path in gone:
                    self._index.pop(path, None)
            why = f"for a {mib(free)} entry on a full disk" if free else f"to stay within {mib(self.max_bytes)}"
            log.info("prompt cache: evicted %d entries (%s) %s", len(gone), mib(freed), why)
        return len(gone)

    def status(self) -> dict[str, object]:
        """Directory, bound, entries (as on disk now), states waiting to be written, counters (JSON-ready)."""
        entries = self._scan()
        with self._cv:
            pending = len(self._queue) + int(self._writing)
        return {
            "directory": str(self.directory),
            "max_bytes": self.max_bytes,
            "entries": len(entries),
            "bytes": sum(e.size for e in entries),
            "pending_writes": pending,
            "hits": self.hits,
            "writes": self.writes,
            "evictions": self.evictions,
            "rejected": self.rejected,
        }


class ModelPromptCache:
    """One model's view of a :class:`PromptCache`: what its worker calls."""

    def __init__(self, cache: PromptCache, identity: str) -> None:
        self.cache = cache
        self.identity = identity

    @property
    def min_tokens(self) -> int:
        """Fewest tokens worth restoring or saving."""
        return self.cache.min_tokens

    def prefetch(self, tokens: list[int], limit: int, have: int, name: str = "") -> Prefetched | None:
        """Read and verify the best entry for ``tokens[:limit]`` (see :meth:`PromptCache.load`)."""
        return self.cache.load(self.identity, tokens, limit, have, name)

    def restore(self, context: SequenceState, seq_id: int, found: Prefetched) -> list[int]:
        """Put ``found`` into sequence ``seq_id`` (cleared first), trimmed to its shared prefix;
        return the tokens the sequence now holds (none if llama.cpp refused the state)."""
        context.seq_rm(seq_id, 0)
        if not context.state_set(seq_id, found.state):
            context.seq_rm(seq_id, 0)
            self.cache.refused(found.info)
            return []
        context.seq_rm(seq_id, found.common)
        self.cache.touch(found.info)
        return list(found.tokens)

    def save(self, context: SequenceState, seq_id: int, tokens: list[int], fresh: int, name: str) -> None:
        """Save the state of a sequence holding exactly ``tokens`` if ``fresh`` of them were decoded
        now (at least ``min_tokens``) or ``name`` asks for it, unless that entry already holds them."""
        if (fresh < self.cache.min_tokens and not name) or not tokens:
            return
        if self.cache.holds(self.identity, tokens, name):
            return
        self.cache.store(self.identity, tokens, context.state_get(seq_id), name)


_ignored_name_logged = False


def log_ignored_name(name: str) -> None:
    """``path-prompt-cache`` without a cache directory: accepted and ignored, said once per process."""
    global _ignored_name_logged
    if not _ignored_name_logged:
        _ignored_name_logged = True
        log.info(
            "config key 'path-prompt-cache' %r is ignored: the host keeps no prompt cache "
            "(wasinn run --nn-prompt-cache DIR)",
            name,
        )


def _same_version(path: Path, size: int, mtime_ns: int) -> bool:
    """Whether ``path`` is still the file version that was read (not replaced by another process)."""
    try:
        stat = path.lstat()
    except OSError:
        return False
    return (stat.st_size, stat.st_mtime_ns) == (size, mtime_ns)


def _starts_with_magic(path: Path) -> bool:
    try:
        fd, _stat = open_regular(path)
    except EntryError:
        return False
    try:
        return os.pread(fd, len(MAGIC), 0) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def _prefetched(info: EntryInfo, tokens: list[int]) -> Prefetched:
    """The verified state of ``info``, whose tokens start with ``tokens`` (EntryError otherwise)."""
    return Prefetched(info, len(tokens), tuple(tokens), read_state(info, tokens))


def mib(size: int) -> str:
    """A size in MiB with the decimals it needs: ``1.50 MiB``, ``0.000954 MiB`` (never ``0 MiB``)."""
    value = size / (1 << 20)
    if value >= 0.01 or size == 0:
        return f"{value:.2f} MiB"
    return f"{value:.3g} MiB" if value >= 1e-4 else f"{value:.6f} MiB"
