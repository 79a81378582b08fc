"""``stream-stdout`` pieces go where the computing guest's stdout goes, in order with its own writes.

The guest has the shape of WasmEdge's ``basic`` example: it prints a prefix (the last line unfinished),
computes with ``stream-stdout: true`` and prints after.  On the successor model the prompt "u" gives
"vwxyz" and the end-of-generation piece, so every destination must read exactly :data:`EXPECTED`.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
import wasmtime

from wasinn_host import ModelRegistry, RunOptions, WasiNN
from wasinn_host.backend.local import LocalBackend
from wasinn_host.core.config.limits import Limits
from wasinn_host.rpc.server import NNServer, ServeOptions
from wasinn_host.testing.guest_harness import RunGuest
from wasinn_host.testing.guest_runs import GUESTS

PREFIX = "Prompt: u\nResponse: "
AFTER = "\nDone.\n"
EXPECTED = PREFIX + "vwxyz</s>" + AFTER
"""What the guest's stdout must read: its prefix, the streamed pieces, then what it prints after."""


def basic_guest(name: str) -> bytes:
    """A WASI command that prints :data:`PREFIX`, computes prompt "u" on model ``name`` with
    ``stream-stdout``, then prints :data:`AFTER`; a failing wasi-nn call exits 1."""
    config = '{"stream-stdout": true}'
    data = {0: name, 16: "u", 128: config, 256: PREFIX, 320: AFTER}
    segments = "\n".join(f'  (data (i32.const {at}) "{_escaped(text)}")' for at, text in data.items())
    wat = f"""
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (import "wasi_ephemeral_nn" "load_by_name_with_config"
    (func $load (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "init_execution_context" (func $init (param i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "set_input" (func $set_input (param i32 i32 i32) (result i32)))
  (import "wasi_ephemeral_nn" "compute" (func $compute (param i32) (result i32)))
  (memory (export "memory") 1)
{segments}
  ;; tensor at 32: dims_ptr=48 dims_len=1 type=3 (u8) data_ptr=16 data_len=1; dims at 48 = [1]
  (data (i32.const 32) "\\30\\00\\00\\00\\01\\00\\00\\00\\03\\00\\00\\00\\10\\00\\00\\00\\01\\00\\00\\00")
  (data (i32.const 48) "\\01\\00\\00\\00")
  (func $check (param i32)
    (if (local.get 0) (then (call $exit (i32.const 1)))))
  (func $print (param i32 i32)
    (i32.store (i32.const 80) (local.get 0))
    (i32.store (i32.const 84) (local.get 1))
    (call $check (call $fd_write (i32.const 1) (i32.const 80) (i32.const 1) (i32.const 72))))
  (func (export "_start")
    (call $print (i32.const 256) (i32.const {len(PREFIX)}))
    (call $check (call $load (i32.const 0) (i32.const {len(name)}) (i32.const 128) (i32.const {len(config)})
      (i32.const 64)))
    (call $check (call $init (i32.load (i32.const 64)) (i32.const 68)))
    (call $check (call $set_input (i32.load (i32.const 68)) (i32.const 0) (i32.const 32)))
    (call $check (call $compute (i32.load (i32.const 68))))
    (call $print (i32.const 320) (i32.const {len(AFTER)}))))
"""
    return bytes(wasmtime.wat2wasm(wat))


def _escaped(text: str) -> str:
    return "".join(f"\\{byte:02x}" for byte in text.encode())


