"""``wasinn model``: the built-in test models written from the command line, listed, and served by ``wasinn run``."""

from __future__ import annotations

import io
import pathlib
import subprocess
import sys
import wave

import pytest

from wasinn_host.cli import main
from wasinn_host.models import DEMO_MODEL_PATH
from wasinn_host.testing.gguf_models import successor_text, write_random_model, write_successor_model
from wasinn_host.testing.guest_runs import GUESTS, wasinn_cli
from wasinn_host.testing.tts_models import CHAIN, write_outetts_model, write_wavtokenizer_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL_RANDOM = ["--layers", "2", "--embd", "64", "--heads", "2", "--ff", "128", "--vocab", "400", "--seed", "3"]


def wasinn_model(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["model", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_says_what_each_model_is_and_what_to_expect(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = wasinn_model(capsys, "--list")
    assert (code, err) == (0, "")
    names = [line for line in out.splitlines() if not line.startswith(" ")]
    assert names == ["successor", "demo", "random", "tts", "vocoder"]
    text = " ".join(out.split())
    assert "output: greedy output known in advance: after 'a' comes 'bcdefghijklmnopqrstuvwxyz'" in text
    assert "'What is 12+30?' -> '42<|im_end|>'" in text
    assert "171 MB in F16" in text
    assert "WAV of 12,800 samples (0.533 s, 25,644 bytes), the first 6,000 (0.25 s) silent" in text
    assert "the file a TTS graph's model-vocoder names" in text


def test_successor_is_the_library_model_and_serves_its_known_output(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "models" / "successor.gguf"  # the folder is made
    code, out, err = wasinn_model(capsys, "successor", str(path))
    assert (code, err) == (0, "")
    assert out.startswith(f"wrote {path} (successor model, 3.8 MB) in ")
    assert path.read_bytes() == write_successor_model(tmp_path / "library.gguf").read_bytes()
    run = wasinn_cli("--nn-preload", f"default:GGML:AUTO:{path}", str(GUESTS / "complete.wasm"), "default", "abc")
    assert (run.returncode, run.stdout) == (0, successor_text("abc") + "</s>\n"), run.stderr

    code, _, _ = wasinn_model(capsys, "successor", str(path), "--logit-gap", "1.5", "--layers", "2", "--f16")
    assert code == 0
    library = write_successor_model(tmp_path / "library.gguf", logit_gap=1.5, n_layer=2, f16=True)
    assert path.read_bytes() == library.read_bytes()


def test_random_takes_its_size_options(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    path = tmp_path / "random.gguf"
    code, out, err = wasinn_model(capsys, "random", str(path), *SMALL_RANDOM, "--context-length", "256", "--f32")
    assert (code, err) == (0, "") and out.startswith(f"wrote {path} (random model, ")
    expected = write_random_model(
        tmp_path / "library.gguf",
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_ff=128,
        n_vocab=400,
        seed=3,
        context_length=256,
        f16=False,
    )
    assert path.read_bytes() == expected.read_bytes() != b""
    # F16 by default: a different, smaller file of the same network
    code, _, _ = wasinn_model(capsys, "random", str(tmp_path / "f16.gguf"), *SMALL_RANDOM)
    assert code == 0 and (tmp_path / "f16.gguf").stat().st_size < path.stat().st_size
    run = wasinn_cli(
        "--nn-preload",
        f"default:GGML:AUTO:{path}",
        "--env",
        "n_predict=5",
        str(GUESTS / "complete.wasm"),
        "default",
        "abc",
    )
    assert run.returncode == 0, run.stderr
    assert '"output_tokens": 5' in run.stderr


def test_demo_is_a_copy_of_the_embedded_model(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    code, out, _ = wasinn_model(capsys, "demo", str(tmp_path / "demo.gguf"))
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'demo.gguf'} (demo model, 1.5 MB)")
    assert (tmp_path / "demo.gguf").read_bytes() == DEMO_MODEL_PATH.read_bytes()


def wav_samples(data: bytes) -> list[int]:
    """The samples of a 24 kHz 16-bit mono WAV (anything else fails the test)."""
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        frames = wav.readframes(wav.getnframes())
    return [int.from_bytes(frames[i : i + 2], "little", signed=True) for i in range(0, len(frames), 2)]


def test_tts_and_vocoder_are_the_library_models_and_speak_the_known_wav(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    """The two files of a TTS graph, written from the command line, run WasmEdge's tts guest (the command line
    of `wasinn model --help`, no speaker file): the WAV `wasinn model --list` describes."""
    models = tmp_path / "models"
    code, out, err = wasinn_model(capsys, "tts", str(models / "outetts.gguf"))
    assert (code, err) == (0, "") and out.startswith(f"wrote {models / 'outetts.gguf'} (tts model, 5.1 MB) in ")
    code, out, err = wasinn_model(capsys, "vocoder", str(models / "wavtokenizer.gguf"))
    assert (code, err) == (0, "") and out.startswith(f"wrote {models / 'wavtokenizer.gguf'} (vocoder model, 1.0 MB)")
    assert (models / "outetts.gguf").read_bytes() == write_outetts_model(tmp_path / "lib-tts.gguf").read_bytes()
    library_vocoder = write_wavtokenizer_model(tmp_path / "lib-voc.gguf")
    assert (models / "wavtokenizer.gguf").read_bytes() == library_vocoder.read_bytes()

    env = {"tts": "true", "tts_output_file": "output.wav", "model_vocoder": "models/wavtokenizer.gguf"}
    argv = [sys.executable, "-m", "wasinn_host", "run", "--dir", ".:."]
    argv += [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
    argv += ["--nn-preload", "default:GGML:AUTO:models/outetts.gguf", str(GUESTS / "tts.wasm"), "default", "Hi"]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert '[INFO] Plugin writes output to file "output.wav"' in run.stdout
    wav = (tmp_path / "output.wav").read_bytes()
    assert (tmp_path / "output-buffer.wav").read_bytes() == wav
    samples = wav_samples(wav)
    assert len(wav) == 25_644 and len(samples) == 12_800 == 320 * len(CHAIN)
    assert not any(samples[:6000]) and max(map(abs, samples[6000:])) > 100


def test_tts_and_vocoder_options_are_the_library_options(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "tts.gguf"
    code, _, _ = wasinn_model(capsys, "tts", str(path), "--outetts-version", "0.3", "--context-length", "4096")
    assert code == 0
    library = write_outetts_model(tmp_path / "lib.gguf", version="0.3", context_length=4096)
    assert path.read_bytes() == library.read_bytes()
    code, _, _ = wasinn_model(capsys, "tts", str(path), "--random-codes")
    assert code == 0 and path.read_bytes() == write_outetts_model(tmp_path / "lib.gguf", random_codes=True).read_bytes()
    code, _, _ = wasinn_model(capsys, "vocoder", str(path), "--seed", "7")
    assert code == 0 and path.read_bytes() == write_wavtokenizer_model(tmp_path / "lib.gguf", seed=7).read_bytes()
    assert path.read_bytes() != write_wavtokenizer_model(tmp_path / "lib.gguf").read_bytes()


def test_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    assert wasinn_model(capsys, "random", str(tmp_path / "r.gguf"), "--vocab", "100") == (
        2,
        "",
        "wasinn: error: random model: n_vocab must be at least 354, got 100\n",
    )
    assert wasinn_model(capsys, "random", str(tmp_path / "r.gguf"), "--embd", "64", "--heads", "3") == (
        2,
        "",
        "wasinn: error: random model: n_embd must be n_head times an even head dimension\n",
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, err = wasinn_model(capsys, "successor", str(blocker / "s.gguf"))
    assert (code, out) == (2, "") and err.startswith(f"wasinn: error: cannot write {str(blocker / 's.gguf')!r}: ")
    assert err.count("\n") == 1
    assert wasinn_model(capsys) == (
        2,
        "",
        "wasinn: error: name a model (successor, demo, random, tts, vocoder) and a PATH, or give --list\n",
    )
    assert wasinn_model(capsys, "tts", str(tmp_path / "t.gguf"), "--context-length", "0") == (
        2,
        "",
        "wasinn: error: tts model: context_length must be positive\n",
    )
    assert wasinn_model(capsys, "vocoder", str(tmp_path / "v.gguf"), "--seed", "-1") == (
        2,
        "",
        "wasinn: error: vocoder model: seed must be at least 0, got -1\n",
    )
    code, out, err = wasinn_model(capsys, "vocoder", str(blocker / "v.gguf"))
    assert (code, out) == (2, "") and err.startswith(f"wasinn: error: cannot write {str(blocker / 'v.gguf')!r}: ")
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as usage:  # argparse's usage error, exit code 2 as every usage error
        main(["model", "tts", str(tmp_path / "t.gguf"), "--outetts-version", "1.0"])
    assert usage.value.code == 2
    assert capsys.readouterr().err == (
        "wasinn: error: argument --outetts-version: invalid choice: '1.0' (choose from '0.2', '0.3') "
        "(see 'wasinn model tts --help')\n"
    )
    assert not list(tmp_path.glob("*.gguf*"))


@pytest.mark.parametrize("name", ["successor", "tts", "vocoder"])
def test_without_gguf_one_line_names_the_extra(tmp_path: pathlib.Path, name: str) -> None:
    """A Python where ``import gguf`` fails, as where the models extra is not installed."""
    code = "import sys; sys.modules['gguf'] = None; from wasinn_host.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.run(
        [sys.executable, "-c", code, "model", name, str(tmp_path / "m.gguf")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        f"wasinn: error: writing the {name} model needs the gguf package, which is not installed: "
        "pip install 'wasinn-host[models]'\n"
    )
    assert not (tmp_path / "m.gguf").exists()


def test_make_models_script_is_wasinn_model(tmp_path: pathlib.Path) -> None:
    script = ROOT / "scripts" / "tools" / "make_models.py"
    run = subprocess.run(
        [sys.executable, str(script), "successor", str(tmp_path / "s.gguf")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.startswith(f"wrote {tmp_path / 's.gguf'} (successor model")
    assert (tmp_path / "s.gguf").read_bytes() == write_successor_model(tmp_path / "library.gguf").read_bytes()
    help_text = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    assert "testmodels" not in help_text and "usage: wasinn model" in help_text
