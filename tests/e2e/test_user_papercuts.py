"""What a new user tripped on (issue 27, items 4 and 5): a TTS graph without its vocoder refused instead
of answered with text, zero draft counters, Ctrl-C's last line, one-line errors of ``wasinn serve`` and argparse,
readable model load errors, and a stopped run naming the limit its caller set."""

from __future__ import annotations

import logging
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
import wasmtime

from wasinn_host import Errno, ModelRegistry, RunOptions, WasiNN
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.launch.runner import run_instances
from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.abi_guest import AbiGuest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUESTS = ROOT / "guest_examples"
TTS_CONFIG = '{"tts-output-file": "out.wav", "tts": true}'


def wasinn(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wasinn_host", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wasinn: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


# -- item 4: a graph asked for speech without a vocoder is refused, not answered with text ----------


def test_a_tts_graph_without_vocoder_fails_at_load_with_errno_1(
    tmp_path: pathlib.Path, successor_path: pathlib.Path
) -> None:
    """``tts: true`` without ``model-vocoder`` fails the load with an invalid argument, as WasmEdge's does
    (issue 32 made TTS itself work: tests/e2e/test_tts_guest.py); no text lands in a .wav file."""
    result = wasinn(
        "run",
        "--nn-preload",
        f"default:GGML:AUTO:{successor_path}",
        "--env",
        f"WASINN_CONFIG={TTS_CONFIG}",
        str(GUESTS / "complete.wasm"),
        "default",
        "hello",
        cwd=tmp_path,
    )
    assert (result.returncode, result.stdout) == (1, ""), result.stderr
    log_line, guest_line = result.stderr.splitlines()
    assert log_line.startswith("wasinn: WARNING: wasi-nn load_by_name_with_config: config key 'tts': text-to-speech")
    assert "needs 'model-vocoder'" in log_line and log_line.endswith("(errno 1 INVALID_ARGUMENT)")
    assert guest_line == "wasi-nn error: load_by_name_with_config returned 1"
    assert list(tmp_path.iterdir()) == []  # no out.wav, no output.wav


def test_tts_key_values(nn: WasiNN, caplog: pytest.LogCaptureFixture) -> None:
    guest = AbiGuest.create(nn)
    assert guest.load_by_name("succ", '{"tts": "yes"}')[0] == Errno.INVALID_ARGUMENT  # as WasmEdge: a bool
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        rc, graph = guest.load_by_name("succ", '{"tts": false}')  # text
    assert rc == 0 and not caplog.records
    rc, ctx = guest.init(graph)
    assert rc == 0
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):  # a load-time key: not applied per context
        assert guest.set_input(ctx, 1, TTS_CONFIG) == 0
    assert "load-time keys in per-context metadata are ignored, the model is not reloaded: tts=true" in caplog.text


# -- item 5: draft counters ---------------------------------------------------------------------------


def test_speculation_on_reports_zero_draft_counters_when_nothing_was_drafted() -> None:
    """On the demo model a two-token answer drafts nothing; the counters are 0, not missing (which reads
    as "speculation off"), and read from ``session.metadata`` (a property)."""
    nn = WasiNN(preload=[f"default:GGML:AUTO:{DEMO_MODEL_PATH}"], registry=ModelRegistry())
    question = "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n"
    with nn.session("default", {"temp": 0, "spec-type": "ngram-simple"}) as session:
        assert session.complete(question) == "42<|im_end|>"
        metadata = session.metadata
        assert (metadata["draft_tokens"], metadata["accepted_draft_tokens"]) == (0, 0)
    with nn.session("default", {"temp": 0}) as session:  # speculation off: WasmEdge's keys only
        assert session.complete(question) == "42<|im_end|>"
        assert "draft_tokens" not in session.metadata and "accepted_draft_tokens" not in session.metadata


# -- item 5: Ctrl-C's line comes after the guests' last writes ----------------------------------------

# "ready" on stdout; a 1 s sleep in wasmtime's own poll_oneoff (nothing can cut it short); "late" on
# stderr with no epoch check before it; then a loop, where the interrupt traps it.
READY_SLEEP_LATE = """
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "\\64\\00\\00\\00\\06\\00\\00\\00\\78\\00\\00\\00\\05\\00\\00\\00")
  (data (i32.const 100) "ready\\n")
  (data (i32.const 120) "late\\n")
  (data (i32.const 216) "\\01\\00\\00\\00")
  (data (i32.const 224) "\\00\\ca\\9a\\3b\\00\\00\\00\\00")
  (func (export "_start")
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 500)))
    (drop (call $poll (i32.const 200) (i32.const 304) (i32.const 1) (i32.const 400)))
    (drop (call $fd_write (i32.const 2) (i32.const 8) (i32.const 1) (i32.const 500)))
    (loop $l (br $l))))
"""


