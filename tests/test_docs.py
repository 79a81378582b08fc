"""The README stays true: its commands, every config key, every CLI option, the embedding example."""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

import yaml  # PyYAML, installed with gguf ([test] extra)

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


def test_kubernetes_manifest_runs_a_valid_serve_command() -> None:
    """The example Deployment's arguments parse as ``wasinn serve``, listen where the probes and the
    headless Service point, and carry the token a non-loopback address needs."""
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "wasinn-serve.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    service = next(d for d in docs if d["kind"] == "Service")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["wasinn"]
    ns = build_parser().parse_args(container["args"])
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
    assert "deploy/kubernetes/wasinn-serve.yaml" in README
