"""The docs' examples run as shown: the README's first command and embedding example, the fixture
examples as pytest files, every ``wasinn run`` of a shell block whose guest and model exist (in a
sandbox with the successor model as ``model.gguf``), the CI page's plain-shell check, the gRPC pair, and
every Python example at least parses with its imports resolving.
"""

from __future__ import annotations

import ast
import importlib
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
from typing import Any

import pytest

from .docs_pages import COMMANDS, PAGES, ROOT, TEXT, blocks, page_id

PYTHON_BLOCKS = [(page_id(p), body) for p in PAGES for lang, body in blocks(p) if lang == "python"]


def by_page(examples: list[tuple[str, str]]) -> list[Any]:
    """Test parameters named page#n (the n-th example of the page) instead of by their code."""
    return [pytest.param(page, code, id=f"{page}#{i}") for i, (page, code) in enumerate(examples)]


SANDBOX_FILES = {"model.gguf", "build/guest.wasm"}  # models/successor.gguf: the CI page writes it


@pytest.mark.parametrize(("page", "code"), by_page(PYTHON_BLOCKS))
def test_python_example_parses_and_its_imports_resolve(page: str, code: str) -> None:
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"{page}: from {node.module} import {missing}: no such name"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


def run(argv: list[str], env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run with this checkout's package first on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, **kwargs)


def test_readme_embedding_example_runs() -> None:
    example = next(code for page, code in PYTHON_BLOCKS if page == "README.md")
    result = run([sys.executable, "-c", example], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["42<|im_end|>", "642<|im_end|>"]


FIXTURE_EXAMPLES = [(page, code) for page, code in PYTHON_BLOCKS if re.match(r"# tests/test_\w+\.py\n", code)]


@pytest.mark.parametrize(("page", "code"), by_page(FIXTURE_EXAMPLES))
def test_fixture_example_passes(page: str, code: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_example.py").write_text(code)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "wasinn_host.pytest_plugin", str(tmp_path / "test_example.py")]
    result = run(argv, cwd=ROOT, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{code.count('def test_')} passed" in result.stdout


def test_embedding_example_script_runs() -> None:
    result = run([sys.executable, str(ROOT / "scripts" / "examples" / "embed_example.py")], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "answer: 42<|im_end|>" in result.stdout
    assert "session answer: '642<|im_end|>'; streamed: 642" in result.stdout


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A directory where the docs' commands run as written: ``wasinn`` on PATH (this checkout),
    ``guest_examples/``, ``model.gguf`` (the successor model) and ``build/guest.wasm`` (complete.wasm)."""
    root = tmp_path_factory.mktemp("docs")
    (root / "bin").mkdir()
    (root / "bin" / "wasinn").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m wasinn_host "$@"\n')
    (root / "bin" / "wasinn").chmod(0o755)
    (root / "guest_examples").symlink_to(ROOT / "guest_examples")
    (root / "build").mkdir()
    (root / "build" / "guest.wasm").write_bytes((ROOT / "guest_examples" / "complete.wasm").read_bytes())
    made = run([str(root / "bin" / "wasinn"), "model", "successor", "model.gguf"], cwd=root)
    assert made.returncode == 0, made.stderr
    return root


def shell(sandbox: pathlib.Path, script: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    path = f"{sandbox / 'bin'}{os.pathsep}{os.environ['PATH']}"
    return run(["bash", "-euo", "pipefail", "-c", script], cwd=sandbox, env={"PATH": path}, **kwargs)


def test_readme_first_command_prints_42(sandbox: pathlib.Path) -> None:
    first = blocks(ROOT / "README.md")[0][1].strip()
    install, _, demo = first.partition(" && ")
    assert install == "python3 -m pip install ."  # the install itself is CI's first step
    result = shell(sandbox, demo)
    assert (result.returncode, result.stdout) == (0, "42\n"), result.stderr


def runnable(command: str) -> bool:
    """A whole ``wasinn run`` line whose files are all here or in the sandbox (not a server's client)."""
    if not command.startswith("wasinn run ") or "--nn-rpc-uri" in command:
        return False
    files = re.findall(r"(?:^|[\s:])([\w./-]+\.(?:wasm|gguf|jpg|png))\b", command)
    return all(f in SANDBOX_FILES or (ROOT / f).is_file() for f in files) and "--dir" not in command


RUNNABLE = sorted({(page, command) for page, command, full in COMMANDS if full and runnable(command)})


def test_the_runnable_commands_are_found() -> None:
    assert len(RUNNABLE) >= 3, RUNNABLE


@pytest.mark.parametrize(("page", "command"), RUNNABLE)
def test_command_runs(page: str, command: str, sandbox: pathlib.Path) -> None:
    result = shell(sandbox, command)
    assert result.returncode == 0, result.stderr


def test_ci_page_plain_shell_check_passes(sandbox: pathlib.Path) -> None:
    """The lines of the CI page's shell block that need no install: write the model, run, compare."""
    block = next(
        body
        for lang, body in blocks(ROOT / "docs/guides/ci.md")
        if lang == "sh" and 'test "$(' in body and "wasinn model successor" in body
    )
    lines = [line for line in block.splitlines() if line.startswith(("wasinn model successor", 'test "$('))]
    assert len(lines) == 2, block
    result = shell(sandbox, "\n".join(lines))
    assert result.returncode == 0, result.stderr


def test_ci_page_tts_shell_check_passes(sandbox: pathlib.Path) -> None:
    """The CI page's text-to-speech check without pytest, whole: write the two models, run the tts guest,
    compare the WAV's size."""
    block = next(body for lang, body in blocks(ROOT / "docs/guides/ci.md") if lang == "sh" and "model tts" in body)
    assert block.count("\n") == 3 and 'test "$(' in block, block
    result = shell(sandbox, block)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (sandbox / "output.wav").stat().st_size == 25_644


def test_grpc_pair_serves_the_guest(sandbox: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The gRPC page's two commands, the socket moved into a temporary directory."""
    block = next(body for lang, body in blocks(ROOT / "docs/guides/grpc.md") if lang == "sh")
    serve, client = (line.replace("/tmp/nn.sock", str(tmp_path / "nn.sock")) for line in block.strip().splitlines())
    assert serve.startswith("wasinn serve ") and client.startswith("wasinn run ")
    serve = serve.replace("model.gguf", str(sandbox / "model.gguf"))
    server = subprocess.Popen(
        [sys.executable, "-m", "wasinn_host", *shlex.split(serve)[1:]],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "nn.sock").exists():
            assert server.poll() is None and time.monotonic() < deadline, "wasinn serve did not start"
            time.sleep(0.1)
        result = shell(sandbox, client)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("fghijklmnopqrstuvwxyz"), result.stdout  # the successor model after 'e'
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_model_list_names_the_fixture_models(sandbox: pathlib.Path) -> None:
    assert "wasinn model --list" in TEXT[ROOT / "docs/guides/ci.md"]
    result = shell(sandbox, "wasinn model --list")
    names = ("successor", "random", "demo", "tts", "vocoder")
    assert result.returncode == 0 and all(m in result.stdout for m in names), result.stderr
