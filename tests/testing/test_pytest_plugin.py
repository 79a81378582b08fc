"""The ``wasinn_run`` pytest plugin, run by pytest's own ``pytester`` on throwaway projects that test
the example guests (a core module and a component) through the real host and llama.cpp."""

from __future__ import annotations

import importlib.metadata
import pathlib
import shutil
import statistics
from typing import Any

import pytest
import wasmtime

# Imported here, before any inner session: pytester's in-process runs drop the modules a run imported
# first, and llama.cpp's bindings and the harness must stay loaded once.
import wasinn_host.llama.runtime  # noqa: F401
import wasinn_host.pytest_plugin  # noqa: F401
import wasinn_host.testing.guest_harness  # noqa: F401
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS, wasinn_cli
from wasinn_host.testing.tts_models import TEST_SPEAKER, write_speaker_file

PLUGIN = ("-p", "wasinn_host.pytest_plugin")
CORE_CALLS = (
    "{'load_by_name_with_config': 1, 'init_execution_context': 1, 'set_input': 1, 'compute': 1, 'get_output': 2}"
)

GUEST_TESTS = """
import wasmtime

from wasinn_host.testing.gguf_models import write_successor_model


def test_core_module(wasinn_run):
    result = wasinn_run("guests/complete.wasm", ["default", "abc"], model="successor")
    assert result.exit_code == 0
    assert result.stdout == "defghijklmnopqrstuvwxyz</s>\\n"
    assert '"stop_reason":"eos"' in result.stderr
    assert result.calls == {core_calls}


def test_component(wasinn_run):
    result = wasinn_run("guests/nn_complete.wasm", ["succ", "hello"], model="successor", name="succ")
    assert (result.exit_code, result.stdout) == (0, "pqrstuvwxyz</s>\\n")
    assert result.calls == {{"load-by-name": 1, "init-execution-context": 1, "compute": 1}}


def test_demo_model_env_and_stdin(wasinn_run):
    result = wasinn_run("guests/chat.wasm", ["default"], env={{"chat_template": "chatml"}}, stdin="What is 12+30?\\n")
    assert (result.exit_code, result.stdout) == (0, "42\\n")
    assert result.calls["compute_single"] == 3


def test_env_bounds_generation(wasinn_run):
    result = wasinn_run("guests/complete.wasm", ["default", "7"], model="successor", env={{"n_predict": "12"}})
    assert (result.exit_code, result.stdout) == (0, "890123456789\\n")


def test_limits(wasinn_run):
    result = wasinn_run("guests/complete.wasm", ["default", "abc"], model="successor", max_prompt_bytes=2)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == "wasi-nn error: set_input returned 7\\n"
    assert result.calls["set_input"] == 1 and result.calls["compute"] == 0


def test_dirs_and_a_model_path(wasinn_run, tmp_path):
    write_successor_model(tmp_path / "mine.gguf")
    result = wasinn_run("guests/load_bytes.wasm", ["/m/mine.gguf", "w"], dirs=[f"/m:{{tmp_path}}"])
    assert (result.exit_code, result.stdout) == (0, "xyz</s>\\n")
    result = wasinn_run("guests/complete.wasm", ["m", "k"], model=str(tmp_path / "mine.gguf"), name="m")
    assert (result.exit_code, result.stdout) == (0, "lmnopqrstuvwxyz</s>\\n")


def test_wrong_answer_fails(wasinn_run):
    result = wasinn_run("guests/complete.wasm", ["default", "abc"], model="successor")
    assert result.stdout == "the wrong answer\\n"


def test_trap(wasinn_run):
    module = wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "_start") unreachable))')
    result = wasinn_run(bytes(module))
    assert result.exit_code == 134
    assert result.stderr.startswith("wasinn: error: the guest trapped: wasm trap: wasm `unreachable`")


def test_endless_loop_times_out(wasinn_run):
    result = wasinn_run("guests/loop.wasm", timeout=0.5)
    assert result.exit_code == 134
    assert result.stderr == {stopped!r}  # what `wasinn run --timeout 0.5` prints
    assert 0.5 <= result.seconds < 1.5


def test_endless_loop_past_its_timeout_fails(wasinn_run):
    result = wasinn_run("guests/loop.wasm", timeout=0.3)
    assert result.exit_code == 0


def test_missing_module(wasinn_run):
    result = wasinn_run("guests/none.wasm", ["default", "a"])
    assert (result.exit_code, result.stderr) == (2, "wasinn: error: module 'guests/none.wasm' does not exist\\n")


def test_unknown_model_name_fails(wasinn_run):
    wasinn_run("guests/complete.wasm", ["default", "a"], model="llama-70b")
"""

