"""A hypothesis state machine that fuzzes all 12 ``wasi_ephemeral_nn`` imports through a real wasm instance.

Used by ``tests/ephemeral/test_fuzz.py`` (a short, derandomized CI run) and ``scripts/tools/fuzz_abi.py`` (long runs).

Each example gets a fresh Store holding one instance of the ABI guest (``abi_guest.py``).  Rules call
the imports with random *and* edge-case pointers (0, inside, exactly at the end, one past, straddling,
0xFFFFFFFF, huge), lengths, handles (valid ones from Bundles, stale ones, random ones), indices,
tensor structs (types 2/3 with garbage high bytes, other types, odd dims), configuration JSON (valid,
invalid, wrong value types, out of range) and model bytes for ``load`` (truncated and corrupted copies
of the real successor model, including one that makes llama.cpp abort, random bytes, the full file now
and then; from a fixed catalogue, since the host checks each new GGUF in a child process, or drawn
freely with ``wide_models``).

Checked after every call:

* the call returns an int (no trap: an exception escaping the host traps the guest) and the process
  did not crash or hang (a watchdog dumps the stacks and exits if one call takes over ``call_timeout``);
* the host logged no ERROR (an exception the ABI layer swallowed into errno 5, a worker error);
* the errno is in the spec's set {0..8, 100..103};
* guest memory is byte-for-byte what it should be: unchanged outside the ranges the guest named for
  output, and inside them exactly the handle / the output bytes / the u32 size the host reported
  (taken from the host's own state before the call), so "bytes written == size reported" holds;
* errnos the spec fixes regardless of argument order: unknown handles give 1, an out-of-bounds
  pointer gives 1, ``get_output`` gives 0 or 7 exactly as the buffer size says, ``unload`` /
  ``finalize_execution_context`` / ``fini_single`` succeed exactly on live handles, new handles are
  numbered from 0 and never reused, and ``load_by_name`` returns the cached handle;
* the host's tables (``HandleTables.graphs`` / ``contexts`` / ``by_name``) equal the model's, every loaded
  model's reference count equals the graphs and contexts that use it, models from guest bytes are
  freed with their last user, and the registry holds at most one model per (preload, load-time
  config profile); after each example (Store freed) no model is referenced any more.

Generation is kept bounded: before a ``compute`` whose context could generate without limit (its
``n-predict`` is unlimited and the model / prompt / sampling do not guarantee a quick EOS), the rule
first sends metadata ``{"n-predict": k}`` (k in 0..8) through ``set_input``, as a checked call too.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import faulthandler
import json
import logging
import struct
import sys
import time
from typing import Any, Iterable

import wasmtime
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)

from wasinn_host.core.config.params import SamplingParams
from wasinn_host.ephemeral.imports import SIGNATURES
from wasinn_host.guest.stdout import python_stdout
from wasinn_host.guest.store_tables import store_key
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.fuzz.abi_env import (
    DIGIT_IDS,
    HANDLE_IMPORTS,
    MAX_FILE_MODELS,
    MEM,
    MODEL_PROFILES,
    PRELOAD_NAMES,
    U32,
    VALID_ERRNOS,
    FuzzEnv,
    FuzzStats,
)
from wasinn_host.testing.fuzz.abi_values import (
    configs,
    indices,
    length_for,
    prompts,
    ptr_for,
    random_handles,
    u32s,
    weighted,
)
from wasinn_host.testing.fuzz.runs import run_machine

# -- the state machine ----------------------------------------------------------------------------


def _contains(ptr: int, length: int) -> bool:
    """Is [ptr, ptr+length) inside guest memory (u32 arguments, no wrap-around)?"""
    return (ptr & U32) + (length & U32) <= MEM


_REAL_STDERR = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.restype = ctypes.c_int
_memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


class AbiFuzzMachine(RuleBasedStateMachine):
    """Random call sequences over all 12 imports; see the module docstring.  Bind an environment
    with :func:`machine_for` before running."""

    ENV: FuzzEnv  # set by machine_for()

    graphs = Bundle("graphs")
    contexts = Bundle("contexts")

    def __init__(self) -> None:
        super().__init__()
        env = self.ENV
        self.env = env
        self.nn = env.nn
        self.store = wasmtime.Store(env.nn.engine)
        env.nn.attach(self.store, stdout=python_stdout)  # sys.stdout: scripts/tools/fuzz_abi.py discards it
        linker = wasmtime.Linker(env.nn.engine)
        env.nn.add_to_linker(linker)
        instance = linker.instantiate(self.store, env.module)
        exports = instance.exports(self.store)
        memory = exports["memory"]
        assert isinstance(memory, wasmtime.Memory)
        self.guest = AbiGuest(env.nn, self.store, instance, memory)
        assert self.guest.size == MEM
        self.funcs: dict[str, wasmtime.Func] = {}
        for name in SIGNATURES:
            func = exports[f"nn_{name}"]
            assert isinstance(func, wasmtime.Func)
            self.funcs[name] = func
        self.key = store_key(self.store)
        state = env.nn.imports.stores.lookup(self.key)
        assert state is not None, "attach() registered the Store"
        self.state = state
        # what guest memory must hold: every write of ours goes here too; the host may only
        # change the ranges a call names for output (checked, then put back from here)
        self.shadow = bytearray(MEM)
        self.shadow_address = ctypes.addressof((ctypes.c_char * MEM).from_buffer(self.shadow))
        # the model of the host's tables
        self.live_graphs: set[int] = set()
        self.live_contexts: dict[int, int] = {}  # context -> graph
        self.by_name: dict[str, int] = {}
        self.next_graph = 0
        self.next_context = 0
        self.wild = True
        self.limits = env.nn.imports.limits
        env.stats.examples += 1

    # -- memory ------------------------------------------------------------------------

    def _base(self) -> int:
        return ctypes.addressof(self.guest.memory.data_ptr(self.store).contents)

    def put(self, ptr: int, data: bytes) -> None:
        """Write what fits of ``data`` at ``ptr`` (nothing if ``ptr`` is outside memory)."""
        if ptr < MEM and data:
            n = min(len(data), MEM - ptr)
            ctypes.memmove(self._base() + ptr, data, n)
            self.shadow[ptr : ptr + n] = data[:n]

    def read(self, ptr: int, n: int) -> bytes:
        """Read guest memory."""
        return ctypes.string_at(self._base() + ptr, n)

    def ptr(self, data: st.DataObject, n: int, label: str) -> int:
        """A guest pointer for ``n`` bytes: mostly in bounds, sometimes hostile."""
        return data.draw(ptr_for(n, self.wild), label=label)

    def length(self, data: st.DataObject, n: int, label: str) -> int:
        """A length near ``n``: mostly right, sometimes hostile."""
        return data.draw(length_for(n, self.wild), label=label)

    def draw_wild(self, data: st.DataObject) -> None:
        """Two calls in three name only valid memory (so call sequences get deep); the rest go wild."""
        self.wild = data.draw(weighted((2, st.just(False)), (1, st.just(True))), label="wild")

    # -- the checked call ----------------------------------------------------------------

    def call(self, name: str, *args: int) -> int:
        """Call import ``name`` and return its errno; then check memory with :meth:`expect`."""
        signed = [a - (1 << 32) if a >= (1 << 31) else a for a in args]
        # a hung call: dump every thread's stack to the real stderr (pytest may be capturing) and exit
        faulthandler.dump_traceback_later(self.env.call_timeout, exit=True, file=_REAL_STDERR)
        started = time.perf_counter()
        try:
            rc = self.funcs[name](self.store, *signed)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            raise AssertionError(f"{name}{tuple(args)} trapped (an exception escaped the host): {exc}") from None
        finally:
            faulthandler.cancel_dump_traceback_later()
        self.env.stats.record(name, rc, time.perf_counter() - started)
        errors = self.env.errors.take()
        assert not errors, f"{name}{tuple(args)} -> errno {rc} logged a host error: {errors}"
        assert isinstance(rc, int), f"{name} returned {rc!r}"
        assert rc in VALID_ERRNOS, f"{name}{tuple(args)} returned errno {rc}, not in the spec's set"
        return rc

    def expect(
        self,
        name: str,
        args: tuple[int, ...],
        rc: int,
        writes: Iterable[tuple[int, bytes]] = (),
        optional: Iterable[tuple[int, bytes]] = (),
    ) -> None:
        """Guest memory must be what it was before the call with exactly ``writes`` applied in order
        (each of ``optional`` may also have been applied).  Afterwards the written ranges are put back."""
        writes, optional = list(writes), list(optional)
        spans = sorted({(p, p + len(d)) for p, d in writes + optional if d})
        merged: list[list[int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        for a, b in merged:
            got = self.read(a, b - a)
            want = bytearray(self.shadow[a:b])
            for p, d in writes:
                if p < b and p + len(d) > a:
                    lo, hi = max(p, a), min(p + len(d), b)
                    want[lo - a : hi - a] = d[lo - p : hi - p]
            ok = got == want
            for p, d in optional:
                if not ok and a <= p and p + len(d) <= b:
                    alt = bytearray(want)
                    alt[p - a : p - a + len(d)] = d
                    ok = got == alt
            assert ok, (
                f"{name}{args} -> errno {rc}: guest memory [{a:#x}, {b:#x}) holds {got[:48]!r}, "
                f"expected {bytes(want[:48])!r}"
            )
            ctypes.memmove(self._base() + a, bytes(self.shadow[a:b]), b - a)
        if _memcmp(self._base(), self.shadow_address, MEM) != 0:
            now = self.read(0, MEM)
            diff = [i for i in range(MEM) if now[i] != self.shadow[i]]
            raise AssertionError(
                f"{name}{args} -> errno {rc} changed guest memory outside the output ranges it names: "
                f"{len(diff)} bytes differ in [{diff[0]:#x}, {diff[-1]:#x}] "
                f"(allowed: {[(hex(a), hex(b)) for a, b in merged]})"
            )

    # -- generation bounds ----------------------------------------------------------------

    def _deterministic(self, model: Any) -> bool:
        label = model.label
        return label == "succ" or label == f"bytes:{self.env.model_digest[:12]}"

    def bounded(self, ctx: Any) -> bool:
        """Can ``compute`` on this host execution context only generate a few tokens?"""
        ctx = ctx.inner  # the core context behind the guest's execution context
        model = ctx.model
        if model.params.embedding or model.n_ctx_seq <= 64 or ctx.prompt_tokens is None:
            return True
        stop = ctx.params.stopping
        if 0 <= stop.n_predict <= 16 or 0 < stop.max_time_ms <= 300:
            return True
        if stop.ignore_eos or ctx.params.options.chat_template is not False or not self._deterministic(model):
            return False
        sampling = ctx.params.sampling
        d = SamplingParams()
        plain = (
            dataclasses.replace(
                sampling, seed=d.seed, temp=d.temp, top_k=d.top_k, top_p=d.top_p, min_p=d.min_p, n_probs=0
            )
            == d
        )
        tokens = ctx.prompt_tokens
        return plain and sampling.temp <= 1.0 and bool(tokens) and tokens[-1] not in DIGIT_IDS

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def host_tables_match_the_model(self) -> None:
        """The Store's tables match the model's, and models are referenced exactly as used."""
        state = self.state
        assert self.nn.imports.stores.lookup(self.key) is state, "the Store's state was replaced or dropped"
        assert set(state.graphs) == self.live_graphs, (sorted(state.graphs), sorted(self.live_graphs))
        assert set(state.contexts) == set(self.live_contexts), (sorted(state.contexts), sorted(self.live_contexts))
        assert state.by_name == self.by_name, (state.by_name, self.by_name)
        assert (state.next_graph, state.next_context) == (self.next_graph, self.next_context)
        models = self.env.registry.loaded()
        uses = collections.Counter(id(g.graph.model) for g in state.graphs.values())  # type: ignore[attr-defined]
        uses.update(id(c.inner.model) for c in state.contexts.values())  # type: ignore[attr-defined]
        for model in models:
            want = uses[id(model)] + (id(model) in self.env.pinned)
            assert model.refs == want, f"model {model.label}: refs {model.refs}, used {want} times"
            if model.key[0] == "bytes":
                assert model.refs > 0, f"model {model.label} from guest bytes outlived its users"
        files = [m for m in models if m.key[0] == "file"]
        assert len(files) <= MAX_FILE_MODELS, f"{len(files)} named models loaded: {[m.params for m in files]}"

    def teardown(self) -> None:
        """Free the Store; no model may stay referenced by it."""
        self.nn.detach(self.store)
        assert self.nn.imports.stores.lookup(self.key) is None
        pinned = self.env.pinned
        leftovers = [
            (m.label, m.refs)
            for m in self.env.registry.loaded()
            if m.refs != (id(m) in pinned) or (m.key[0] == "bytes" and id(m) not in pinned)
        ]
        assert not leftovers, f"models still referenced after the Store was freed: {leftovers}"

    # -- helpers for rules ---------------------------------------------------------------

    def _new_graph(self, rc: int, name: str | None) -> Any:
        """The handle a successful load must have returned (and the model's update), else no handle."""
        if rc != 0:
            return multiple()
        if name is not None and name in self.by_name:
            return self.by_name[name]
        handle = self.next_graph
        self.next_graph += 1
        self.live_graphs.add(handle)
        if name is not None:
            self.by_name[name] = handle
        return handle

    def _write_tensor(self, data: st.DataObject, payload: bytes) -> int:
        """Place a tensor struct for ``payload``; return the struct's pointer."""
        valid_type = st.sampled_from([3, 2])
        ttype = data.draw(
            valid_type
            if not self.wild
            else weighted(
                (8, valid_type),
                (2, st.integers(1, 0xFF_FFFF).map(lambda hi: (hi << 8) | 3)),  # garbage padding bytes
                (1, st.integers(1, 0xFF_FFFF).map(lambda hi: (hi << 8) | 2)),
                (2, st.sampled_from([0, 1, 4, 5, 6, 0xFF, 0x300])),
                (1, u32s),
            ),
            label="type",
        )
        sane_dims = st.sampled_from([[len(payload)], [1], [1, len(payload)], []])
        dims = data.draw(
            sane_dims if not self.wild else weighted((6, sane_dims), (1, st.lists(u32s, max_size=9))), label="dims"
        )
        dims_raw = struct.pack(f"<{len(dims)}I", *dims)
        data_ptr = self.ptr(data, len(payload), "data_ptr")
        dims_ptr = self.ptr(data, len(dims_raw), "dims_ptr")
        struct_ptr = self.ptr(data, 20, "tensor_ptr")
        fields = struct.pack(
            "<5I",
            dims_ptr,
            self.length(data, len(dims), "dims_len"),
            ttype,
            data_ptr,
            self.length(data, len(payload), "data_len"),
        )
        self.put(data_ptr, payload)
        self.put(dims_ptr, dims_raw)
        self.put(struct_ptr, fields)
        return struct_ptr

    def _set_metadata(self, ctx: int, text: bytes) -> int:
        """A well-formed metadata set_input (used to bound generation); checked like any call."""
        ptr = MEM - 65536  # scratch: tensor struct, dims, then the text
        self.put(ptr, struct.pack("<5I", ptr + 20, 1, 3, ptr + 32, len(text)))
        self.put(ptr + 20, struct.pack("<I", len(text)))
        self.put(ptr + 32, text)
        rc = self.call("set_input", ctx, 1, ptr)
        self.expect("set_input", (ctx, 1, ptr), rc)
        return rc

    # -- initial state: a graph, and a context with a prompt (so sequences reach compute) -----

    def _load_clean(self, data: st.DataObject) -> int:
        name = data.draw(weighted((3, st.just("succ")), (1, st.just("noisy"))), label="initial model")
        config = json.dumps(data.draw(st.sampled_from(MODEL_PROFILES), label="initial profile")).encode()
        raw = name.encode()
        name_ptr, config_ptr, out = 0x100, 0x200, 0x40
        self.put(name_ptr, raw)
        self.put(config_ptr, config)
        args = (name_ptr, len(raw), config_ptr, len(config), out)
        rc = self.call("load_by_name_with_config", *args)
        assert rc == 0, f"load_by_name_with_config({name!r}, {config!r}) gave {rc}"
        handle = self._new_graph(rc, name)
        self.expect("load_by_name_with_config", args, rc, [(out, struct.pack("<I", handle))])
        return handle

    @initialize(target=graphs, data=st.data())
    def initial_graph(self, data: st.DataObject) -> int:
        """Start with a loaded graph."""
        return self._load_clean(data)

    @initialize(target=contexts, data=st.data())
    def initial_context(self, data: st.DataObject) -> int:
        """Start with an execution context holding a prompt."""
        graph = self._load_clean(data)
        rc = self.call("init_execution_context", graph, 0x40)
        assert rc == 0
        handle = self.next_context
        self.next_context += 1
        self.live_contexts[handle] = graph
        self.expect("init_execution_context", (graph, 0x40), rc, [(0x40, struct.pack("<I", handle))])
        self.wild = False
        prompt = data.draw(prompts, label="initial prompt")
        tensor_ptr = self._write_tensor(data, prompt)
        rc = self.call("set_input", handle, 0, tensor_ptr)
        self.expect("set_input", (handle, 0, tensor_ptr), rc)
        return handle

    # -- rules: loading ------------------------------------------------------------------

    @rule(target=graphs, data=st.data())
    def load(self, data: st.DataObject) -> Any:
        """``load`` of model bytes: whole, truncated, corrupted or junk."""
        self.draw_wild(data)
        env = self.env
        model = env.model_bytes
        kind = data.draw(
            weighted(
                (1, st.just("full")),
                (4, st.just("prefix")),
                (2, st.just("corrupt")),
                (2, st.just("random")),
                (1, st.just("preload")),
                (1, st.just("empty")),
            ),
            label="model kind",
        )
        if not env.wide_models and kind in ("full", "prefix", "corrupt", "random"):
            blob = data.draw(st.sampled_from(env.blobs[kind if kind != "random" else "junk"]), label="blob")
            if kind == "random" and data.draw(st.booleans()):
                blob = data.draw(st.binary(max_size=64).filter(lambda b: not b.startswith(b"GGUF")), label="blob")
        elif kind == "full":
            blob = model
        elif kind == "prefix":
            blob = model[: data.draw(weighted((3, st.integers(0, 4096)), (1, st.integers(0, len(model) - 1))))]
        elif kind == "corrupt":
            size = data.draw(weighted((3, st.integers(8, 32768)), (1, st.just(len(model)))))
            damaged = bytearray(model[:size])
            for _ in range(data.draw(st.integers(1, 8))):
                damaged[data.draw(st.integers(0, min(size, 32768) - 1))] = data.draw(st.integers(0, 255))
            blob = bytes(damaged)
        elif kind == "random":
            blob = data.draw(st.one_of(st.binary(max_size=64), st.binary(max_size=16).map(lambda b: b"GGUF" + b)))
        elif kind == "preload":
            blob = b"preload:" + data.draw(st.sampled_from([b"succ", b"/etc/passwd", b""]))
        else:
            blob = b""
        count = data.draw(
            st.sampled_from([1, 2])
            if not self.wild
            else weighted((3, st.sampled_from([1, 2])), (1, st.sampled_from([0, 3, 7, 0x2000_0000, U32])), (1, u32s))
        )
        config, _ = data.draw(configs(model_keys="none"), label="config")
        if len(blob) > MEM // 2:  # the full model: keep the rest out of its way
            blob_ptr = data.draw(st.sampled_from([0, MEM - len(blob)]), label="blob_ptr")
            lo, hi = (blob_ptr + len(blob), MEM) if blob_ptr == 0 else (0, blob_ptr)
            array_ptr = lo
            if len(config) > hi - lo - 64:
                config = b'{"n-predict": 3}'
            config_ptr = data.draw(st.integers(lo + 16, hi - len(config)), label="config_ptr")
        else:
            blob_ptr = self.ptr(data, len(blob), "blob_ptr")
            array_ptr = self.ptr(data, 16, "builders_ptr")
            config_ptr = self.ptr(data, len(config), "config_ptr")
        out = self.ptr(data, 4, "graph_out")
        entries = struct.pack(
            "<4I",
            blob_ptr,
            self.length(data, len(blob), "blob_len"),
            config_ptr,
            self.length(data, len(config), "config_len"),
        )
        encoding = data.draw(
            st.just(6) if not self.wild else weighted((6, st.just(6)), (2, st.integers(0, 14)), (1, u32s)),
            label="encoding",
        )
        target = data.draw(
            st.integers(0, 2) if not self.wild else weighted((4, st.integers(0, 2)), (1, st.just(3)), (1, u32s)),
            label="target",
        )
        self.put(blob_ptr, blob)
        self.put(config_ptr, config)
        self.put(array_ptr, entries)
        args = (array_ptr, count, encoding, target, out)
        rc = self.call("load", *args)
        if rc == 0:
            assert encoding == 6 and target in (0, 1, 2) and count >= 1 and _contains(out, 4), args
        if encoding != 6:
            assert rc == 2, f"load with encoding {encoding} gave {rc}, expected 2 InvalidEncoding"
        elif count >= 1 and not (_contains(array_ptr, 8 * min(count, 2)) and _contains(out, 4)):
            assert rc in (1, 4, 6), f"load with an out-of-bounds builder array / out pointer gave {rc}"
        handle = self._new_graph(rc, None)
        self.expect("load", args, rc, [(out, struct.pack("<I", handle))] if rc == 0 else [])
        return handle

    @rule(target=graphs, data=st.data())
    def load_by_name(self, data: st.DataObject) -> Any:
        """``load_by_name`` of a known, missing or hostile name."""
        return self._load_by_name(data, with_config=False)

    @rule(target=graphs, data=st.data())
    def load_by_name_with_config(self, data: st.DataObject) -> Any:
        """``load_by_name_with_config`` with a valid, out-of-range or malformed config."""
        return self._load_by_name(data, with_config=True)

    def _load_by_name(self, data: st.DataObject, with_config: bool) -> Any:
        self.draw_wild(data)
        raw = data.draw(
            weighted(
                (8, st.sampled_from([b"succ", b"noisy"])),
                (2, st.just(b"missing")),
                (2, st.sampled_from([b"", b"nope", b"SUCC", b"succ\x00", b"succ ", b"\xff\xfe", b"n" * 300])),
                (1, st.binary(max_size=12)),
            ),
            label="name",
        )
        name_ptr = self.ptr(data, len(raw), "name_ptr")
        name_len = self.length(data, len(raw), "name_len")
        out = self.ptr(data, 4, "graph_out")
        label = "load_by_name_with_config" if with_config else "load_by_name"
        config, config_kind = b"", "valid"
        if with_config:
            config, config_kind = data.draw(configs(), label="config")
            config_ptr = self.ptr(data, len(config), "config_ptr")
            config_len = self.length(data, len(config), "config_len")
            self.put(config_ptr, config)
            self.put(name_ptr, raw)
            args: tuple[int, ...] = (name_ptr, name_len, config_ptr, config_len, out)
            pointers_ok = _contains(name_ptr, name_len) and _contains(config_ptr, config_len) and _contains(out, 4)
            config_intact = config_len == len(config) and self.shadow[config_ptr : config_ptr + len(config)] == config
        else:
            self.put(name_ptr, raw)
            args = (name_ptr, name_len, out)
            pointers_ok = _contains(name_ptr, name_len) and _contains(out, 4)
            config_intact = True
        # what the guest actually named (after overlaps, with the length it passed)
        name_sent = bytes(self.shadow[name_ptr : name_ptr + name_len]) if pointers_ok else None
        rc = self.call(label, *args)
        config_errno = () if config_kind == "valid" and config_intact else (2,)  # the config may be read first
        if not pointers_ok:
            assert rc in (1, *config_errno), f"{label}{args} with an out-of-bounds pointer gave {rc}"
        name: str | None = None
        if name_sent is not None:
            try:
                name = name_sent.decode("utf-8")
            except UnicodeDecodeError:
                if config_intact and config_kind == "valid":
                    assert rc == 1, f"{label}: a name that is not UTF-8 gave {rc}"
        if rc == 0:
            assert pointers_ok and name in PRELOAD_NAMES[:2], f"{label} succeeded for {name!r}"
        if pointers_ok and name is not None and config_intact and config_kind == "valid":
            if name in self.by_name:
                assert rc == 0, f"{label}({name!r}) of a cached name gave {rc}, expected the cached handle"
            else:  # a full graph table (Limits.max_graphs_per_store) may answer 4 Busy first
                busy = (4,) if len(self.live_graphs) >= self.limits.max_graphs_per_store else ()
                if name == "missing":
                    assert rc in (103, *busy), f"{label}('missing') gave {rc}, expected 103 ModelNotFound"
                elif name not in PRELOAD_NAMES:
                    assert rc in (8, *busy), f"{label}({name!r}) gave {rc}, expected 8 NotFound"
        handle = self._new_graph(rc, name)
        self.expect(label, args, rc, [(out, struct.pack("<I", handle))] if rc == 0 else [])
        return handle

    @rule(graph=graphs)
    def unload(self, graph: int) -> None:
        """``unload`` of a live or dead graph handle."""
        self._unload(graph)

    def _unload(self, graph: int) -> None:
        rc = self.call("unload", graph)
        live = graph in self.live_graphs
        assert (rc == 0) == live and rc in (0, 1), (
            f"unload({graph}) gave {rc}; the graph is {'live' if live else 'not live'}"
        )
        if rc == 0:
            self.live_graphs.discard(graph)
            self.by_name = {n: h for n, h in self.by_name.items() if h != graph}
        self.expect("unload", (graph,), rc)

    # -- rules: contexts -----------------------------------------------------------------

    @rule(target=contexts, data=st.data(), graph=graphs)
    def init_execution_context(self, data: st.DataObject, graph: int) -> Any:
        """``init_execution_context`` on a live or dead graph."""
        return self._init(data, graph)

    def _init(self, data: st.DataObject, graph: int) -> Any:
        self.draw_wild(data)
        out = self.ptr(data, 4, "ctx_out")
        rc = self.call("init_execution_context", graph, out)
        expected_ok = graph in self.live_graphs and _contains(out, 4)
        full = len(self.live_contexts) >= self.limits.max_contexts_per_store  # then 4 Busy
        assert rc == ((4 if full else 0) if expected_ok else 1), f"init_execution_context({graph}, {out:#x}) gave {rc}"
        if rc != 0:
            self.expect("init_execution_context", (graph, out), rc)
            return multiple()
        handle = self.next_context
        self.next_context += 1
        self.live_contexts[handle] = graph
        self.expect("init_execution_context", (graph, out), rc, [(out, struct.pack("<I", handle))])
        return handle

    @rule(ctx=contexts)
    def finalize_execution_context(self, ctx: int) -> None:
        """``finalize_execution_context`` of a live or dead context."""
        self._finalize(ctx)

    def _finalize(self, ctx: int) -> None:
        rc = self.call("finalize_execution_context", ctx)
        live = ctx in self.live_contexts
        assert (rc == 0) == live and rc in (0, 1), f"finalize_execution_context({ctx}) gave {rc}; live: {live}"
        self.live_contexts.pop(ctx, None)
        self.expect("finalize_execution_context", (ctx,), rc)

    @rule(data=st.data(), ctx=contexts, index=indices)
    def set_input(self, data: st.DataObject, ctx: int, index: int) -> None:
        """``set_input`` of a prompt or metadata, with hostile tensors too."""
        self._set_input(data, ctx, index)

    @rule(data=st.data(), ctx=contexts)
    def set_input_prompt(self, data: st.DataObject, ctx: int) -> None:
        """A well-formed prompt (guests set one far more often than anything else)."""
        self.wild = False
        payload = data.draw(prompts, label="prompt")
        tensor_ptr = self._write_tensor(data, payload)
        rc = self.call("set_input", ctx, 0, tensor_ptr)
        self.expect("set_input", (ctx, 0, tensor_ptr), rc)

    def _set_input(self, data: st.DataObject, ctx: int, index: int) -> None:
        self.draw_wild(data)
        if index == 1 or data.draw(weighted((8, st.just(False)), (1, st.just(True)))):
            payload, _ = data.draw(configs(model_keys="any"), label="metadata")
        else:
            payload = data.draw(prompts, label="prompt")
        tensor_ptr = self._write_tensor(data, payload)
        args = (ctx, index, tensor_ptr)
        rc = self.call("set_input", *args)
        if ctx not in self.live_contexts or not _contains(tensor_ptr, 20):
            assert rc == 1, f"set_input{args} gave {rc}, expected 1 (dead context or tensor struct out of bounds)"
        self.expect("set_input", args, rc)

    @rule(data=st.data(), ctx=contexts)
    def compute(self, data: st.DataObject, ctx: int) -> None:
        """``compute`` (kept short by an injected n-predict where needed)."""
        self._compute(data, ctx)

    def _compute(self, data: st.DataObject, ctx: int) -> None:
        host_ctx = self.state.contexts.get(ctx)
        k = data.draw(st.integers(0, 8), label="n-predict if unbounded")  # drawn always: no draw may depend on the host
        if host_ctx is not None and not self.bounded(host_ctx):
            self.env.stats.injected += 1
            assert self._set_metadata(ctx, json.dumps({"n-predict": k}).encode()) == 0
            assert self.bounded(host_ctx)
        self._simple("compute", ctx)

    @rule(ctx=contexts)
    def compute_single(self, ctx: int) -> None:
        """``compute_single``."""
        self._simple("compute_single", ctx)

    @rule(ctx=contexts)
    def fini_single(self, ctx: int) -> None:
        """``fini_single``."""
        self._fini_single(ctx)

    def _fini_single(self, ctx: int) -> None:
        rc = self._simple("fini_single", ctx)
        assert rc == (0 if ctx in self.live_contexts else 1), f"fini_single({ctx}) gave {rc}"

    def _simple(self, name: str, ctx: int) -> int:
        rc = self.call(name, ctx)
        if ctx not in self.live_contexts:
            assert rc == 1, f"{name}({ctx}) on a dead context gave {rc}"
        self.expect(name, (ctx,), rc)
        return rc

    @rule(data=st.data(), ctx=contexts, index=indices)
    def get_output(self, data: st.DataObject, ctx: int, index: int) -> None:
        """``get_output`` with exact, short, huge or hostile buffers."""
        self._get_output(data, "get_output", ctx, index)

    @rule(data=st.data(), ctx=contexts, index=indices)
    def get_output_single(self, data: st.DataObject, ctx: int, index: int) -> None:
        """``get_output_single`` with exact, short, huge or hostile buffers."""
        self._get_output(data, "get_output_single", ctx, index)

    # -- any handle-taking import with a random handle (0..5 are often live: handles start at 0) --

    @rule(target=contexts, data=st.data(), name=st.sampled_from(HANDLE_IMPORTS), handle=random_handles, index=indices)
    def random_handle_call(self, data: st.DataObject, name: str, handle: int, index: int) -> Any:
        """Any handle import with a random, possibly dead, handle."""
        if name == "init_execution_context":
            return self._init(data, handle)
        if name == "unload":
            self._unload(handle)
        elif name == "finalize_execution_context":
            self._finalize(handle)
        elif name == "set_input":
            self._set_input(data, handle, index)
        elif name == "compute":
            self._compute(data, handle)
        elif name == "fini_single":
            self._fini_single(handle)
        elif name == "compute_single":
            self._simple(name, handle)
        else:
            self._get_output(data, name, handle, index)
        return multiple()

    def _get_output(self, data: st.DataObject, name: str, ctx: int, index: int) -> None:
        self.draw_wild(data)
        host_ctx = self.state.contexts.get(ctx)
        expected: bytes | None = None
        if host_ctx is not None:  # what the host will copy out, from its own state
            expected = host_ctx.get_output(index) if name == "get_output" else host_ctx.get_output_single(index)
        # The output's length depends on the host (timings, sampling), so nothing drawn below may
        # depend on it: draw choices and raw numbers, then compute the arguments from them.
        guess = data.draw(st.integers(0, 64), label="size if dead")
        n = len(expected) if expected is not None else guess
        size_kind = data.draw(
            st.sampled_from(["exact", "more", "24576", "one short"])
            if not self.wild
            else st.sampled_from(
                ["exact", "more", "24576", "exact", "more", "zero", "one short", "one more", "mem", "u32", "random"]
            ),
            label="out_max kind",
        )
        raw = data.draw(u32s, label="raw")
        out_max = {
            "exact": n,
            "more": n + raw % 4097,
            "24576": max(24576, n),
            "zero": 0,
            "one short": max(n - 1, 0),
            "one more": n + 1,
            "mem": MEM,
            "u32": U32,
            "random": raw,
        }[size_kind]
        place = data.draw(
            st.sampled_from(["inside"])
            if not self.wild
            else st.sampled_from(["inside", "inside", "inside", "at end", "one past end", "zero", "u32", "random"]),
            label="out_ptr kind",
        )
        room = max(MEM - min(out_max, MEM), 0)
        out_ptr = {
            "inside": raw % (room + 1),
            "at end": room,
            "one past end": room + 1,
            "zero": 0,
            "u32": U32,
            "random": (raw * 2654435761) & U32,
        }[place]
        written_ptr = data.draw(
            weighted(
                (8, ptr_for(4, self.wild)),
                (1, st.integers(0, 3).map(lambda d: -1 - d)),  # inside the output buffer (resolved below)
            ),
            label="written_ptr",
        )
        if written_ptr < 0:
            written_ptr = (out_ptr - 1 - written_ptr) & U32
        args = (ctx, index, out_ptr, out_max, written_ptr)
        rc = self.call(name, *args)
        if expected is None:
            assert rc == 1, f"{name}{args} on a dead context gave {rc}"
            self.expect(name, args, rc)
            return
        pointers_ok = _contains(out_ptr, out_max) and _contains(written_ptr, 4)
        want = (0 if len(expected) <= out_max else 7) if pointers_ok else 1
        assert rc == want, f"{name}{args}: output of {len(expected)} bytes, errno {rc}, expected {want}"
        size = struct.pack("<I", len(expected))
        if rc == 0:
            overlap = out_ptr < written_ptr + 4 and written_ptr < out_ptr + len(expected)
            if not overlap:
                assert self.read(out_ptr, len(expected)) == expected, (
                    f"{name}: the bytes written differ from the output"
                )
                assert self.read(written_ptr, 4) == size, f"{name}: the size reported differs from the bytes written"
            if index == 1:
                head = json.loads(expected)
                assert list(head)[:4] == ["input_tokens", "output_tokens", "llama_build_number", "llama_commit"]
            self.expect(name, args, rc, [(out_ptr, expected), (written_ptr, size)])
        elif rc == 7:
            self.expect(name, args, rc, [(written_ptr, size)])
        else:
            self.expect(name, args, rc, optional=[(written_ptr, size)] if _contains(written_ptr, 4) else [])


def machine_for(env: FuzzEnv) -> type[AbiFuzzMachine]:
    """The state machine class bound to ``env``."""
    return type("AbiFuzz", (AbiFuzzMachine,), {"ENV": env})


SLOW = (HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large, HealthCheck.large_base_example)
"""The health checks this machine's runs turn off (its calls are slow and its data large by design)."""


def run_fuzz(env: FuzzEnv, examples: int, steps: int, *, seed: int | None = None, shrink: bool = True) -> FuzzStats:
    """Run the machine: derandomized when ``seed`` is None, else from that seed.  Raises on a failure
    (hypothesis prints the shrunk call sequence)."""
    # one warning per rejected call would dominate the run time: only errors are logged (and checked)
    run_machine(
        machine_for(env), examples, steps, seed=seed, shrink=shrink, log=env.errors, level=logging.ERROR, suppress=SLOW
    )
    return env.stats
