"""The docs stay true: every command shown in README.md and docs/ is checked against the code it names,
the command-line and configuration-key tables match ``wasinn COMMAND --help`` and the config parser both
ways, and every link, file path and module name the pages give exists.  Running the examples:
test_docs_examples.py.  Module paths used: ``wasinn_host.core.config.keys`` (``KEYS``),
``wasinn_host.testing.guest_harness`` (``RunGuest``, ``GuestResult``), the public ``wasinn_host.Limits``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pathlib
import re
import shlex
import subprocess
import sys
from typing import Any

import pytest
import yaml

from wasinn_host import Limits
from wasinn_host.core.config.keys import KEYS
from wasinn_host.testing.guest_harness import GuestResult, RunGuest

from .docs_pages import (
    COMMANDS,
    FENCE,
    PAGES,
    README,
    ROOT,
    TEXT,
    check_command,
    cli_options,
    cli_subcommands,
    code_spans,
    page_id,
    parse_cli,
)


def test_ci_runs_the_readme_test_command() -> None:
    command = "python3 -m pip install '.[test]' && python3 -m pytest"
    assert command in README
    assert command in (ROOT / ".ci" / "run").read_text()


def test_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= 200


# ---------------------------------------------------------------- commands


def test_the_docs_show_commands_and_each_is_recognised() -> None:
    assert len(COMMANDS) > 60, COMMANDS  # a broken extraction would check nothing
    shown = {command for _, command, _ in COMMANDS}
    for expected in ("wasinn info --json", "wasinn model --list", "python3 -m pytest"):
        assert expected in shown


@pytest.mark.parametrize(("page", "command", "full"), COMMANDS)
def test_command_is_valid(page: str, command: str, full: bool) -> None:
    check_command(shlex.split(command), full)


@pytest.mark.parametrize(
    ("bad", "full"),
    [
        ("wasinn run --no-such-option x.wasm", False),
        ("wasinn run", True),
        ("wasinn run --nn-preload default:GGML x.wasm", True),
        ("wasinn model successor --embd 4 m.gguf", False),
        ("wasinn frobnicate", False),
        ("python scripts/benchmarks/bench_nothing.py", False),
        ("python scripts/benchmarks/bench_host.py --no-such-flag", False),
        ("python3 -m pip install '.[no-such-extra]'", False),
        ("pip install llama-cpp-python==0.1.0", False),
        ("python3 -m pytest --no-such-option", False),
        ("python3 -m pytest tests/no_such_dir", False),
    ],
)
def test_a_wrong_command_fails_the_check(bad: str, full: bool) -> None:
    with pytest.raises(AssertionError):
        check_command(shlex.split(bad), full)


# ---------------------------------------------------------------- tables against the code, both ways


def sections(page: str) -> dict[str, str]:
    """Heading -> the text up to the next heading."""
    parts = re.split(r"^#+ (.*)$", TEXT[ROOT / page], flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def first_cells(text: str) -> list[str]:
    return re.findall(r"^\| (.+?) \|", text, re.M)


def test_cli_reference_lists_every_option_of_every_command() -> None:
    commands = [[c] for c in cli_subcommands()] + [["model", m] for m in cli_subcommands("model")]
    names = {" ".join(c) for c in commands}
    assert names == {
        "run",
        "serve",
        "info",
        "model",
        "model successor",
        "model random",
        "model demo",
        "model tts",
        "model vocoder",
        "bench",
    }
    pages = sections("docs/reference/cli.md")
    for command in commands:
        text = pages[f"`wasinn {' '.join(command)}`"]
        table = {o for cell in first_cells(text) for o in re.findall(r"--[a-z0-9][a-z0-9-]*", cell)}
        assert table == cli_options(*command), (command, sorted(table ^ cli_options(*command)))


def test_every_config_key_is_in_the_key_table_with_its_type_and_scope() -> None:
    row = re.compile(r"^\| `([a-z-]+)` \| ([^|]+) \| [^|]* \| (load|context) \|", re.M)
    documented = {
        key: (kind.strip(), scope) for key, kind, scope in row.findall(TEXT[ROOT / "docs/reference/config-keys.md"])
    }
    assert set(documented) == set(KEYS), sorted(set(documented) ^ set(KEYS))
    words = {
        int: "int",
        float: "number",
        bool: "bool",
        str: "string",
        list: "array",
        dict: "object",
        object: "bool or string",
    }
    for key, spec in KEYS.items():
        kind, scope = documented[key]
        assert kind.startswith(words[spec.kind]), (key, kind, spec.kind)
        assert scope == ("load" if spec.record in ("model", "logging") else "context"), (key, scope, spec.record)


def test_every_limit_is_in_the_security_table() -> None:
    table = {cell.split()[0].strip("`") for cell in first_cells(TEXT[ROOT / "docs/guides/security.md"])} - {"limit"}
    fields = {f.name for f in dataclasses.fields(Limits)} - {"allow_load_bytes"}  # --no-load-bytes, in the text
    assert table == fields, sorted(table ^ fields)


def test_fixture_signature_and_result_are_documented() -> None:
    parts: list[str] = []
    for p in list(inspect.signature(RunGuest.__call__).parameters.values())[1:]:
        if p.kind is p.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        default = (
            ""
            if p.default is p.empty
            else "=" + (json.dumps(p.default) if isinstance(p.default, str) else repr(p.default))
        )
        parts.append(("**" if p.kind is p.VAR_KEYWORD else "") + p.name + default)
    ci = TEXT[ROOT / "docs/guides/ci.md"]
    assert f"`wasinn_run({', '.join(parts)})`" in ci
    result = ci[ci.index("The result has") :].split("\n\n")[0]
    assert all(f"`{f.name}`" in result for f in dataclasses.fields(GuestResult))


def test_wasinn_info_json_keys_are_documented() -> None:
    argv = [sys.executable, "-m", "wasinn_host", "info", "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    gpu = TEXT[ROOT / "docs/guides/gpu.md"]
    paragraph = gpu[gpu.index("`wasinn info --json` prints") :].split("\n\n")[0]
    assert set(json.loads(out.stdout)) - {"gpu_hint"} <= set(re.findall(r"`([a-z_]+)`", paragraph))


def test_kubernetes_manifest_runs_a_valid_serve_command() -> None:
    """The example Deployment's arguments parse as ``wasinn serve``, listen where the probes and the
    headless Service point, and carry the token a non-loopback address needs."""
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "wasinn-serve.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    service = next(d for d in docs if d["kind"] == "Service")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["wasinn"]
    ns = parse_cli(container["args"])
    assert ns.command == "serve"
    port = int(ns.nn_rpc_uri.rpartition(":")[2])
    assert container["readinessProbe"]["grpc"]["port"] == port == service["spec"]["ports"][0]["port"]
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS record per pod
    assert any(e["name"] == "WASINN_RPC_TOKEN" for e in container["env"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > ns.drain_seconds
    metrics = {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert ns.metrics_port == metrics == int(annotations["prometheus.io/port"]) and ns.metrics_address == "0.0.0.0"
    assert '--8<-- "deploy/kubernetes/wasinn-serve.yaml"' in TEXT[ROOT / "docs/guides/grpc.md"]


# ---------------------------------------------------------------- links, paths and module names


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", re.sub(r"<[^>]+>|`", "", heading)).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_point_at_existing_files_and_headings(page: pathlib.Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", TEXT[page])):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page_id(page)}: link {target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", FENCE.sub("", file.read_text()), re.M)
            assert anchor in {slug(h) for h in headings}, f"{page_id(page)}: link {target}: no such heading"


PACKAGES = "core|backend|ephemeral|wit|rpc|sockets|testing|observability|models|cli|launch|guest|llama"
PATH_SPAN = re.compile(
    rf"((?:wasinn_host/)?(?:{PACKAGES})/[\w./-]*|(?:tests|scripts|guest_examples|deploy|\.ci)/[\w./-]*)"
)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_files_and_modules_named_in_the_docs_exist(page: pathlib.Path) -> None:
    """A code span that is a file path (``core/config/keys.py``, ``tests/test_x.py``) or a dotted name of the
    package (``wasinn_host.x.y``) names something that exists; fenced blocks (the layout tree) are left out."""
    for span in code_spans(page):
        span = re.sub(r"\(.*\)$", "", span)  # real_model_path("smollm2")
        if PATH_SPAN.fullmatch(span):
            candidates = [ROOT / span, ROOT / "wasinn_host" / span.removeprefix("wasinn_host/")]
            assert any(c.exists() for c in candidates), f"{page_id(page)}: `{span}` does not exist"
        elif re.fullmatch(r"wasinn_host(\.\w+)+", span):
            assert resolves(span), f"{page_id(page)}: `{span}` is neither a module nor a name in one"


def resolves(dotted: str) -> bool:
    if dotted.startswith("wasinn_host.rpc.v1."):  # the gRPC service of rpc/protos/, not a Python name
        protos = "".join(p.read_text() for p in (ROOT / "wasinn_host/rpc/protos").glob("*.proto"))
        return "package wasinn_host.rpc.v1;" in protos and f"service {dotted.rsplit('.', 1)[1]} " in protos
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False
