"""A tiny WAT guest that re-exports every ``wasi_ephemeral_nn`` import, for ABI edge-case tests.

Each export ``nn_<name>`` calls the import of the same name with the arguments it was given,
so a test drives the real host through a real wasm instance with any pointer, length or
handle it likes, and inspects the guest's memory around the call.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

import wasmtime

from wasinn_host import WasiNN
from wasinn_host.ephemeral.imports import SIGNATURES

PAGE = 65536


def abi_guest_wat(memory_pages: int = 2, export_memory: bool = True) -> str:
    """A module importing all twelve functions and exporting each as ``nn_<name>``."""
    imports, exports = [], []
    for name, arity in SIGNATURES.items():
        params = " ".join(["i32"] * arity)
        imports.append(f'(import "wasi_ephemeral_nn" "{name}" (func ${name} (param {params}) (result i32)))')
        gets = " ".join(f"local.get {i}" for i in range(arity))
        exports.append(f'(func (export "nn_{name}") (param {params}) (result i32) {gets} call ${name})')
    memory = f'(memory (export "memory") {memory_pages})' if export_memory else f"(memory {memory_pages})"
    return "(module\n  " + "\n  ".join(imports + [memory] + exports) + "\n)"


def streaming_guest_wat(ending: str) -> str:
    """A WASI-style guest whose ``_start`` loads ``succ``, opens two contexts, streams two tokens of
    prompt "7" on the first, then runs ``ending`` (WAT instructions: trap, exit, ...)."""
    return f"""
