"""Kept so that an old import path works: ``--nn-preload`` parsing is :mod:`wasinn_host.core.config.preload`.

The docs once said to import :class:`~wasinn_host.core.config.preload.Preload` from here; its public name
is ``wasinn_host.Preload`` (with ``parse_preload`` and ``PreloadError``).  Nothing in the package imports
this module.
"""

from .config.preload import Preload, PreloadError, parse_preload

__all__ = ["Preload", "PreloadError", "parse_preload"]
