"""The ABI fuzzer's environment: the constants it draws around, its statistics, the host under test
with its models and error-log watcher (:func:`make_env`)."""

from __future__ import annotations

import collections
import hashlib
import logging
import pathlib
import struct
from dataclasses import dataclass, field
from typing import Any

import wasmtime

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.limits import Limits
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.errors import WasiNNError
from wasinn_host.ephemeral.imports import SIGNATURES
from wasinn_host.testing.abi_guest import PAGE, abi_guest_wat
from wasinn_host.testing.gguf_models import char_token_id, write_successor_model

U32 = 0xFFFF_FFFF
VALID_ERRNOS = frozenset(range(0, 9)) | frozenset({100, 101, 102, 103})
MEMORY_PAGES = 64  # 4 MiB: the whole successor model (3.6 MiB) fits, for the occasional full load
MEM = MEMORY_PAGES * PAGE
DIGIT_IDS = frozenset(char_token_id(c) for c in "0123456789")
PRELOAD_NAMES = ("succ", "noisy", "missing")
HANDLE_IMPORTS = tuple(name for name in SIGNATURES if not name.startswith("load"))

# Load-time keys pick which model instance serves a graph, and named models stay loaded for good, so
# the configs of load_by_name_with_config / load draw their load-time keys from these few profiles
# only (see the report on unbounded growth).  Everything else in a config is per-context.
MODEL_PROFILES: tuple[dict[str, Any], ...] = (
    {},
    {"ctx-size": 24},
    {"ctx-size": 48, "n-parallel": 1, "threads": 1},
    {"batch-size": 16, "ubatch-size": 8},
    {"embedding": True},
)
MAX_FILE_MODELS = 2 * len(MODEL_PROFILES)  # "succ" and "noisy" ("missing" never loads)

# Small tables, so the fuzzer also reaches the Busy (4) answers; no idle reaper (it would finalise
# contexts behind the model's back).
FUZZ_LIMITS = Limits(max_graphs_per_store=6, max_contexts_per_store=12, idle_timeout_ms=0)

HUGE = (MEM, MEM + 1, MEM + 4096, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFC, 0xFFFF_FFFF)


# -- environment and statistics ------------------------------------------------------------------


@dataclass
class FuzzStats:
    """What the fuzzer did: calls per import, errno histogram, examples, time."""

    calls: int = 0
    examples: int = 0
    injected: int = 0
    by_import: collections.Counter = field(default_factory=collections.Counter)
    errnos: collections.Counter = field(default_factory=collections.Counter)
    by_import_errno: collections.Counter = field(default_factory=collections.Counter)
    slowest: dict[str, float] = field(default_factory=dict)

    def record(self, name: str, rc: int, seconds: float) -> None:
        """Count one call's return code and time."""
        self.calls += 1
        self.by_import[name] += 1
        self.errnos[rc] += 1
        self.by_import_errno[(name, rc)] += 1
        if seconds > self.slowest.get(name, 0.0):
            self.slowest[name] = seconds

    def report(self) -> str:
        """A summary of the calls made, for the test log."""
        lines = [f"calls: {self.calls} in {self.examples} examples ({self.injected} n-predict metadata injected)"]
        lines.append("errno histogram: " + ", ".join(f"{rc}: {n}" for rc, n in sorted(self.errnos.items())))
        for name in SIGNATURES:
            per = {rc: n for (imp, rc), n in self.by_import_errno.items() if imp == name}
            lines.append(
                f"  {name:27s} {self.by_import[name]:6d}  "
                + " ".join(f"{rc}:{n}" for rc, n in sorted(per.items()))
                + f"  (slowest {self.slowest.get(name, 0.0) * 1000:.0f} ms)"
            )
        return "\n".join(lines)


class ErrorLogWatcher(logging.Handler):
    """Collects the host's ERROR records: an exception the ABI layer turned into errno 5
    ("internal error"), a worker error or a failed llama_decode is a host bug, not an answer."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the message of an ERROR record from the host."""
        if not record.name.startswith("wasinn_host.llama"):
            self.records.append(record)

    def take(self) -> list[str]:
        """The ERROR messages since the last call (and forget them)."""
        out = [
            r.getMessage() + (f" [{r.exc_info[0].__name__}: {r.exc_info[1]}]" if r.exc_info and r.exc_info[1] else "")
            for r in self.records
        ]
        self.records.clear()
        return out


