"""The example guests (C, prebuilt .wasm) run through the real host and real llama.cpp."""

from __future__ import annotations

import pathlib

import pytest

from wasinn_host import WasiNN
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import run_guest


def test_complete_guest(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, err = run_guest(nn, tmp_path, "complete", ["succ", "hello"])
    assert code == 0
    assert out == successor_text("hello") + "</s>\n"  # 'o' -> 'p' ... 'z' -> EOS
    assert err.startswith('{"input_tokens": 6, "output_tokens": 12,')


def test_complete_guest_config_from_env(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, _ = run_guest(nn, tmp_path, "complete", ["succ", "3"], env={"n_predict": "8"})
    assert (code, out) == (0, "45678901\n")
    code, out, _ = run_guest(nn, tmp_path, "complete", ["succ", "a"], env={"reverse_prompt": "fg"})
    assert (code, out) == (0, "bcdefg\n")


def test_complete_guest_reports_errors(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, err = run_guest(nn, tmp_path, "complete", ["nope", "a"])
    assert (code, out) == (1, "")
    assert "load_by_name_with_config returned 8" in err
    code, out, err = run_guest(nn, tmp_path, "complete", ["succ", "1"], env={"ctx_size": "32"})
    assert code == 1 and "compute returned 101" in err
    assert out == successor_text("1", 31) + "\n"


def test_stream_stdout_writes_pieces_on_the_guests_stdout(
    nn: WasiNN, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_guest(nn, tmp_path, "complete", ["succ", "u"], env={"stream_stdout": "true"})
    assert (code, out) == (0, "vwxyz</s>vwxyz</s>\n")  # the pieces, then the guest's own print
    assert capfd.readouterr().out == ""


def test_chat_guest_streams_and_matches_non_streaming(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, err = run_guest(nn, tmp_path, "chat", ["succ"], stdin="a\n\n  \nQ\n5\n", env={"n_predict": "7"})
    assert code == 0, err
    # the streaming guest does not print the EOG piece; the digit cycle stops at the guest's limit
    assert out.splitlines() == [successor_text("a", 7), successor_text("Q", 7), successor_text("5", 7)]


def test_load_bytes_guest(nn: WasiNN, tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    code, out, err = run_guest(
        nn, tmp_path, "load_bytes", ["/models/successor.gguf", "m"], dirs=[(str(successor_path.parent), "/models")]
    )
    assert code == 0, err
    assert out == successor_text("m") + "</s>\n"
    code, _, err = run_guest(
        nn,
        tmp_path,
        "load_bytes",
        ["/models/successor.gguf", "m"],
        dirs=[(str(successor_path.parent), "/models")],
        env={"target": "3"},
    )
    assert code == 1 and "load returned 1" in err


@pytest.mark.parametrize("prompt", ["hello", "Jim", "b"])
def test_streamed_pieces_equal_the_non_streaming_output(nn: WasiNN, tmp_path: pathlib.Path, prompt: str) -> None:
    _, whole, _ = run_guest(nn, tmp_path, "complete", ["succ", prompt], env={"temp": "0"})
    _, streamed, _ = run_guest(nn, tmp_path, "chat", ["succ"], stdin=prompt + "\n", env={"temp": "0"})
    assert whole.removesuffix("</s>\n") == streamed.removesuffix("\n")  # the streaming guest skips the EOG piece


def test_a_stream_interval_changes_no_streamed_text(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    """The chat guest streaming with ``stream-interval`` 4 (woken for 4 tokens at a time) prints what it
    prints with the default, and the key is checked like every other."""
    stdin = "hello\nJim\n"
    _, every, _ = run_guest(nn, tmp_path, "chat", ["succ"], stdin=stdin, env={"temp": "0"})
    code, batched, err = run_guest(
        nn, tmp_path, "chat", ["succ"], stdin=stdin, env={"WASINN_CONFIG": '{"temp": 0, "stream-interval": 4}'}
    )
    assert code == 0, err
    assert batched == every == successor_text("hello") + "\n" + successor_text("Jim") + "\n"
    code, _, err = run_guest(
        nn, tmp_path, "chat", ["succ"], stdin=stdin, env={"WASINN_CONFIG": '{"stream-interval": 9}'}
    )
    assert code == 1 and "returned 1" in err  # invalid argument at load
