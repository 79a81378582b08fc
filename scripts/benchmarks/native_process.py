"""A benchmark's native llama-cpp-python reference, run in a process of its own: the scripts' name for
:mod:`wasinn_host.bench.reference_process` (whose docstring says why it is a process of its own).

A function given to :func:`native` runs in the child: a module-level function of an importable module
or of the benchmark script itself, its arguments and result picklable (plain values: a class defined
in the script is ``__mp_main__``'s in the child).
"""

from __future__ import annotations

from wasinn_host.bench.reference_process import native

__all__ = ["native"]