@dataclass
class FuzzEnv:
    """One registry / WasiNN / compiled guest shared by every example of a run."""

    nn: WasiNN
    registry: ModelRegistry
    module: wasmtime.Module
    model_bytes: bytes
    model_digest: str
    stats: FuzzStats
    wide_models: bool = False
    """Draw model bytes for ``load`` freely (every new GGUF-looking blob costs the host a child-process
    check, about 0.5 s) instead of from the fixed :attr:`blobs` catalogue (checked once per run)."""
    call_timeout: float = 120.0
    blobs: dict[str, list[bytes]] = field(default_factory=dict)
    """Model bytes for ``load`` by kind: "full", "prefix", "corrupt", "junk" (fixed per run)."""
    pinned: dict[int, Any] = field(default_factory=dict)
    """Models from guest bytes the environment keeps one reference to (id -> LoadedModel): the full
    file and the corrupted variants llama.cpp accepts, so loading them again skips the check."""
    errors: ErrorLogWatcher = field(default_factory=ErrorLogWatcher)


def make_env(model_dir: pathlib.Path, *, wide_models: bool = False, call_timeout: float = 120.0) -> FuzzEnv:
    """Build the test models in ``model_dir`` (if absent) and a private registry with preloads
    ``succ``, ``noisy`` and ``missing`` (the reference counts checked here assume nobody else uses it)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    succ = model_dir / "successor.gguf"
    noisy = model_dir / "successor-random.gguf"
    if not succ.exists():
        write_successor_model(succ)
    if not noisy.exists():
        write_successor_model(noisy, logit_gap=1.0)
    registry = ModelRegistry(
        [
            f"succ:GGML:AUTO:{succ}",
            f"noisy:GGML:AUTO:{noisy}",
            f"missing:GGML:CPU:{model_dir / 'no-such-model.gguf'}",
        ]
    )
    nn = WasiNN(registry=registry, limits=FUZZ_LIMITS)
    module = wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(abi_guest_wat(MEMORY_PAGES))))
    data = succ.read_bytes()
    assert len(data) < MEM - 65536, "the successor model no longer fits the fuzz guest's memory"
    env = FuzzEnv(
        nn,
        registry,
        module,
        data,
        hashlib.sha256(data).hexdigest(),
        FuzzStats(),
        wide_models,
        call_timeout,
        _blob_catalogue(succ, data),
    )
    # Load the full file and the corrupted variants once (the bad ones are refused and remembered by
    # the registry); keep a reference to those that load, so each example's load finds them loaded.
    for blob in env.blobs["full"] + env.blobs["corrupt"]:
        try:
            model = registry.acquire_bytes(blob, ModelParams())
        except WasiNNError:
            continue
        env.pinned[id(model)] = model
    return env


def _blob_catalogue(path: pathlib.Path, data: bytes) -> dict[str, list[bytes]]:
    """Truncated, corrupted and junk GGUF files, the same every run."""
    import random

    import gguf

    reader = gguf.GGUFReader(path)
    field_starts = sorted(f.offset for f in reader.fields.values())
    header_end = min(t.data_offset for t in reader.tensors)
    tokens = reader.fields["tokenizer.ggml.tokens"].offset
    rng = random.Random(20260521)
    corrupt: list[bytes] = []
    one = struct.pack("<Q", 1)
    at = data.index(one + b"a" + one + b"b")  # vocabulary strings "a", "b"
    duplicate = bytearray(data)
    duplicate[at + 17] = ord("a")  # a duplicate token string: llama.cpp asserts (a child dies)
    corrupt.append(bytes(duplicate))
    for start, n_bytes in ((0, 2), (tokens, 1), (tokens, 4), (field_starts[-2], 2), (field_starts[-1], 3)):
        blob = bytearray(data)  # the header, the vocabulary, the last metadata fields
        for _ in range(n_bytes):
            blob[rng.randrange(start, min(start + 512, header_end))] = rng.randrange(256)
        corrupt.append(bytes(blob))
    return {
        "full": [data],
        "prefix": [
            data[:n] for n in (4, 8, 24, 100, 1000, field_starts[-1], header_end, len(data) // 2, len(data) - 1)
        ],
        "corrupt": corrupt,
        "junk": [b"GGUF", b"GGUF\x03\x00\x00\x00", b"GGUF" + bytes(range(32)), b"GGUF" + b"\xff" * 24],
    }
