"""``wasinn`` as a user runs it: a subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import wasmtime

from wasinn_host import __version__
from wasinn_host.testing.gguf_models import successor_text

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUESTS = ROOT / "guest_examples"


def wasinn(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wasinn_host", *args], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_run_complete_guest(successor_path: pathlib.Path) -> None:
    result = wasinn(
        "run", "--nn-preload", f"default:GGML:AUTO:{successor_path}", str(GUESTS / "complete.wasm"), "default", "xyz"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "</s>\n"
    result = wasinn(
        "run",
        "--nn-preload",
        f"default:ggml:cpu:{successor_path}",
        "--env",
        "n_predict=3",
        str(GUESTS / "complete.wasm"),
        "default",
        "k",
    )
    assert (result.returncode, result.stdout) == (0, "lmn\n")


def test_run_dir_forms_and_exit_code(successor_path: pathlib.Path) -> None:
    models = str(successor_path.parent)
    for form in (f"/m:{models}", f"{models}::/m"):
        result = wasinn("run", "--dir", form, str(GUESTS / "load_bytes.wasm"), "/m/successor.gguf", "w")
        assert (result.returncode, result.stdout) == (0, "xyz</s>\n"), (form, result.stderr)
    result = wasinn("run", "--dir", models, str(GUESTS / "load_bytes.wasm"), f"{models}/successor.gguf", "w")
    assert (result.returncode, result.stdout) == (0, "xyz</s>\n"), result.stderr
    # the guest's own exit code passes through
    result = wasinn("run", str(GUESTS / "load_bytes.wasm"), "/nowhere/model.gguf", "w")
    assert result.returncode == 1
    assert "cannot read" in result.stderr


def test_chat_guest_reads_stdin(successor_path: pathlib.Path) -> None:
    result = wasinn(
        "run",
        "--nn-preload",
        f"default:GGML:AUTO:{successor_path}",
        str(GUESTS / "chat.wasm"),
        "default",
        stdin="r\nv\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{successor_text('r')}\n{successor_text('v')}\n"


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("wasinn: error: ")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_user_errors_are_one_line(tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    complete = str(GUESTS / "complete.wasm")
    one_line_error(wasinn("run", "--nn-preload", "default-only", complete), "NAME:ENCODING:TARGET:PATH")
    one_line_error(wasinn("run", "--nn-preload", f"d:GGUF:AUTO:{successor_path}", complete), "unknown encoding")
    one_line_error(wasinn("run", "--nn-preload", f"d:GGML:NPU:{successor_path}", complete), "unknown target")
    one_line_error(wasinn("run", str(tmp_path / "absent.wasm")), "does not exist")
    not_wasm = tmp_path / "text.wasm"
    not_wasm.write_text("hello")
    one_line_error(wasinn("run", str(not_wasm)), "not a WebAssembly module")
    one_line_error(wasinn("run", "--dir", "/no/such/dir", complete), "does not exist")
    one_line_error(wasinn("run", "--env", "NOEQUALS", complete), "KEY=VALUE")


def test_version_and_help() -> None:
    assert wasinn("--version").stdout.strip() == f"wasinn-host {__version__}"
    help_text = wasinn("run", "--help").stdout
    for option in ("--nn-preload", "--dir", "--env", "--log-level"):
        assert option in help_text
    assert "run" in wasinn("--help").stdout


def test_instances_keep_lines_whole_and_return_first_nonzero_code(successor_path: pathlib.Path) -> None:
    preload = f"default:GGML:AUTO:{successor_path}"
    result = wasinn(
        "run",
        "--nn-preload",
        preload,
        "--instances",
        "4",
        "--status",
        str(GUESTS / "complete.wasm"),
        "default",
        "hello",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [successor_text("hello") + "</s>"] * 4
    status = json.loads(result.stderr.strip().splitlines()[-1])
    assert status["performance"]["requests"] == 4
    result = wasinn(
        "run",
        "--nn-preload",
        preload,
        "--nn-allow",
        "other",
        "--instances",
        "2",
        str(GUESTS / "complete.wasm"),
        "default",
        "a",
    )
    assert result.returncode == 1
    assert result.stderr.count("load_by_name_with_config returned 8") == 2


def test_nn_allow_lets_listed_names_through(successor_path: pathlib.Path) -> None:
    result = wasinn(
        "run",
        "--nn-preload",
        f"default:GGML:AUTO:{successor_path}",
        "--nn-allow",
        "default",
        str(GUESTS / "complete.wasm"),
        "default",
        "x",
    )
    assert (result.returncode, result.stdout) == (0, "yz</s>\n")


SPIN = '(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))'


TRAP = '(module (memory (export "memory") 1) (func (export "_start") unreachable))'


@pytest.mark.parametrize("instances", ["1", "2", "4"])
def test_timeout_stops_a_runaway_guest(tmp_path: pathlib.Path, instances: str) -> None:
    module = tmp_path / "spin.wasm"
    module.write_bytes(wasmtime.wat2wasm(SPIN))
    started = time.monotonic()
    result = wasinn("run", "--instances", instances, "--timeout", "0.5", str(module))
    assert result.returncode == 134
    prefixes = [f"instance {i}: " for i in range(int(instances))] if instances != "1" else [""]
    assert sorted(result.stderr.splitlines()) == [
        f"wasinn: error: {prefix}the guest trapped: stopped by --timeout 0.5s" for prefix in prefixes
    ]
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("instances", ["1", "2", "4"])
def test_a_trap_ends_every_instance_with_134(tmp_path: pathlib.Path, instances: str) -> None:
    """Each instance's trap is one line and the run exits 134 at once (the guests' pipes are closed
    with their Stores, not when a traceback lets go of them)."""
    module = tmp_path / "trap.wasm"
    module.write_bytes(wasmtime.wat2wasm(TRAP))
    started = time.monotonic()
    result = wasinn("run", "--instances", instances, str(module))
    assert result.returncode == 134
    assert len(result.stderr.splitlines()) == int(instances)
    assert all(
        line.endswith("the guest trapped: wasm trap: wasm `unreachable` instruction executed")
        for line in result.stderr.splitlines()
    )
    assert time.monotonic() - started < 30


READY_THEN_SPIN = """
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "ready\\n")
  (data (i32.const 0) "\\10\\00\\00\\00\\06\\00\\00\\00")
  (func (export "_start")
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 32)))
    (loop $l (br $l))))
