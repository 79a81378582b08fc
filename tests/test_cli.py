"""``wasinn`` as a user runs it: a subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from conftest import GUESTS, ROOT
from wasinn_host import __version__
from wasinn_host.testmodels import successor_text


def wasinn(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wasinn_host", *args], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_run_complete_guest(successor_path: pathlib.Path) -> None:
    result = wasinn("run", "--nn-preload", f"default:GGML:AUTO:{successor_path}",
                    str(GUESTS / "complete.wasm"), "default", "xyz")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "</s>\n"
    result = wasinn("run", "--nn-preload", f"default:ggml:cpu:{successor_path}", "--env", "n_predict=3",
                    str(GUESTS / "complete.wasm"), "default", "k")
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
    result = wasinn("run", "--nn-preload", f"default:GGML:AUTO:{successor_path}",
                    str(GUESTS / "chat.wasm"), "default", stdin="r\nv\n")
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
    one_line_error(wasinn("run", "--nn-preload", "default:GGML:AUTO:/no/such.gguf", complete, "default", "a"),
                   "/no/such.gguf", "does not exist")
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
