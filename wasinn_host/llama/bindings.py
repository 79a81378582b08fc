"""llama-cpp-python's low-level bindings, without the high-level half its package imports first.

``import llama_cpp`` runs the package's ``__init__``: ``from .llama_cpp import *`` (the ctypes bindings
this host uses) and then ``from .llama import *`` (the ``Llama`` class, its chat formats, numpy and
Jinja), which takes several times as long as the bindings and is most of a short ``wasinn run``.

:data:`llama_cpp` is the package with only its first half done: the package module is registered,
``llama_cpp.llama_cpp`` is imported and its names are copied in, as the ``__init__`` would.  A name the
bindings do not define (``llama_cpp.Llama``) makes the package run its own ``__init__`` then, so code
that imports ``llama_cpp`` later gets the whole package, a little later; a submodule
(``from llama_cpp import mtmd_cpp``) is imported on its own.  If ``llama_cpp`` was imported before
this module, it is used as it is.  Loading it sets how OpenMP's threads wait first (:mod:`.openmp`).

Every module of the core that touches llama.cpp imports it from here, first.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import re
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from . import openmp

_lock = threading.RLock()


def _version(init_file: str | None) -> str:
    """``__version__`` as the package's ``__init__`` sets it (read from its text, not run)."""
    try:
        with open(init_file or "", encoding="utf-8") as handle:
            match = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", handle.read(), re.M)
    except OSError:
        match = None
    return match.group(1) if match else "unknown"


def _complete(package: ModuleType, name: str) -> object:
    """PEP 562 ``__getattr__`` of the half-initialised package: a submodule is imported alone; any
    other public name runs the package's own ``__init__`` (once) and is looked up again."""
    if name.startswith("__"):
        raise AttributeError(name)
    if importlib.util.find_spec(f"llama_cpp.{name}") is not None:
        return importlib.import_module(f"llama_cpp.{name}")
    with _lock:
        if "__getattr__" in vars(package):
            del package.__getattr__
            spec = package.__spec__
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(package)
    return getattr(package, name)


def _load() -> ModuleType:
    with _lock:
        loaded = sys.modules.get("llama_cpp")
        if loaded is not None:
            return loaded
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            with openmp.configure():
                return importlib.import_module("llama_cpp")  # not a package as expected: the plain import
        package = importlib.util.module_from_spec(spec)
        sys.modules["llama_cpp"] = package
        try:
            with openmp.configure():  # libgomp reads its settings when llama.cpp's libraries load it
                bindings = importlib.import_module("llama_cpp.llama_cpp")
        except BaseException:
            del sys.modules["llama_cpp"]
            raise
        names = getattr(bindings, "__all__", None) or [n for n in vars(bindings) if not n.startswith("_")]
        package.__dict__.update({n: getattr(bindings, n) for n in names})  # ``from .llama_cpp import *``
        package.__dict__["__version__"] = _version(spec.origin)
        package.__dict__["__getattr__"] = lambda name: _complete(package, name)
        return package


if TYPE_CHECKING:
    import llama_cpp
    from llama_cpp import mtmd_cpp
else:
    llama_cpp = _load()
    """The ``llama_cpp`` package, its bindings loaded (see the module docstring)."""
    mtmd_cpp = importlib.import_module("llama_cpp.mtmd_cpp")
    """libmtmd's bindings (images)."""


def ggml_library(name: str) -> ctypes.CDLL:
    """One of the ggml libraries llama-cpp-python ships beside libllama (``libggml.so``,
    ``libggml-base.so``), for the few ggml functions its bindings do not wrap (the loaded copy: the
    dynamic loader returns the library libllama already loaded)."""
    return ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", name))