EXPECTED = {
    "test_core_module": "passed",
    "test_component": "passed",
    "test_demo_model_env_and_stdin": "passed",
    "test_env_bounds_generation": "passed",
    "test_limits": "passed",
    "test_dirs_and_a_model_path": "passed",
    "test_wrong_answer_fails": "failed",
    "test_trap": "passed",
    "test_endless_loop_times_out": "passed",
    "test_endless_loop_past_its_timeout_fails": "failed",
    "test_missing_module": "passed",
    "test_unknown_model_name_fails": "failed",
}

SWAP_TESTS = """
def test_demo_is_swapped(wasinn_run):
    result = wasinn_run("guests/complete.wasm", ["default", "abc"])
    assert (result.exit_code, result.stdout) == (0, "defghijklmnopqrstuvwxyz</s>\\n")


def test_a_name_of_the_tests_own(wasinn_run):
    result = wasinn_run("guests/nn_complete.wasm", ["default", "Q"], model="production-model")
    assert (result.exit_code, result.stdout) == (0, "RSTUVWXYZ</s>\\n")


def test_successor_is_not_swapped(wasinn_run):
    result = wasinn_run("guests/complete.wasm", ["default", "x"], model="successor")
    assert (result.exit_code, result.stdout) == (0, "yz</s>\\n")
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A throwaway project holding copies of the example guests and an endless-loop guest."""
    guests = pytester.mkdir("guests")
    for name in ("complete.wasm", "chat.wasm", "load_bytes.wasm", "tts.wasm", "components/nn_complete.wasm"):
        shutil.copy(GUESTS / name, guests / pathlib.Path(name).name)
    loop = wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "_start") (loop br 0)))')
    (guests / "loop.wasm").write_bytes(bytes(loop))
    return pytester


def _outcomes(result: pytest.RunResult) -> dict[str, str]:
    reports = result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    outcomes: dict[str, str] = {}
    for report in reports:
        name = report.nodeid.split("::")[-1]
        if report.when == "call" or report.outcome != "passed":
            outcomes[name] = report.outcome
    return outcomes


def _seconds_per_test(result: pytest.RunResult) -> dict[str, float]:
    """Setup, call and teardown of each test together."""
    seconds: dict[str, float] = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
        name = report.nodeid.split("::")[-1]
        seconds[name] = seconds.get(name, 0.0) + report.duration
    return seconds


def test_guest_tests_pass_and_fail_as_they_should(project: pytest.Pytester) -> None:
    stopped = wasinn_cli("--timeout", "0.5", str(project.path / "guests" / "loop.wasm"))
    assert stopped.returncode == 134 and stopped.stderr.count("\n") == 1, stopped.stderr
    project.makepyfile(test_prebuilt_guests=GUEST_TESTS.format(core_calls=CORE_CALLS, stopped=stopped.stderr))
    result = project.runpytest(*PLUGIN)
    assert _outcomes(result) == EXPECTED
    result.assert_outcomes(passed=9, failed=3)
    result.stdout.fnmatch_lines(
        [
            '>       assert result.stdout == "the wrong answer\\n"',
            "E         - the wrong answer",
            "E         + defghijklmnopqrstuvwxyz</s>",
            "*_ test_unknown_model_name_fails _*",
            "wasinn_run: model 'llama-70b' is not a built-in test model (successor, demo, random, tts, vocoder), "
            "a name given a file with --wasinn-model llama-70b=PATH, or a path to a GGUF file",
        ]
    )
    # the failed timeout is reported with the guest's result: exit code and the error line
    result.stdout.fnmatch_lines(["*where 134 = GuestResult(exit_code=134, stdout='', stderr='wasinn: error: *0.3s*"])


