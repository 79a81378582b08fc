"""What the docs show, read for tests/test_docs*.py: the pages (README.md and docs/), their fenced blocks,
inline code and shell commands, and checks of a command against the code it names.

Layout-neutral by design: the CLI is reached only through its entry point ``wasinn_host.cli.main`` (its
``--help`` text, and its parser by intercepting ``argparse``'s ``parse_args``) and ``python -m wasinn_host``;
the one other module path used here is the public ``wasinn_host.parse_preload``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import pathlib
import re
import shlex
import subprocess
import sys
from functools import cache
from typing import Any, Iterator
from unittest import mock

import yaml  # PyYAML, installed with gguf ([test] extra)

from wasinn_host import PreloadError, parse_preload
from wasinn_host.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXT = {page: page.read_text() for page in PAGES}
README = TEXT[ROOT / "README.md"]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL_LANGS = {"sh", "bash", "shell", "console"}
COMMAND_WORDS = {"wasinn", "python", "python3", "pytest", "pip", "mkdocs"}
SHELL_WORDS = {"echo", "test", ".", "cd", "make"}  # make: the user's own build, in the CI example
PYTHON_MODULES = {"pip", "pytest", "venv", "ruff", "mypy", "mkdocs", "wasinn_host"}
PYPROJECT = (ROOT / "pyproject.toml").read_text()
EXTRAS = set(re.findall(r"^([\w-]+) = \[", PYPROJECT.split("[project.optional-dependencies]")[1].split("\n[")[0], re.M))
SHELL_SEPARATORS = {"&&", "||", "|", ";"}


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: pathlib.Path) -> list[tuple[str, str]]:
    """The page's fenced blocks as (language, body), snippet includes (``--8<-- "path"``) expanded."""
    include = re.compile(r'^--8<-- "([^"]+)"$', re.M)
    return [(m[1], include.sub(lambda s: (ROOT / s[1]).read_text(), m[2])) for m in FENCE.finditer(TEXT[page])]


def code_spans(page: pathlib.Path) -> list[str]:
    """The page's inline code, outside fenced blocks (a span may wrap across lines)."""
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", FENCE.sub("", TEXT[page]))]


# ---------------------------------------------------------------- the CLI, through its entry point only


@cache
def cli_help(*command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*command, "--help"])
    return out.getvalue()


@cache
def cli_options(*command: str) -> frozenset[str]:
    """Options of ``wasinn COMMAND``, read from its ``--help`` (option lines start with two spaces)."""
    options = re.findall(r"^  (?:-\w, )?(--[a-z0-9][a-z0-9-]*)", cli_help(*command), re.M)
    return frozenset(options) - {"--help"}


def cli_subcommands(*command: str) -> list[str]:
    """The subcommands ``wasinn COMMAND --help`` lists (four spaces in, under its positional arguments)."""
    return re.findall(r"^    ([a-z][a-z-]*)(?:\s|$)", cli_help(*command), re.M)


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """What ``wasinn ARGV`` parses to, without running it: ``main``'s own parser, stopped after parsing."""

    class Parsed(Exception):
        pass

    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        raise Parsed(original(self, args, namespace))

    err = io.StringIO()
    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except Parsed as parsed:
            return parsed.args[0]
        except SystemExit:
            pass
    raise AssertionError(f"wasinn {shlex.join(argv)}: {err.getvalue().strip()}")


# ---------------------------------------------------------------- commands shown in the docs


PREFIX = re.compile(r"^(?:RUN\s+(?:--\S+\s+)*)?(?:[A-Z_]+=\S*\s+)*")  # a Dockerfile's RUN, env assignments


def looks_like_command(line: str) -> bool:
    words = PREFIX.sub("", line).split()
    return bool(words) and words[0] in COMMAND_WORDS | SHELL_WORDS


def shell_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of one shell line (``a && b | c``), without env assignments; a command
    substitution's command too (``test "$(wasinn run ...)" = ...``)."""
    command: list[str] = []
    for token in [*shlex.split(PREFIX.sub("", line), comments=True), ";"]:
        if token not in SHELL_SEPARATORS:
            command.append(token)
            continue
        while command and re.fullmatch(r"[A-Z_]+=\S*", command[0]):
            command.pop(0)
        if command:
            yield command
            for inner in re.findall(r"\$\((.*)\)", " ".join(command)):
                yield from shell_commands(inner)
        command = []


