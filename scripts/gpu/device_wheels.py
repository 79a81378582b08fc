#!/usr/bin/env python3
"""The wheels a GPU node without network needs (``scripts/gpu/prepare_device.sh``), resolved for its Python
(3.12), whatever this one has installed.

The requirements are the project's own: ``pyproject.toml``'s dependencies and its ``models`` extra (gguf:
the tests and benchmarks write their models with it), less llama-cpp-python, which the node gets prebuilt
or builds from the sdist, plus that sdist's own requirements (its ``PKG-INFO``).  pip resolves them
together for CPython ``--python-version`` on manylinux x86-64, wheels only, as if nothing were
installed (``pip install --dry-run --report``); the packages the node is expected to have
(``scripts/gpu/device_image.txt``, resolved the same way, with what they need) are left out, and the
rest are downloaded at the versions resolved (``pip download --no-deps``).  So each is the newest
version the project allows that has a wheel for the node and agrees with the others, not the version
that happens to be installed here (orjson 3.8.3 here has no CPython 3.12 wheel).

Usage: ``python3 scripts/gpu/device_wheels.py SDIST WHEEL_DIR [--python-version 3.12]``; prints the
pins it downloaded, one a line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = ROOT / "scripts" / "gpu" / "device_image.txt"
EXTRAS = ("models",)
BUILT_THERE = "llama-cpp-python"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def canonical(name: str) -> str:
    """A distribution name as pip compares them (``Jinja2`` and ``jinja2``, ``typing_extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def name_of(requirement: str) -> str:
    """The canonical name a requirement string starts with."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"device_wheels: cannot read the requirement {requirement!r}")
    return canonical(match[1])


def project_requirements(pyproject: pathlib.Path) -> list[str]:
    """``pyproject.toml``'s dependencies and its :data:`EXTRAS`."""
    try:
        toml: Any = importlib.import_module("tomllib")  # Python 3.11 and later
    except ModuleNotFoundError:
        toml = importlib.import_module("pip._vendor.tomli")  # pip's own copy, on 3.10
    project = toml.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return list(project["dependencies"]) + [r for extra in EXTRAS for r in extras.get(extra, [])]


def sdist_requirements(sdist: pathlib.Path) -> list[str]:
    """The ``Requires-Dist`` lines of the sdist's ``PKG-INFO`` that no extra asks for."""
    with tarfile.open(sdist) as archive:
        top = [m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        member = top[0] if top else None
        handle = archive.extractfile(member) if member is not None else None
        if handle is None:
            raise SystemExit(f"device_wheels: {sdist} has no PKG-INFO")
        text = handle.read().decode()
    found = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in found if "extra" not in r.partition(";")[2]]


def resolve(requirements: list[str], python_version: str) -> dict[str, str]:
    """What pip installs for ``requirements`` on the device: canonical name -> version, all of the tree."""
    with tempfile.TemporaryDirectory(prefix="device-wheels-") as tmp:
        report = pathlib.Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        command += ["--disable-pip-version-check", "--report", str(report), "--target", str(pathlib.Path(tmp) / "t")]
        command += target_options(python_version) + requirements
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not report.exists():
            errors = [line for line in done.stderr.splitlines() if not line.startswith("WARNING: Location")]
            raise SystemExit(
                f"device_wheels: pip cannot resolve {' '.join(requirements)} for CPython {python_version} "
                f"(pip 22.2 or later is needed for --report):\n" + "\n".join(errors[-20:])
            )
        installed = json.loads(report.read_text())["install"]
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in installed}


def target_options(python_version: str) -> list[str]:
    """The options that make pip choose wheels of CPython ``python_version`` on manylinux x86-64."""
    options = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


def image_packages() -> list[str]:
    """The packages :data:`IMAGE` names."""
    lines = (line.split("#", 1)[0].strip() for line in IMAGE.read_text().splitlines())
    return [line for line in lines if line]


def device_pins(sdist: pathlib.Path, python_version: str) -> list[str]:
    """``name==version`` of every package the project needs on the device and its image lacks."""
    wanted = [r for r in project_requirements(ROOT / "pyproject.toml") if name_of(r) != BUILT_THERE]
    wanted += sdist_requirements(sdist)
    resolved = resolve(wanted, python_version)
    image = resolve(image_packages(), python_version)
    return sorted(f"{name}=={version}" for name, version in resolved.items() if name not in image)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", type=pathlib.Path, help="llama-cpp-python's source distribution")
    parser.add_argument("wheels", type=pathlib.Path, help="where the wheels go")
    parser.add_argument("--python-version", default="3.12", help="the device's Python (default 3.12)")
    args = parser.parse_args()
    pins = device_pins(args.sdist, args.python_version)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
    command += target_options(args.python_version) + ["-d", str(args.wheels)] + pins
    subprocess.run(command, check=True)
    print("\n".join(pins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
