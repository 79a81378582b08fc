"""The README stays true: its commands, every config key, every CLI option, the embedding example."""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

from wasinn_host.cli import build_parser
from wasinn_host.core.config import KEYS

ROOT = pathlib.Path(__file__).resolve().parent.parent

README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command() -> None:
    command = "python3 -m pip install '.[test]' && python3 -m pytest"
    assert command in README
    assert command in (ROOT / ".ci" / "run").read_text()


def test_every_config_key_is_documented() -> None:
    table = {m.group(1) for m in re.finditer(r"^\| `([a-z-]+)` \|", README, re.M)}
    assert set(KEYS) <= table, sorted(set(KEYS) - table)


def test_every_run_option_is_documented() -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = commands.choices["run"]
    options = {s for action in run._actions for s in action.option_strings if s.startswith("--") and s != "--help"}
    missing = {o for o in options if o not in README}
    assert not missing, sorted(missing)


def test_embedding_example_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "examples" / "embed_example.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "answer: 42<|im_end|>" in result.stdout
    assert "session answer: '642<|im_end|>'; streamed: 642" in result.stdout