"""


@pytest.mark.parametrize("instances", [1, 2, 4])
def test_ctrl_c_ends_cleanly(tmp_path: pathlib.Path, instances: int) -> None:
    module = tmp_path / "spin.wasm"
    module.write_bytes(wasmtime.wat2wasm(READY_THEN_SPIN))
    proc = subprocess.Popen(
        [sys.executable, "-m", "wasinn_host", "run", "--instances", str(instances), str(module)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert [proc.stdout.readline() for _ in range(instances)] == ["ready\n"] * instances  # all are running
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip() == "wasinn: interrupted"
    assert time.monotonic() - started < 5  # every Store stops at its next epoch check, none waits for a join


def test_json_log_lines(tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    log_file = tmp_path / "host.log"
    result = wasinn(
        "run",
        "--nn-preload",
        f"default:GGML:AUTO:{successor_path}",
        "--log-format",
        "json",
        "--log-file",
        str(log_file),
        "--env",
        'WASINN_CONFIG={"top-p": 7}',
        str(GUESTS / "complete.wasm"),
        "default",
        "a",
    )
    assert result.returncode == 1
    entries = [json.loads(line) for line in log_file.read_text().splitlines()]
    rejection = next(e for e in entries if e["event"] == "load_by_name_with_config")
    assert rejection["level"] == "WARNING" and "top-p" in rejection["message"]
    assert {"timestamp", "graph", "context"} <= set(rejection)


def test_enable_log_routes_llama_cpp_logging(successor_path: pathlib.Path) -> None:
    quiet = wasinn(
        "run", "--nn-preload", f"default:GGML:AUTO:{successor_path}", str(GUESTS / "complete.wasm"), "default", "a"
    )
    assert "llama" not in quiet.stderr.replace("llama_build_number", "").replace("llama_commit", "")
    loud = wasinn(
        "run",
        "--nn-preload",
        f"default:GGML:AUTO:{successor_path}",
        "--log-level",
        "INFO",
        "--env",
        "enable_log=true",
        str(GUESTS / "complete.wasm"),
        "default",
        "a",
    )
    assert loud.returncode == 0
    assert "llama_model_loader" in loud.stderr or "load_tensors" in loud.stderr or "llama_context" in loud.stderr


def test_demo_model_answers_without_preload() -> None:
    result = wasinn(
        "run", "--env", "chat_template=chatml", str(GUESTS / "chat.wasm"), "default", stdin="What is 12+30?\n"
    )
    assert (result.returncode, result.stdout) == (0, "42\n"), result.stderr
