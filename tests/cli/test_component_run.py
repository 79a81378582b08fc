"""`wasinn run` with components, the compile cache, and the component guests' offline build."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import wasmtime
import wasmtime.component as cm

from wasinn_host.launch.compile_cache import CompileCache, default_cache_dir, wasmtime_version
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS, wasinn_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPONENT = GUESTS / "components" / "nn_complete.wasm"


def wasinn_run(cache: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return wasinn_cli(*args, env={"XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT)}, timeout=300)


def test_wasinn_run_runs_a_component_like_the_core_guest(successor_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    preload = f"--nn-preload=succ:GGML:AUTO:{successor_path}"
    component = wasinn_run(tmp_path, preload, "--timeout", "120", str(COMPONENT), "succ", "hello")
    core = wasinn_run(tmp_path, preload, str(GUESTS / "complete.wasm"), "succ", "hello")
    assert (component.returncode, component.stdout) == (0, successor_text("hello") + "</s>\n")
    assert (core.returncode, core.stdout) == (0, component.stdout)
    entries = sorted(p.name.split("-")[1] for p in (tmp_path / "wasinn").iterdir())
    assert entries == ["component", "module"]  # both compiled once and kept
    again = wasinn_run(tmp_path, preload, "--instances", "2", str(COMPONENT), "succ", "m")
    assert (again.returncode, again.stdout) == (0, (successor_text("m") + "</s>\n") * 2)


def test_no_cache_keeps_nothing_and_errors_are_one_line(successor_path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    result = wasinn_run(tmp_path, "--no-cache", f"--nn-preload=succ:GGML:AUTO:{successor_path}", str(COMPONENT))
    assert result.returncode == 1 and result.stderr == "usage: nn_complete.wasm ALIAS PROMPT [CONFIG_JSON]\n"
    assert not (tmp_path / "wasinn").exists()
    broken = tmp_path / "broken.wasm"
    broken.write_bytes(COMPONENT.read_bytes()[:200])
    result = wasinn_run(tmp_path, str(broken))
    assert result.returncode == 2
    assert result.stderr.startswith(f"wasinn: error: {str(broken)!r} is not a valid WebAssembly component: ")


def test_compile_cache_reuses_and_recovers_from_corrupt_and_stale_entries(tmp_path: pathlib.Path) -> None:
    engine = wasmtime.Engine()
    cache = CompileCache(engine, tmp_path)
    wasm = COMPONENT.read_bytes()
    cache.component(wasm)
    cache.component(wasm)
    assert (cache.misses, cache.hits) == (1, 1)
    (entry,) = tmp_path.iterdir()
    assert entry.name.endswith(f"-component-{wasmtime_version()}-default.bin")

    entry.write_bytes(entry.read_bytes()[:1000])  # truncated: the digest no longer matches
    assert isinstance(cache.component(wasm), cm.Component)
    assert (cache.misses, cache.hits) == (2, 1)

    garbage = b"\x7fELF not really a compiled component"
    entry.write_bytes(hashlib.sha256(garbage).digest() + garbage)  # intact file, but not wasmtime's
    assert isinstance(cache.component(wasm), cm.Component)
    assert (cache.misses, cache.hits) == (3, 1)
    cache.component(wasm)
    assert (cache.misses, cache.hits) == (3, 2)  # the rewritten entry is good

    module = (GUESTS / "complete.wasm").read_bytes()
    assert isinstance(cache.module(module), wasmtime.Module)
    assert len(list(tmp_path.iterdir())) == 2


def test_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "wasinn"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == pathlib.Path.home() / ".cache" / "wasinn"


def test_committed_component_guests_match_a_fresh_build() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "tools" / "build_components.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, f"run `python scripts/tools/build_components.py`\n{proc.stdout}\n{proc.stderr}"


def test_timeout_stops_a_runaway_component_and_frees_its_context(tmp_path: pathlib.Path) -> None:
    probe = GUESTS / "components" / "nn_probe.wasm"
    # the demo model is F16: on an AMX machine its first load probes llama.cpp's CPU layouts (a second or
    # two, once per cache); `wasinn info` leaves the verdict in this cache so the 0.5 s go to the guest
    info = [sys.executable, "-m", "wasinn_host", "info"]
    cache = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    assert subprocess.run(info, env=cache, capture_output=True, timeout=300, check=False).returncode == 0
    result = wasinn_run(tmp_path, "--timeout", "0.5", "--status", str(probe), "name", "default", "ctx", "spin")
    assert (result.returncode, result.stdout) == (134, "graph ok\nctx ok\n")
    assert "wasinn: error: the guest trapped: stopped by --timeout 0.5s" in result.stderr
    status = json.loads(next(line for line in result.stderr.splitlines() if line.startswith("{")))
    assert status["sessions"]["component_stores"] == 0 and status["sessions"]["component_execution_contexts"] == 0


def test_wasinn_run_keeps_the_list_heap_for_components_only(
    successor_path: pathlib.Path,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """``keep_list_heap`` changes malloc for the whole process: the CLI asks for it only for a component."""
    from wasinn_host import cli
    from wasinn_host.cli import run as run_cli
    from wasinn_host.guest import fast_calls

    calls: list[int] = []

    def keep_list_heap() -> bool:
        calls.append(1)
        return True

    monkeypatch.setattr(fast_calls, "keep_list_heap", keep_list_heap)  # the CLI imports it when a component runs
    monkeypatch.setattr(run_cli, "configure_logging", lambda *args: None)  # keep this process's loggers
    monkeypatch.setattr(run_cli.signal, "signal", lambda *args: None)  # and its SIGHUP handler
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    preload = f"--nn-preload=succ:GGML:AUTO:{successor_path}"
    assert cli.main(["run", preload, str(GUESTS / "complete.wasm"), "succ", "hello"]) == 0
    assert calls == []
    assert cli.main(["run", preload, str(COMPONENT), "succ", "hello"]) == 0
    assert calls == [1]
    assert capfd.readouterr().out == (successor_text("hello") + "</s>\n") * 2