@pytest.fixture(scope="module")
def basic_wasm(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The guest as a file, on model name "succ"."""
    path = tmp_path_factory.mktemp("basic") / "basic.wasm"
    path.write_bytes(basic_guest("succ"))
    return path


@pytest.fixture
def rpc_server(registry: ModelRegistry, tmp_path: pathlib.Path) -> Iterator[NNServer]:
    """A server in this process on a unix socket, serving the test models."""
    server = NNServer(f"unix:{tmp_path / 'nn.sock'}", LocalBackend(registry, Limits()), options=ServeOptions())
    server.start()
    yield server
    server.stop(1)


def wasinn(*args: str) -> subprocess.CompletedProcess[str]:
    """``wasinn run ARGS`` in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "wasinn_host", "run", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_fixture_has_the_streamed_answer_where_wasinn_run_prints_it(
    wasinn_run: RunGuest, tmp_path: pathlib.Path, successor_path: pathlib.Path
) -> None:
    result = wasinn_run(basic_guest("default"), model="successor")
    assert (result.exit_code, result.stdout) == (0, EXPECTED), result.stderr
    path = tmp_path / "basic.wasm"
    path.write_bytes(basic_guest("default"))
    cli = wasinn("--nn-preload", f"default:GGML:AUTO:{successor_path}", str(path))
    assert (cli.returncode, cli.stdout) == (0, EXPECTED), cli.stderr


def test_an_embedding_apps_stdout_file_gets_the_pieces(
    nn: WasiNN, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.txt"
    assert nn.run(basic_guest("succ"), [], RunOptions(stdout=str(out), stdin=os.devnull)) == 0
    assert out.read_text() == EXPECTED
    assert capfd.readouterr().out == ""  # nothing on the host's own stdout


def test_an_embedding_apps_own_store_gets_the_pieces(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    """Own Linker and Store: GuestStdout points the WasiConfig and the Store's piece sink at one file."""
    from wasinn_host.guest.stdout import GuestStdout  # new with this behaviour

    linker = wasmtime.Linker(nn.engine)
    linker.define_wasi()
    nn.add_to_linker(linker)
    module = wasmtime.Module(nn.engine, basic_guest("succ"))
    out = tmp_path / "own.txt"
    with GuestStdout(out) as stdout:
        store = wasmtime.Store(nn.engine)
        wasi = wasmtime.WasiConfig()
        stdout.configure(wasi)
        store.set_wasi(wasi)
        nn.attach(store, stdout=stdout.write)
        start = linker.instantiate(store, module).exports(store)["_start"]
        assert isinstance(start, wasmtime.Func)
        start(store)
        store.close()
    assert out.read_text() == EXPECTED
    pieces: list[bytes] = []  # or any callable: it gets the pieces alone
    store = wasmtime.Store(nn.engine)
    wasi = wasmtime.WasiConfig()
    wasi.stdout_file = str(tmp_path / "guest.txt")
    store.set_wasi(wasi)
    nn.attach(store, stdout=pieces.append)
    start = linker.instantiate(store, module).exports(store)["_start"]
    assert isinstance(start, wasmtime.Func)
    start(store)
    store.close()
    assert pieces == [b"v", b"w", b"x", b"y", b"z", b"</s>"]
    assert (tmp_path / "guest.txt").read_text() == PREFIX + AFTER


def test_a_sink_that_fails_logs_one_line_and_the_host_goes_on(
    nn: WasiNN, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sink runs on the model's worker: its failure must not stop the worker or the guest."""
    linker = wasmtime.Linker(nn.engine)
    linker.define_wasi()
    nn.add_to_linker(linker)
    module = wasmtime.Module(nn.engine, basic_guest("succ"))

    def broken(piece: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    for sink in (broken, None):
        store = wasmtime.Store(nn.engine)
        wasi = wasmtime.WasiConfig()
        wasi.stdout_file = str(tmp_path / "guest.txt")
        store.set_wasi(wasi)
        pieces: list[bytes] = []
        nn.attach(store, stdout=sink or pieces.append)
        start = linker.instantiate(store, module).exports(store)["_start"]
        assert isinstance(start, wasmtime.Func)
        start(store)
        store.close()
        assert (tmp_path / "guest.txt").read_text() == PREFIX + AFTER
    assert b"".join(pieces) == b"vwxyz</s>"  # the next guest's pieces: the worker went on
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "stream-stdout: cannot write to the guest's stdout ([Errno 32] Broken pipe); its later pieces are dropped"
    ]


def test_a_component_writes_its_pieces_to_its_stdout(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out.txt"
    args = ["succ", "u", '{"stream-stdout": true}']
    component = GUESTS / "components" / "nn_complete.wasm"
    assert nn.run(component, args, RunOptions(stdout=str(out), stderr=os.devnull, stdin=os.devnull)) == 0
    assert out.read_text() == "vwxyz</s>vwxyz</s>\n"  # the pieces, then the component's print of its output


def test_a_session_writes_its_pieces_to_its_stdout(nn: WasiNN, capfd: pytest.CaptureFixture[str]) -> None:
    pieces: list[bytes] = []
    with nn.session("succ", {"stream-stdout": True}, stdout=pieces.append) as session:
        assert session.complete("u") == "vwxyz</s>"
    assert pieces == [b"v", b"w", b"x", b"y", b"z", b"</s>"]
    assert capfd.readouterr().out == ""


def test_instances_carry_their_pieces_in_their_own_lines(
    basic_wasm: pathlib.Path, successor_path: pathlib.Path
) -> None:
    run = wasinn("--instances", "2", "--nn-preload", f"succ:GGML:AUTO:{successor_path}", str(basic_wasm))
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.splitlines(keepends=True)) == sorted(EXPECTED.splitlines(keepends=True) * 2)


def test_over_rpc_the_pieces_go_to_the_clients_guest_stdout(
    rpc_server: NNServer, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    client = WasiNN(rpc=f"unix:{rpc_server.address.unix_path}")
    try:
        out = tmp_path / "out.txt"
        assert client.run(basic_guest("succ"), [], RunOptions(stdout=str(out), stdin=os.devnull)) == 0
        assert out.read_text() == EXPECTED
        assert capfd.readouterr().out == ""  # neither the client's stdout nor the server's
    finally:
        client.close()


def test_over_rpc_instances_carry_their_pieces(rpc_server: NNServer, basic_wasm: pathlib.Path) -> None:
    run = wasinn("--instances", "2", "--nn-rpc-uri", f"unix:{rpc_server.address.unix_path}", str(basic_wasm))
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.splitlines(keepends=True)) == sorted(EXPECTED.splitlines(keepends=True) * 2)
