"""What real third-party clients need: LlamaEdge's zero-length output buffer, a missing model file
as WasmEdge reports it, every unresolved import at once, the llama.cpp build number, and metadata
that is not rebuilt on every read."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import wasmtime

from wasinn_host import Errno, GuestError, RunOptions, WasiNN
from wasinn_host.llama.version import LLAMA_BUILD_NUMBER, LLAMA_COMMIT
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.gguf_models import successor_text

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUESTS = ROOT / "guest_examples"
EXPECTED = (successor_text("a") + "</s>").encode()


def llama_core_guest(buffer_at: int) -> bytes:
    """What LlamaEdge's llama-core does: load_by_name("default"), init, set_input(0, prompt "a"),
    compute, then get_output into a buffer of capacity but length 0 (a Rust ``Vec::with_capacity``),
    and print ``written`` bytes from it; a non-zero errno becomes the exit code."""
    return bytes(
        wasmtime.wat2wasm(f"""
(module
  (import "wasi_ephemeral_nn" "load_by_name" (func $load (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "init_execution_context" (func $init (param i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "set_input" (func $set_input (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "compute" (func $compute (param i32) (result i32)))
  (import "wasi_ephemeral_nn" "get_output" (func $get_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "default")
  (data (i32.const 16) "a")
  (data (i32.const 32) "\\30\\00\\00\\00\\01\\00\\00\\00\\03\\00\\00\\00\\10\\00\\00\\00\\01\\00\\00\\00")
  (data (i32.const 48) "\\01\\00\\00\\00")
  (func $check (param i32) (if (local.get 0) (then (call $exit (local.get 0)))))
  (func (export "_start")
    (call $check (call $load (i32.const 0) (i32.const 7) (i32.const 64)))
    (call $check (call $init (i32.load (i32.const 64)) (i32.const 68)))
    (call $check (call $set_input (i32.load (i32.const 68)) (i32.const 0) (i32.const 32)))
    (call $check (call $compute (i32.load (i32.const 68))))
    (call $check (call $get_output (i32.load (i32.const 68)) (i32.const 0) (i32.const {buffer_at}) (i32.const 0)
                                   (i32.const 72)))
    (i32.store (i32.const 80) (i32.const {buffer_at}))
    (i32.store (i32.const 84) (i32.load (i32.const 72)))
    (drop (call $fd_write (i32.const 1) (i32.const 80) (i32.const 1) (i32.const 88)))))
""")
    )


def run_guest(nn: WasiNN, module: bytes, tmp_path: pathlib.Path) -> tuple[int, bytes]:
    out = tmp_path / "out"
    code = nn.run(module, [], RunOptions(stdout=str(out), stderr=str(tmp_path / "err")))
    return code, out.read_bytes()


@pytest.fixture
def preload(successor_path: pathlib.Path) -> list[str]:
    return [f"default:GGML:AUTO:{successor_path}"]


def test_llama_core_zero_length_buffer_with_legacy_output(preload: list[str], tmp_path: pathlib.Path) -> None:
    nn = WasiNN(preload, legacy_output=True)
    assert run_guest(nn, llama_core_guest(0x10000), tmp_path) == (0, EXPECTED)


def test_llama_core_zero_length_buffer_refused_by_default(
    preload: list[str], tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    code, out = run_guest(WasiNN(preload), llama_core_guest(0x10000), tmp_path)
    assert (code, out) == (Errno.TOO_LARGE, b"")
    warnings = [r.getMessage() for r in caplog.records if "get_output" in r.getMessage()]
    assert len(warnings) == 1
    assert "LlamaEdge" in warnings[0] and "--nn-legacy-output" in warnings[0]


def test_legacy_output_never_writes_past_guest_memory(preload: list[str]) -> None:
    guest = AbiGuest.create(WasiNN(preload, legacy_output=True))
    graph = guest.load_by_name("default")[1]
    ctx = guest.init(graph)[1]
    assert guest.set_input(ctx, 0, "a") == 0 and guest.call("compute", ctx) == 0
    end = guest.size
    before = guest.read(end - 10, 10)
    assert guest.call("get_output", ctx, 0, end - 10, 0, guest.OUT32) == Errno.TOO_LARGE
    assert guest.u32(guest.OUT32) == len(EXPECTED), "the needed size is reported"
    assert guest.read(end - 10, 10) == before, "nothing is copied when the output does not fit"
    assert guest.call("get_output", ctx, 0, 0x1000, 0, guest.OUT32) == 0
    assert guest.read(0x1000, guest.u32(guest.OUT32)) == EXPECTED


def wasinn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wasinn_host", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_cli_legacy_output(successor_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    guest = tmp_path / "llama_core.wasm"
    guest.write_bytes(llama_core_guest(0x10000))
    preload = f"default:GGML:AUTO:{successor_path}"
    result = wasinn("run", "--nn-preload", preload, "--nn-legacy-output", str(guest))
    assert (result.returncode, result.stdout) == (0, EXPECTED.decode())
    result = wasinn("run", "--nn-preload", preload, str(guest))
    assert result.returncode == Errno.TOO_LARGE
    assert "LlamaEdge" in result.stderr and "--nn-legacy-output" in result.stderr


def test_missing_model_file_is_model_not_found_at_load(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "missing.gguf"
    result = wasinn(
        "run", "--nn-preload", f"default:GGML:AUTO:{missing}", str(GUESTS / "complete.wasm"), "default", "a"
    )
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("wasinn: WARNING: --nn-preload default: model file ")
    assert str(missing) in lines[0] and "ModelNotFound" in lines[0]
    assert "returned 103" in result.stderr
    assert result.returncode == 1 and result.stdout == ""
    malformed = wasinn("run", "--nn-preload", "default-only", str(GUESTS / "complete.wasm"))
    assert malformed.returncode == 2


def test_every_unresolved_import_is_named_and_wasmedge_sockets_explained(tmp_path: pathlib.Path) -> None:
    module = bytes(
        wasmtime.wat2wasm("""
(module
  (import "wasi_snapshot_preview1" "sock_open" (func (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_setsockopt" (func (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_accept" (func (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_made_up" (func (param i32) (result i32)))
  (import "env" "made_up" (func))
  (memory (export "memory") 1)
  (func (export "_start")))
""")
    )
    with pytest.raises(GuestError) as info:
        WasiNN().run(module)
    message = str(info.value)
    assert message.startswith(
        "3 unresolved imports: wasi_snapshot_preview1::sock_accept (defined with another signature), "
        "wasi_snapshot_preview1::sock_made_up, env::made_up; the sock_* ones belong to WasmEdge's socket extension"
    )  # sock_open and sock_setsockopt are the socket layer's
    path = tmp_path / "server.wasm"
    path.write_bytes(module)
    result = wasinn("run", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "sock_made_up" in result.stderr


def test_llama_build_number_is_the_linked_release(preload: list[str]) -> None:
    assert LLAMA_BUILD_NUMBER == 11312 and LLAMA_COMMIT.startswith("0c1e570")
    guest = AbiGuest.create(WasiNN(preload))
    ctx = guest.init(guest.load_by_name("default")[1])[1]
    meta = json.loads(guest.get_output(ctx, 1)[1])
    assert (meta["llama_build_number"], meta["llama_commit"]) == (11312, LLAMA_COMMIT)


def test_metadata_is_built_once_per_change(preload: list[str]) -> None:
    nn = WasiNN(preload)
    guest = AbiGuest.create(nn)
    ctx = guest.init(guest.load_by_name("default")[1])[1]
    context = nn.imports.states()[0].contexts[ctx]
    assert guest.set_input(ctx, 0, "a") == 0
    first = context.metadata_json()
    assert context.metadata_json() is first, "no change: the same bytes"
    assert json.loads(first)["input_tokens"] == 2
    assert guest.call("compute", ctx) == 0
    after = context.metadata_json()
    assert after is not first and json.loads(after)["output_tokens"] == 26
    assert guest.get_output(ctx, 1) == (0, after)