def test_a_guest_test_takes_well_under_a_second_after_the_first(project: pytest.Pytester) -> None:
    """The session's first test writes and loads the model and compiles the guest; later ones reuse them."""
    project.makepyfile(
        test_speed="""
import pytest

@pytest.mark.parametrize("prompt", ["a", "b", "c", "d", "e", "f"])
def test_core(wasinn_run, prompt):
    result = wasinn_run("guests/complete.wasm", ["default", prompt], model="successor")
    assert result.exit_code == 0 and result.stdout.endswith("z</s>\\n")

@pytest.mark.parametrize("prompt", ["A", "B", "C", "D", "E", "F"])
def test_component(wasinn_run, prompt):
    result = wasinn_run("guests/nn_complete.wasm", ["default", prompt], model="successor")
    assert result.exit_code == 0 and result.stdout.endswith("Z</s>\\n")
"""
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=12)
    seconds = _seconds_per_test(result)
    first, *rest = seconds.values()
    print(
        f"\nfirst guest test {first * 1000:.0f} ms; the next {len(rest)}: " + ", ".join(f"{s * 1000:.0f}" for s in rest)
    )
    assert statistics.median(rest) <= 1.0, seconds  # typically 10-30 ms; this machine is shared


def test_wasinn_model_swaps_a_real_model_in(project: pytest.Pytester, successor_path: pathlib.Path) -> None:
    project.makepyfile(test_swap=SWAP_TESTS)
    result = project.runpytest(
        *PLUGIN, f"--wasinn-model=demo={successor_path}", "--wasinn-model", f"production-model={successor_path}"
    )
    result.assert_outcomes(passed=3)
    # without the option the demo model answers instead, and the unknown name fails the test
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*model 'production-model' is not a built-in test model*"])


def test_wasinn_model_errors_are_one_usage_line(project: pytest.Pytester, tmp_path: pathlib.Path) -> None:
    project.makepyfile(test_swap=SWAP_TESTS)
    result = project.runpytest(*PLUGIN, "--wasinn-model", "demo")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --wasinn-model 'demo': expected NAME=PATH, e.g. demo=models/llama.gguf"])
    result = project.runpytest(*PLUGIN, f"--wasinn-model=demo={tmp_path / 'none.gguf'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --wasinn-model 'demo={tmp_path / 'none.gguf'}': *is not a file"])


def test_random_model_and_a_timeout_inside_compute(project: pytest.Pytester) -> None:
    """A guest blocked in inference past its timeout is cancelled and stopped: a result, not a hang."""
    project.makepyfile(
        test_load="""
GREEDY_8 = {"n_predict": "8", "temp": "0"}


def test_random(wasinn_run):
    quick = wasinn_run("guests/complete.wasm", ["default", "abc"], model="random", env=GREEDY_8)
    assert quick.exit_code == 0 and '"output_tokens": 8' in quick.stderr
    again = wasinn_run("guests/complete.wasm", ["default", "abc"], model="random", env=GREEDY_8)
    assert again.stdout == quick.stdout  # greedy output is deterministic

def test_timeout_in_compute(wasinn_run):
    endless = '{"n-predict": 100000, "ignore-eos": true}'  # a sampled end of text must not end it early
    result = wasinn_run("guests/nn_complete.wasm", ["default", "abc", endless], model="random", timeout=1)
    assert (result.exit_code, result.stdout) == (134, "")
    assert result.stderr.startswith("wasinn: error: the guest trapped: ") and "1s" in result.stderr
    assert result.calls["compute"] == 1
    assert result.seconds < 4
"""
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=2)


TTS_TESTS = """
import io
import pathlib
import wave

from wasinn_host.testing.tts_models import TEST_SPEAKER, write_speaker_file


def speak(wasinn_run, wasinn_model_file, tmp_path, text, **env):
    vocoder = wasinn_model_file("vocoder")
    env |= {{"tts": "true", "tts_output_file": "output.wav", "model_vocoder": f"/models/{{vocoder.name}}"}}
    dirs = [(str(tmp_path), "."), (str(vocoder.parent), "/models")]
    result = wasinn_run("guests/tts.wasm", ["default", text], model="tts", env=env, dirs=dirs)
    assert result.exit_code == 0, result.stderr
    assert result.calls["compute"] == 1 and result.stdout.startswith(f"Prompt:\\n{{text}}\\n")
    return (tmp_path / "output.wav").read_bytes()


def test_the_known_wav(wasinn_run, wasinn_model_file, tmp_path):
    wav = speak(wasinn_run, wasinn_model_file, tmp_path, "Hello world")  # WasmEdge's default speaker
    assert wav == pathlib.Path({expected!r}).read_bytes()
    with wave.open(io.BytesIO(wav)) as audio:
        assert (audio.getframerate(), audio.getnchannels(), audio.getsampwidth(), audio.getnframes()) == (
            24000, 1, 2, 12800
        )
        assert audio.readframes(6000) == bytes(12000) and any(audio.readframes(6800))


def test_any_text_and_speaker_the_same_wav(wasinn_run, wasinn_model_file, tmp_path):
    write_speaker_file(tmp_path / "speaker.json", TEST_SPEAKER)
    wav = speak(wasinn_run, wasinn_model_file, tmp_path, "Something else, 42 times.", tts_speaker_file="speaker.json")
    assert wav == pathlib.Path({expected!r}).read_bytes()
"""