def test_ctrl_c_line_comes_after_the_guests_last_write(tmp_path: pathlib.Path) -> None:
    """Python 3.11's Thread.join, interrupted by Ctrl-C, took a running guest thread for ended, so the
    host printed its line while the guest still wrote (``wasinn: interruptedsocket error: ...``)."""
    module = tmp_path / "late.wasm"
    module.write_bytes(wasmtime.wat2wasm(READY_SLEEP_LATE))
    proc = subprocess.Popen(
        [sys.executable, "-m", "wasinn_host", "run", str(module)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (130, "late\nwasinn: interrupted\n")


# -- item 5: wasinn serve's errors are wasinn's one line ----------------------------------------------


def test_serve_on_a_socket_in_a_missing_directory_is_one_line() -> None:
    one_line_error(
        wasinn("serve", "--nn-rpc-uri", "unix:///nonexistent_dir/nn.sock"),
        "--nn-rpc-uri unix:///nonexistent_dir/nn.sock: the socket's directory /nonexistent_dir does not exist",
    )


def test_serve_on_a_port_in_use_is_one_line() -> None:
    """The C core of gRPC logged its own ``E... add_port.cc] Failed to add port`` line before wasinn's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line_error(wasinn("serve", "--nn-rpc-uri", f"127.0.0.1:{port}"), f"127.0.0.1:{port}: cannot listen")


# -- item 5: model files that are not models -----------------------------------------------------------


def test_a_garbage_gguf_gives_llama_cpps_whole_reason(tmp_path: pathlib.Path) -> None:
    """The cause used to be the last 300 characters of llama.cpp's lines, cut mid-word, and with a long
    path all of it was the path; now it is the reason, whole."""
    model = tmp_path / ("d" * 200) / "garbage.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + b"\xff" * 4 + bytes(range(256)) * 8)
    nn = WasiNN(preload=[f"bad:GGML:CPU:{model}"], registry=ModelRegistry())
    with pytest.raises(WasiNNError) as caught:
        nn.session("bad")
    assert caught.value.kind is ErrorKind.INVALID_ARGUMENT
    assert caught.value.message == (
        f"llama.cpp could not load model file {str(model)!r}: this GGUF file is version 4294967295 but this "
        "software only supports up to version 3; failed to read header"
    )


def test_a_directory_as_the_model_is_called_a_directory(tmp_path: pathlib.Path) -> None:
    nn = WasiNN(preload=[f"dir:GGML:CPU:{tmp_path}"], registry=ModelRegistry())
    with pytest.raises(WasiNNError) as caught:
        nn.session("dir")
    assert caught.value.kind is ErrorKind.INVALID_ARGUMENT  # it exists: WasmEdge's load fails with 1, not 103
    assert caught.value.message == f"model file {str(tmp_path)!r} for name 'dir' is a directory, not a GGUF model file"
    result = wasinn("run", "--nn-preload", f"dir:GGML:CPU:{tmp_path}", str(GUESTS / "complete.wasm"), "dir", "a")
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == (
        f'wasinn: WARNING: --nn-preload dir: model file "{tmp_path}" is a directory, not a GGUF model file; '
        'load_by_name("dir") will fail with InvalidArgument'
    )


# -- item 5: usage errors are one line -------------------------------------------------------------------


def test_argparse_usage_errors_are_one_line() -> None:
    complete = str(GUESTS / "complete.wasm")
    one_line_error(
        wasinn("run", "--nn-prompt-cache-size", "12Q", complete),
        "argument --nn-prompt-cache-size: expected a size such as 1073741824, 512M or 2G, got '12Q'",
        "wasinn run --help",
    )
    one_line_error(wasinn("serve"), "the following arguments are required: --nn-rpc-uri", "wasinn serve --help")
    one_line_error(wasinn("run", "--instances", "0", complete), "expected a positive integer, got 0")
    one_line_error(wasinn("frobnicate"), "invalid choice: 'frobnicate'")


# -- item 5: a stopped run names the limit as its caller set it -------------------------------------------


def test_run_instances_timeout_names_the_parameter(registry: ModelRegistry) -> None:
    nn = WasiNN(registry=registry, interruptible=True)
    spin = wasmtime.Module(
        nn.engine,
        bytes(wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))')),
    )
    started = time.monotonic()
    (result,) = run_instances(nn, spin, [], RunOptions(), instances=1, timeout=0.3)
    assert result.error == "the guest trapped: stopped by timeout=0.3 (seconds)"
    assert time.monotonic() - started < 10
