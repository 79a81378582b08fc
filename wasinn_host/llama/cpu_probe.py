"""Make sure llama.cpp's extra CPU weight layouts work on this machine before a model's weights go into them.

On some machines one of llama.cpp's extra CPU layouts (:mod:`.cpu_buffers`) kills the whole process at the
first batched decode of a quantized model, with nothing for a Python ``try`` to catch: its AMX layout on
Intel Xeons with AMX (SIGILL at ``tilezero`` inside ``ggml_backend_amx_mul_mat``, or SIGSEGV, on an OpenMP
worker thread).  The AMX layout also holds F16 weights (an AVX-512 path of the same function), which died
of a general protection fault there too, at 64 sequences of 2,048 cells.  So before the first model of a
process with weights other than F32 loads, the host finds out, once per llama.cpp build and CPU, in child
processes:

1. ``python -m wasinn_host.llama.cpu_probe`` quantizes the embedded demo model to Q4_0 (a type every layout
   takes), loads it with the layouts as they are, decodes a 32-token batch on all cores and compares the
   logits with the same model loaded without extra layouts; then the same with the demo model as it is
   (F16).  A child that dies, hangs, fails or computes other logits is a failed probe.
2. If it failed, each layout is tried turned off alone, in llama.cpp's order (AMX first); the first that
   passes is the verdict.  If none does, every extra layout is turned off (llama.cpp's
   ``use_extra_bufts = False``).
3. The verdict is kept in ``<cache dir>/cpu-probe/<key>.json``, the key being the llama-cpp-python version,
   its libraries (name, size, modification time), the CPU's model name and flags: a new build or another
   CPU probes again.  The layouts it names are taken out of the process's list (:func:`.cpu_buffers.disable`)
   and one log line says what and why (a warning when the probe has just run, info when read back).

``WASINN_AMX`` forces the choice: ``off`` turns the AMX layout off without probing, ``on`` keeps every layout
without probing, ``auto`` (the default) probes.  Models whose weights are all F32 never need the probe, nor
F16 and BF16 ones where the build has no AMX layout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..core.cache_dir import default_cache_dir
from ..core.errors import invalid

log = logging.getLogger("wasinn_host")

POLICY_ENV = "WASINN_AMX"
POLICIES = ("auto", "on", "off")
PROBE_VERSION = 2
"""Part of the verdict's key: a change to what the probe checks probes again."""
PROBE_TIMEOUT_S = 120
PROBE_TOKENS = 32
MIN_COSINE = 0.99
"""How alike the last row's logits must be, with and without the extra layouts (same quantized weights)."""
F32_TYPES = frozenset({0})  # GGML_TYPE_F32: no extra layout holds it
FLOAT_TYPES = frozenset({1, 30})  # GGML_TYPE_F16, BF16: only AMX's layout holds them


@dataclass(frozen=True)
class Trial:
    """One probe child: the layouts it ran without, and what became of it."""

    without: tuple[str, ...]
    outcome: str
    """``ok``, or why not: ``died of SIGILL``, ``timed out after 120 s``, ``logits differ (cosine 0.41)`` ..."""

    @property
    def ok(self) -> bool:
        """The child decoded and its logits matched."""
        return self.outcome == "ok"


@dataclass(frozen=True)
class Verdict:
    """Which extra CPU layouts the process turns off, and why."""

    disabled: tuple[str, ...]
    reason: str
    source: str
    """``probe`` (just run), ``cache`` (a verdict file read back), ``forced`` (``WASINN_AMX``) or ``none``."""
    available: tuple[str, ...] = ()
    trials: tuple[Trial, ...] = field(default=())
    file: str = ""
    """The verdict file, where one was read or written."""

    def as_json(self) -> dict[str, object]:
        """The verdict as ``wasinn info --json`` shows it."""
        out = asdict(self)
        out["trials"] = [{"without": list(t.without), "outcome": t.outcome} for t in self.trials]
        out["disabled"], out["available"] = list(self.disabled), list(self.available)
        return out


Runner = Callable[[tuple[str, ...]], str]
"""Runs one probe child without the named layouts and returns its outcome (``ok`` or why not)."""


def policy() -> str:
    """``WASINN_AMX`` (``auto`` when unset); any other value is an invalid argument."""
    value = os.environ.get(POLICY_ENV, "auto").strip().lower() or "auto"
    if value not in POLICIES:
        raise invalid(f"{POLICY_ENV}={os.environ.get(POLICY_ENV)!r}: expected one of {', '.join(POLICIES)}")
    return value


