"""The CPU probe through real llama.cpp, each case in a fresh process (the layout list is process-wide): a
quantized model answers on this machine whatever its CPU (on an Intel AMX Xeon the AMX layout kills the
decode without the probe), a probe forced to die leads to the safe load, and ``wasinn info`` shows the verdict."""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.log import init_backend
from wasinn_host.models import DEMO_MODEL_PATH

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUESTION = "<|im_start|>user\\nWhat is 12+30?<|im_end|>\\n<|im_start|>assistant\\n"


@pytest.fixture(scope="module")
def quantized_demo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The demo model quantized to Q4_0 (a type every extra CPU layout takes); it still answers 12+30 with 42."""
    init_backend()
    path = tmp_path_factory.mktemp("q") / "demo-q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    assert llama_cpp.llama_model_quantize(str(DEMO_MODEL_PATH).encode(), str(path).encode(), ctypes.byref(params)) == 0
    return path


def run_python(script: str, cache: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter with its own cache directory (so its own verdict file)."""
    environment = {k: v for k, v in os.environ.items() if k != "WASINN_AMX"}
    environment.update(XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=environment, timeout=300
    )


COMPLETE = """
    import json, sys
    from wasinn_host import WasiNN
    from wasinn_host.llama import cpu_buffers, cpu_probe
    nn = WasiNN(preload=["q:GGML:AUTO:{model}"])
    with nn.session("q", {{"temp": 0, "n-predict": 8}}) as session:
        text = session.complete("{question}")
    print(json.dumps({{"text": text, "verdict": cpu_probe.current().as_json(), "active": cpu_buffers.active()}}))
"""


def test_a_quantized_model_answers_on_this_cpu(quantized_demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    proc = run_python(COMPLETE.format(model=quantized_demo, question=QUESTION), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["text"] == "42<|im_end|>"
    verdict = out["verdict"]
    assert verdict["source"] in ("probe", "none")
    assert not set(verdict["disabled"]) & set(out["active"])
    if verdict["source"] == "probe":
        first = verdict["trials"][0]
        assert (first["outcome"] == "ok") == (verdict["disabled"] == [])
        assert pathlib.Path(verdict["file"]).parent == tmp_path / "wasinn" / "cpu-probe"
        if verdict["disabled"]:  # the one warning line, naming what and why
            warnings = [line for line in proc.stderr.splitlines() if "CPU layout is off" in line]
            assert len(warnings) == 1 and first["outcome"] in warnings[0]
    again = run_python(COMPLETE.format(model=quantized_demo, question=QUESTION), tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    reread = json.loads(again.stdout)["verdict"]
    assert reread["disabled"] == verdict["disabled"]
    assert reread["source"] == ("cache" if verdict["source"] == "probe" else "none")


FORCED_DEATH = """
    import json, os, signal, subprocess, sys
    from wasinn_host import WasiNN
    from wasinn_host.llama import cpu_buffers, cpu_probe

    def dies_unless_amx_is_off(without):  # a probe child killed by a real SIGILL wherever AMX is on
        script = "import os, signal, sys\\nif 'AMX' in sys.argv[1:]: sys.exit(0)\\nos.kill(os.getpid(), signal.SIGILL)"
        proc = subprocess.run([sys.executable, "-c", script, *without], capture_output=True, text=True)
        return cpu_probe.child_outcome(proc.returncode, proc.stdout)

    verdict = cpu_probe.current(dies_unless_amx_is_off)
    nn = WasiNN(preload=["q:GGML:AUTO:{model}"])
    with nn.session("q", {{"temp": 0, "n-predict": 8}}) as session:
        text = session.complete("{question}")
    print(json.dumps({{"text": text, "verdict": verdict.as_json(), "active": cpu_buffers.active(),
                      "available": cpu_buffers.available()}}))
"""


def test_a_probe_forced_to_die_leads_to_the_safe_load(quantized_demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    proc = run_python(FORCED_DEATH.format(model=quantized_demo, question=QUESTION), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["text"] == "42<|im_end|>"
    verdict = out["verdict"]
    if not out["available"]:
        assert verdict["disabled"] == []
        return
    assert verdict["trials"][0] == {"without": [], "outcome": "died of SIGILL"}
    expected = ["AMX"] if "AMX" in out["available"] else out["available"]  # without AMX nothing cures it
    assert verdict["disabled"] == expected
    assert out["active"] == [n for n in out["available"] if n not in expected]


def test_layouts_are_turned_off_and_back_on(tmp_path: pathlib.Path) -> None:
    proc = run_python(
        """
        import json
        from wasinn_host.llama import cpu_buffers
        from wasinn_host.llama.log import init_backend
        init_backend()
        names = cpu_buffers.available()
        seen = [cpu_buffers.active()]
        for name in names:
            seen.append(cpu_buffers.disable([name]))
        seen.append(cpu_buffers.disable(names))
        cpu_buffers.enable_all()
        seen.append(cpu_buffers.active())
        print(json.dumps({"names": names, "seen": seen}))
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    names = out["names"]
    assert out["seen"][0] == names == out["seen"][-1]
    for i, name in enumerate(names):
        assert out["seen"][1 + i] == [n for n in names if n != name]
    assert out["seen"][1 + len(names)] == []


@pytest.mark.parametrize("policy", ["off", "on"])
def test_wasinn_info_shows_the_layouts(tmp_path: pathlib.Path, policy: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "info", "--json"],
        capture_output=True,
        text=True,
        env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT), WASINN_AMX=policy),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    layouts = json.loads(proc.stdout)["cpu_layouts"]
    assert layouts["source"] == ("forced" if layouts["available"] else "none")
    amx = ["AMX"] if "AMX" in layouts["available"] else []
    assert layouts["disabled"] == (amx if policy == "off" else [])
    text = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "info"],
        capture_output=True,
        text=True,
        env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT), WASINN_AMX=policy),
        timeout=120,
    )
    line = next(line for line in text.stdout.splitlines() if line.startswith("CPU layouts"))
    assert ("AMX off: WASINN_AMX=off" in line) == bool(amx and policy == "off")


def test_a_bad_wasinn_amx_is_one_line(tmp_path: pathlib.Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "wasinn_host", "info"],
        capture_output=True,
        text=True,
        env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT), WASINN_AMX="sometimes"),
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "wasinn: error: WASINN_AMX='sometimes': expected one of auto, on, off (invalid argument)"
    ]
