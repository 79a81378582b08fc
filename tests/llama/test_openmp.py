"""libgomp's wait settings as the host loads llama.cpp (:mod:`wasinn_host.llama.openmp`): what libgomp
itself reports (``omp_display_env``) in a fresh process, and an environment left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, json, os, sys
import wasinn_host.llama.bindings  # loads llama.cpp
paths = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line})
if not paths:
    print(json.dumps({"libgomp": None}))
    sys.exit(0)
sys.stderr.flush()
ctypes.CDLL(paths[0]).omp_display_env(1)  # libgomp's own settings, to stderr
print(json.dumps({"libgomp": paths[0], "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}}))
"""


def probe(**env: str) -> tuple[dict[str, object], str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["libgomp"] is None:
        pytest.skip("this llama-cpp-python build does not use GNU OpenMP (nothing to configure)")
    return report, done.stderr


def test_llama_cpp_loads_libgomp_spinning_at_barriers_and_leaves_the_environment_clean() -> None:
    report, display = probe()
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in display
    assert "GOMP_SPINCOUNT = '300000'" in display  # libgomp's own default spin before sleeping
    assert report["env"] == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}


def test_a_users_own_setting_is_kept() -> None:
    report, display = probe(OMP_WAIT_POLICY="passive")
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in display
    assert "GOMP_SPINCOUNT = '0'" in display  # libgomp's value for passive: nothing of ours added
    assert report["env"] == {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": None}