def decide(policy_name: str, available: list[str], cache_file: Path | None, runner: Runner) -> Verdict:
    """The verdict for a process whose CPU backend has the ``available`` layouts (see the module docstring)."""
    names = tuple(available)
    if not names:
        return Verdict((), "this llama.cpp build has no extra CPU layouts", "none", names)
    if policy_name == "off":
        off = tuple(n for n in names if n == "AMX")
        return Verdict(off, f"{POLICY_ENV}=off", "forced", names)
    if policy_name == "on":
        return Verdict((), f"{POLICY_ENV}=on: every layout kept, not probed", "forced", names)
    cached = _read(cache_file, names) if cache_file is not None else None
    if cached is not None:
        return cached
    trials = [Trial((), runner(()))]
    if not trials[0].ok:
        for name in names:
            trials.append(Trial((name,), runner((name,))))
            if trials[-1].ok:
                break
    verdict = Verdict(_disabled(trials, names), _reason(trials), "probe", names, tuple(trials))
    if cache_file is not None:
        verdict = _write(cache_file, verdict)
    return verdict


def _disabled(trials: list[Trial], names: tuple[str, ...]) -> tuple[str, ...]:
    passed = [t for t in trials if t.ok]
    return passed[0].without if passed else names


def _reason(trials: list[Trial]) -> str:
    first = trials[0]
    if first.ok:
        return "the probe's decode ran and matched with every layout"
    passed = [t for t in trials if t.ok]
    if passed:
        return f"the probe's decode {first.outcome} with {', '.join(passed[0].without)} and ran without it"
    return f"the probe's decode {first.outcome}, and without each layout alone too: every extra layout is off"


