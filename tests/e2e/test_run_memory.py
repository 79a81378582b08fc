"""An embedding process that runs guests for ever: ``WasiNN.run`` a thousand times holds no more memory.

Each run makes a Linker with the 12 ``wasi_ephemeral_nn`` host functions (and, for a guest importing
WasmEdge's sockets, about 50 more); their callbacks must go when wasmtime drops the functions.  The
guest asks the demo model (real llama.cpp) "What is 12+30?" and opens and closes a socket on every run.
"""

from __future__ import annotations

import os
import pathlib
import time

import wasmtime

from wasinn_host import RunOptions, WasiNN
from wasinn_host.core.config.preload import Preload
from wasinn_host.guest import callbacks
from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.demo_data import IM_END, IM_START

RUNS = 1000
WARM_UP = 100
MAX_GROWTH = 10 << 20
"""RSS the last 900 runs may add (the unfixed host added about 107 kB a run: 96 MB)."""

PROMPT = f"{IM_START}user\nWhat is 12+30?{IM_END}\n{IM_START}assistant\n"


def _data(text: str) -> str:
    return "".join(f"\\{b:02x}" for b in text.encode())


def guest_wat() -> str:
    """``_start``: load ``default``, compute the prompt, write the answer to stdout, open and close a
    socket; exit codes 10-14 name the call that failed."""
    prompt_len = len(PROMPT.encode())
    return f"""
(module
  (import "wasi_ephemeral_nn" "load_by_name" (func $load (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "init_execution_context" (func $init (param i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "set_input" (func $set_input (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "compute" (func $compute (param i32) (result i32)))
  (import "wasi_ephemeral_nn" "get_output" (func $get_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "finalize_execution_context" (func $fini (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_open" (func $sock_open (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "default")
  (data (i32.const 256) "{_data(PROMPT)}")
  (func $check (param $errno i32) (param $code i32)
    (if (local.get $errno) (then (call $exit (local.get $code)))))
  (func (export "_start") (local $ctx i32)
    ;; tensor at 64: dims_ptr=96 dims_len=1 type=3 (u8) data_ptr=256 data_len; dims at 96 = [1]
    (i32.store (i32.const 64) (i32.const 96))
    (i32.store (i32.const 68) (i32.const 1))
    (i32.store (i32.const 72) (i32.const 3))
    (i32.store (i32.const 76) (i32.const 256))
    (i32.store (i32.const 80) (i32.const {prompt_len}))
    (i32.store (i32.const 96) (i32.const 1))
    (call $check (call $load (i32.const 0) (i32.const 7) (i32.const 128)) (i32.const 10))
    (call $check (call $init (i32.load (i32.const 128)) (i32.const 132)) (i32.const 11))
    (local.set $ctx (i32.load (i32.const 132)))
    (call $check (call $set_input (local.get $ctx) (i32.const 0) (i32.const 64)) (i32.const 12))
    (call $check (call $compute (local.get $ctx)) (i32.const 13))
    (call $check
      (call $get_output (local.get $ctx) (i32.const 0) (i32.const 1024) (i32.const 512) (i32.const 136))
      (i32.const 14))
    (drop (call $fini (local.get $ctx)))
    (if (i32.eqz (call $sock_open (i32.const 1) (i32.const 2) (i32.const 140)))
      (then (drop (call $fd_close (i32.load (i32.const 140))))))
    (i32.store (i32.const 144) (i32.const 1024))
    (i32.store (i32.const 148) (i32.load (i32.const 136)))
    (drop (call $fd_write (i32.const 1) (i32.const 144) (i32.const 1) (i32.const 152)))))
"""


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_thousand_runs_hold_no_more_memory(tmp_path: pathlib.Path) -> None:
    nn = WasiNN([Preload("default", DEMO_MODEL_PATH)])
    module = wasmtime.Module(nn.engine, guest_wat())
    out = tmp_path / "out.txt"
    options = RunOptions(env={"n_predict": "8"}, stdout=str(out), stdin=os.devnull)
    rss: list[int] = []
    kept: list[int] = []
    started = time.perf_counter()
    try:
        for run in range(RUNS):
            assert nn.run(module, [], options) == 0, f"run {run}"
            if run == 0 or run == RUNS - 1:
                assert out.read_text() == f"42{IM_END}", f"run {run}"
            if run + 1 in (WARM_UP, RUNS):
                rss.append(rss_bytes())
                kept.append(len(callbacks.KEPT))
    finally:
        nn.close()
    elapsed = time.perf_counter() - started
    growth = rss[1] - rss[0]
    per_run = growth / (RUNS - WARM_UP)
    print(f"{RUNS} runs in {elapsed:.1f} s; RSS {rss[0] >> 20} -> {rss[1] >> 20} MiB ({per_run / 1000:.1f} kB a run)")
    assert kept[1] <= kept[0], kept  # the host functions of finished runs are released
    assert growth < MAX_GROWTH, f"RSS grew {growth / 2**20:.1f} MiB over {RUNS - WARM_UP} runs"