(module
  (import "wasi_ephemeral_nn" "load_by_name" (func $load_by_name (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "init_execution_context" (func $init (param i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "set_input" (func $set_input (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "compute_single" (func $compute_single (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "succ")
  (data (i32.const 16) "7")
  ;; tensor struct at 32: dims_ptr=48 dims_len=1 type=3 data_ptr=16 data_len=1; dims at 48 = [1]
  (data (i32.const 32) "\\30\\00\\00\\00\\01\\00\\00\\00\\03\\00\\00\\00\\10\\00\\00\\00\\01\\00\\00\\00")
  (data (i32.const 48) "\\01\\00\\00\\00")
  (func (export "_start")
    (drop (call $load_by_name (i32.const 0) (i32.const 4) (i32.const 64)))
    (drop (call $init (i32.load (i32.const 64)) (i32.const 68)))
    (drop (call $init (i32.load (i32.const 64)) (i32.const 72)))
    (drop (call $set_input (i32.load (i32.const 68)) (i32.const 0) (i32.const 32)))
    (drop (call $compute_single (i32.load (i32.const 68))))
    (drop (call $compute_single (i32.load (i32.const 68))))
    {ending}))
"""


@dataclass
class AbiGuest:
    """One instance of the ABI guest in its own Store."""

    nn: WasiNN
    store: wasmtime.Store
    instance: wasmtime.Instance
    memory: wasmtime.Memory

    @classmethod
    def create(cls, nn: WasiNN, memory_pages: int = 2, dirs: Sequence[tuple[str, str]] = ()) -> "AbiGuest":
        """Instantiate the guest in a new Store attached to ``nn`` (with ``dirs`` as its preopened directories)."""
        engine = nn.engine
        linker = wasmtime.Linker(engine)
        nn.add_to_linker(linker)
        store = wasmtime.Store(engine)
        nn.attach(store, dirs=dirs)
        module = wasmtime.Module(engine, bytes(wasmtime.wat2wasm(abi_guest_wat(memory_pages))))
        instance = linker.instantiate(store, module)
        memory = instance.exports(store)["memory"]
        assert isinstance(memory, wasmtime.Memory)
        return cls(nn, store, instance, memory)

    @property
    def size(self) -> int:
        """Bytes of guest memory."""
        return self.memory.data_len(self.store)

    def call(self, name: str, *args: int) -> int:
        """Call import ``name`` through the guest with raw i32 arguments; return its errno."""
        func = self.instance.exports(self.store)[f"nn_{name}"]
        assert isinstance(func, wasmtime.Func)
        # i32 parameters are signed in wasmtime-py
        signed = [a - (1 << 32) if a >= (1 << 31) else a for a in args]
        return int(func(self.store, *signed))

    def write(self, ptr: int, data: bytes) -> None:
        """Write ``data`` into guest memory at ``ptr``."""
        self.memory.write(self.store, data, ptr)

    def read(self, ptr: int, n: int) -> bytes:
        """Read ``n`` bytes of guest memory at ``ptr``."""
        return bytes(self.memory.read(self.store, ptr, ptr + n))

    def u32(self, ptr: int) -> int:
        """Read a little-endian u32 of guest memory."""
        return int(struct.unpack("<I", self.read(ptr, 4))[0])

    # -- convenience wrappers (fixed scratch layout) -----------------------------

    NAME, CONFIG, OUT32, TENSOR, DIMS, DATA, BUF = 0x100, 0x200, 0x40, 0x60, 0x80, 0x1000, 0x8000

    def load_by_name(self, name: str, config: str | None = None) -> tuple[int, int]:
        """``load_by_name`` (or ``..._with_config``); return (errno, graph handle)."""
        raw = name.encode()
        self.write(self.NAME, raw)
        self.write(self.OUT32, b"\xee" * 4)
        if config is None:
            rc = self.call("load_by_name", self.NAME, len(raw), self.OUT32)
        else:
            cfg = config.encode()
            self.write(self.CONFIG, cfg)
            rc = self.call("load_by_name_with_config", self.NAME, len(raw), self.CONFIG, len(cfg), self.OUT32)
        return rc, self.u32(self.OUT32)

    def init(self, graph: int) -> tuple[int, int]:
        """``init_execution_context``; return (errno, context handle)."""
        self.write(self.OUT32, b"\xee" * 4)
        rc = self.call("init_execution_context", graph, self.OUT32)
        return rc, self.u32(self.OUT32)

    def tensor(self, data: bytes, ttype: int = 3, dims: list[int] | None = None) -> int:
        """Write a tensor struct for ``data``; return its address."""
        dims = [len(data)] if dims is None else dims
        self.write(self.DIMS, struct.pack(f"<{len(dims)}I", *dims))
        self.write(self.DATA, data)
        self.write(self.TENSOR, struct.pack("<5I", self.DIMS, len(dims), ttype, self.DATA, len(data)))
        return self.TENSOR

    def set_input(self, ctx: int, index: int, data: bytes | str, ttype: int = 3) -> int:
        """``set_input`` of ``data`` as a tensor of type ``ttype``; return the errno."""
        raw = data.encode() if isinstance(data, str) else data
        return self.call("set_input", ctx, index, self.tensor(raw, ttype))

    def get_output(self, ctx: int, index: int = 0, size: int = 0x4000, single: bool = False) -> tuple[int, bytes]:
        """``get_output`` (or ``get_output_single``) into a ``size``-byte buffer; return (errno, bytes)."""
        self.write(self.OUT32, b"\xee" * 4)
        rc = self.call("get_output_single" if single else "get_output", ctx, index, self.BUF, size, self.OUT32)
        n = self.u32(self.OUT32)
        return rc, self.read(self.BUF, n) if rc == 0 else b""

    def generate(self, graph: int, prompt: str, metadata: str | None = None) -> tuple[int, str]:
        """Init + set_input (+ metadata) + compute + get_output; returns (compute errno, text)."""
        rc, ctx = self.init(graph)
        assert rc == 0
        if metadata is not None:
            assert self.set_input(ctx, 1, metadata) == 0
        assert self.set_input(ctx, 0, prompt) == 0
        rc = self.call("compute", ctx)
        out_rc, text = self.get_output(ctx)
        assert out_rc == 0
        return rc, text.decode("utf-8", "replace")