def _read(path: Path, names: tuple[str, ...]) -> Verdict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        disabled = tuple(str(n) for n in data["disabled"])
        trials = tuple(Trial(tuple(str(n) for n in t["without"]), str(t["outcome"])) for t in data["trials"])
        reason = str(data["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: probe again (and overwrite it)
    if not set(disabled) <= set(names):
        return None
    return Verdict(disabled, reason, "cache", names, trials, str(path))


def _write(path: Path, verdict: Verdict) -> Verdict:
    written = Verdict(verdict.disabled, verdict.reason, verdict.source, verdict.available, verdict.trials, str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".probe-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(written.as_json(), out, indent=2)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home: the verdict holds for this process only
        log.info("CPU probe: cannot keep the verdict in %s (%s)", path, exc)
        return verdict
    return written


def machine_key(libraries: Path) -> str:
    """The verdict's key: the probe's version, llama.cpp's libraries in ``libraries`` and this CPU."""
    parts = [f"probe {PROBE_VERSION}", platform.machine()]
    try:
        for lib in sorted(libraries.iterdir()):
            stat = lib.stat()
            parts.append(f"{lib.name} {stat.st_size} {stat.st_mtime_ns}")
    except OSError:
        parts.append(f"libraries {libraries}")
    parts += _cpu_lines()
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cpu_lines() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return [platform.processor()]
    wanted = ("model name", "flags", "Features", "CPU part")
    return sorted({line.strip() for line in lines if line.split(":")[0].strip() in wanted})


def run_child(without: tuple[str, ...]) -> str:
    """Run the probe in a child process without the named layouts; its outcome."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    command = [sys.executable, "-m", "wasinn_host.llama.cpu_probe", *without]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {PROBE_TIMEOUT_S} s"
    return child_outcome(proc.returncode, proc.stdout + proc.stderr)


def child_outcome(returncode: int, output: str) -> str:
    """What a probe child's exit status and output say."""
    if returncode == 0:
        return "ok"
    if returncode < 0:
        try:
            return f"died of {signal.Signals(-returncode).name}"
        except ValueError:
            return f"died of signal {-returncode}"
    last = output.strip().splitlines()[-1:] or [f"exit status {returncode}"]
    return f"failed ({last[0][:200]})"


_lock = threading.Lock()
_verdict: Verdict | None = None


def current(runner: Runner = run_child) -> Verdict:
    """The verdict of this process, decided (and applied) on the first call."""
    global _verdict
    with _lock:
        if _verdict is None:
            _verdict = _decide_now(runner)
        return _verdict


def _decide_now(runner: Runner) -> Verdict:
    from . import cpu_buffers
    from .bindings import llama_cpp

    chosen = policy()
    libraries = Path(llama_cpp.__file__).parent / "lib"
    cache_file = default_cache_dir() / "cpu-probe" / f"{machine_key(libraries)}.json"
    verdict = decide(chosen, cpu_buffers.available(), cache_file, runner)
    if verdict.disabled:
        cpu_buffers.disable(verdict.disabled)
        level = logging.WARNING if verdict.source == "probe" else logging.INFO
        log.log(level, "llama.cpp's %s CPU layout is off: %s", " and ".join(verdict.disabled), verdict.reason)
    return verdict


def needs_probe(weight_types: frozenset[int], layouts: list[str] | None = None) -> bool:
    """Whether weights of these ggml types can go into one of the extra CPU ``layouts`` (default: the build's):
    quantized weights into any, F16 and BF16 only into AMX's."""
    if weight_types - F32_TYPES - FLOAT_TYPES:
        return True
    if not weight_types & FLOAT_TYPES:
        return False
    from . import cpu_buffers

    return "AMX" in (cpu_buffers.available() if layouts is None else layouts)


def prepare(weight_types: frozenset[int]) -> None:
    """Before a model with weights of ``weight_types`` loads: decide and apply the verdict if it matters."""
    if needs_probe(weight_types):
        current()


def prepare_for_file(path: str | os.PathLike[str]) -> None:
    """:func:`prepare` for the GGUF file at ``path`` (nothing for a file whose header cannot be read: llama.cpp
    refuses it too).  For code that loads models through llama-cpp-python itself (native references)."""
    from ..core.errors import WasiNNError
    from . import devices
    from .gguf_layout import read_layout

    try:
        layout = read_layout(Path(path), devices.type_size)
    except WasiNNError:
        return
    prepare(layout.weight_types)


def _probe_main(without: list[str]) -> int:
    """The child: quantize the demo model, decode a batch with and without the extra layouts, compare."""
    import ctypes

    import numpy as np

    from ..models import DEMO_MODEL_PATH
    from . import cpu_buffers
    from .bindings import llama_cpp
    from .log import init_backend

    init_backend()
    cpu_buffers.disable(without)
    with tempfile.TemporaryDirectory(prefix="wasinn-probe-") as tmp:
        quantized = os.path.join(tmp, "probe-q4_0.gguf")
        qparams = llama_cpp.llama_model_quantize_default_params()
        qparams.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        if llama_cpp.llama_model_quantize(str(DEMO_MODEL_PATH).encode(), quantized.encode(), ctypes.byref(qparams)):
            print("cannot quantize the probe model")
            return 2
        cosines = []
        for name, path in (("Q4_0", quantized), ("F16", str(DEMO_MODEL_PATH))):
            rows = [_decode(llama_cpp, path, extra) for extra in (True, False)]
            if any(row is None for row in rows):
                print(f"cannot load the {name} probe model")
                return 2
            a, b = (np.asarray(row, dtype=np.float64) for row in rows)
            cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))
            if cosine < MIN_COSINE or int(a.argmax()) != int(b.argmax()):
                print(f"{name} logits differ (cosine {cosine:.3f})")
                return 3
            cosines.append(f"{name} cosine {cosine:.5f}")
    print(f"ok ({', '.join(cosines)})")
    return 0


def _decode(lc: Any, path: str, extra: bool) -> list[float] | None:
    """Load ``path`` on the CPU (with or without the extra layouts), decode one batch, the last row's logits."""
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.use_extra_bufts = extra
    model = lc.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        return None
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 2 * PROBE_TOKENS
    cparams.n_threads = cparams.n_threads_batch = _cores()  # all of them: the crash was on a worker thread
    ctx = lc.llama_init_from_model(model, cparams)
    batch = lc.llama_batch_init(PROBE_TOKENS, 0, 1)
    try:
        n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        for i in range(PROBE_TOKENS):
            batch.token[i] = 3 + (7 * i) % (n_vocab - 3)
            batch.pos[i], batch.n_seq_id[i], batch.logits[i] = i, 1, i == PROBE_TOKENS - 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = PROBE_TOKENS
        if lc.llama_decode(ctx, batch) != 0:
            return None
        logits = lc.llama_get_logits_ith(ctx, PROBE_TOKENS - 1)
        return [float(logits[i]) for i in range(n_vocab)]
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