def doc_commands() -> Iterator[tuple[str, list[str], bool]]:
    """(page, command, full) for every command shown: ``full`` for a line of a shell block or a
    workflow's ``run:`` step, which must parse whole; else a synopsis (``[--opt X]``) or inline code
    naming a command and options, whose options must exist."""
    for page in PAGES:
        for lang, body in blocks(page):
            lines = re.sub(r"\\\n\s*", " ", body).splitlines()
            if lang == "yaml":
                lines = [step["run"] for doc in yaml.safe_load_all(body) for step in workflow_steps(doc)]
            elif lang not in SHELL_LANGS | {"text", ""}:
                continue
            for line in filter(looks_like_command, lines):
                full = lang in SHELL_LANGS | {"yaml"} and not re.search(r"\s\[", line)
                for command in shell_commands(line if full else unbracket(line)):
                    yield page_id(page), command, full
        for span in filter(looks_like_command, code_spans(page)):
            for command in shell_commands(unbracket(span)):
                if command[0] in COMMAND_WORDS:
                    yield page_id(page), command, False


def unbracket(synopsis: str) -> str:
    """``wasinn run [--dir DIR]... M.wasm`` -> ``wasinn run  --dir DIR  M.wasm``: its options, to check."""
    return re.sub(r"(?<=\s)\[|\](?=\s|$|\.)|\.\.\.", " ", synopsis)


def workflow_steps(doc: Any) -> list[dict[str, Any]]:
    if not isinstance(doc, dict) or "jobs" not in doc:
        return []
    return [step for job in doc["jobs"].values() for step in job["steps"] if "run" in step]


def check_wasinn(argv: list[str], full: bool) -> None:
    """Each option exists for its command (``wasinn model successor`` is one); a full command parses."""
    command = [a for a in argv[:2] if re.fullmatch(r"[a-z][a-z-]*", a)]
    if command:
        assert command[0] in cli_subcommands(), f"no command wasinn {command[0]}"
        command = command[: 2 if command[0] == "model" and command[1:] else 1]
    module = next((i for i, a in enumerate(argv) if a.endswith(".wasm")), len(argv))  # the guest's own args follow
    known = cli_options(*command) | {"--help", "--version"}
    for option in (a.split("=")[0] for a in argv[:module] if a.startswith("--")):
        prefix = option.endswith("-") and any(k.startswith(option) for k in known)  # --max-...
        assert option in known or prefix, f"wasinn {' '.join(command)} has no option {option}"
    if full and command and argv[-1] != "--help":
        ns = vars(parse_cli(argv))
        for spec in ns.get("nn_preload") or []:
            try:
                parse_preload(spec)
            except PreloadError as error:
                raise AssertionError(f"--nn-preload {spec}: {error}") from error


def script_options(path: pathlib.Path) -> set[str]:
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    return {
        a.value
        for c in calls
        for a in c.args
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")
    }


def check_pip(args: list[str]) -> None:
    pins = dict(re.findall(r'^    "([\w-]+)([<>=][^"]*)",$', PYPROJECT, re.M))
    for arg in (a for a in args if not a.startswith("-")):
        if m := re.fullmatch(r"(?:\.|wasinn-host)\[([\w,-]+)\]", arg):
            assert set(m[1].split(",")) <= EXTRAS, f"{arg}: pyproject.toml has extras {sorted(EXTRAS)}"
        elif m := re.fullmatch(r"([\w-]+)==([\w.]+)", arg):
            pin = pins.get(m[1])
            assert pin is None or pin.startswith(f">={m[2]},"), f"{arg}: pyproject.toml pins {pin}"


@cache
def pytest_help() -> str:
    run = [sys.executable, "-m", "pytest", "--help", "-p", "wasinn_host.pytest_plugin"]
    return subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=120).stdout


def check_command(command: list[str], full: bool) -> None:
    word, args = command[0], command[1:]
    if word in ("python", "python3"):
        if args[0] == "-m":
            assert args[1] in PYTHON_MODULES, f"python -m {args[1]}: not a module the docs may run"
            word, args = args[1], args[2:]
            word = "wasinn" if word == "wasinn_host" else word
        else:
            script = ROOT / args[0]
            assert script.is_file(), f"no script {args[0]}"
            unknown = {a.split("=")[0] for a in args if a.startswith("--")} - script_options(script)
            assert not unknown, f"{args[0]} has no option {sorted(unknown)}"
            return
    if word == "wasinn":
        check_wasinn(args, full)
    elif word == "pip":
        check_pip(args[1:])
    elif word == "pytest":
        for arg in args:
            if arg.startswith("-") and not arg.startswith("-k"):
                assert arg.split("=")[0] in pytest_help(), f"pytest has no option {arg}"
            elif "/" in arg and "=" not in arg:
                assert (ROOT / arg).exists(), f"pytest {arg}: no such path"
    elif word == "mkdocs":
        assert args[0] in ("build", "serve") and (ROOT / "mkdocs.yml").is_file()


COMMANDS = sorted({(page, shlex.join(command), full) for page, command, full in doc_commands()})
"""(page, command, full) for every command the docs show, each once per page."""