def test_a_tts_guest_speaks_the_known_wav(project: pytest.Pytester, tmp_path: pathlib.Path) -> None:
    """WasmEdge's tts guest through the fixture: model "tts", the "vocoder" file from wasinn_model_file in a
    directory of its own; the WAV is the one ``wasinn run`` makes of the files ``wasinn model`` writes (any text,
    any speaker), and ``--wasinn-model vocoder=PATH`` swaps the vocoder (another seed: another WAV, as long)."""
    from wasinn_host.cli import main

    expected = {}
    for seed in ("0", "1"):
        folder = tmp_path / f"seed{seed}"
        assert main(["model", "tts", str(folder / "outetts.gguf")]) == 0
        assert main(["model", "vocoder", str(folder / "voc.gguf"), "--seed", seed]) == 0
        write_speaker_file(folder / "speaker.json", TEST_SPEAKER)  # a short prompt: a quicker run, the same WAV
        run = wasinn_cli(
            *("--dir", f".:{folder}", "--env", "tts=true", "--env", "tts_output_file=output.wav"),
            *("--env", "model_vocoder=voc.gguf", "--env", "tts_speaker_file=speaker.json"),
            *(
                "--nn-preload",
                f"default:GGML:AUTO:{folder / 'outetts.gguf'}",
                str(GUESTS / "tts.wasm"),
                "default",
                "Hi",
            ),
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        expected[seed] = folder / "output.wav"
    assert len(expected["0"].read_bytes()) == len(expected["1"].read_bytes()) == 25_644
    assert expected["0"].read_bytes() != expected["1"].read_bytes()
    project.makepyfile(
        test_tts=TTS_TESTS.format(expected=str(expected["0"])),
        test_tts_swapped=TTS_TESTS.format(expected=str(expected["1"])),
    )
    result = project.runpytest(*PLUGIN, "test_tts.py")
    result.assert_outcomes(passed=2)
    swap = f"--wasinn-model=vocoder={tmp_path / 'seed1' / 'voc.gguf'}"
    result = project.runpytest(*PLUGIN, swap, "test_tts_swapped.py", "-k", "any_text")
    result.assert_outcomes(passed=1, deselected=1)


def test_wasinn_model_file_of_an_unknown_name_fails_in_one_line(project: pytest.Pytester) -> None:
    project.makepyfile(test_file="def test_unknown(wasinn_model_file):\n    wasinn_model_file('llama-70b')\n")
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["wasinn_model_file: model 'llama-70b' is not a built-in test model (*"])
    assert "Traceback" not in result.stdout.str()


def test_the_entry_point_loads_the_plugin_without_p(project: pytest.Pytester) -> None:
    (entry_point,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.value.startswith("wasinn")]
    assert (entry_point.name, entry_point.value) == ("wasinn_host.pytest_plugin", "wasinn_host.pytest_plugin")
    project.makepyfile(
        test_one="""
def test_core_module(wasinn_run):
    result = wasinn_run("guests/complete.wasm", ["default", "x"], model="successor")
    assert (result.exit_code, result.stdout) == (0, "yz</s>\\n")
"""
    )
    result = project.runpytest()
    result.assert_outcomes(passed=1)
    result = project.runpytest("--help")
    result.stdout.fnmatch_lines(["*--wasinn-model=NAME=PATH*"])


def test_the_expected_outputs_are_the_successor_table() -> None:
    """The outputs the projects above expect, from the successor model's documented table."""
    expected: dict[str, Any] = {"abc": "defghijklmnopqrstuvwxyz", "hello": "pqrstuvwxyz", "k": "lmnopqrstuvwxyz"}
    assert {prompt: successor_text(prompt) for prompt in expected} == expected
    assert successor_text("7", 12) == "890123456789" and successor_text("Q") == "RSTUVWXYZ"
