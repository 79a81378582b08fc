"""The prompt cache: prompt prefixes' KV state kept in a directory, for warm starts across processes.

:mod:`.cache` holds :class:`~wasinn_host.core.prompt_cache.cache.PromptCache` (one directory, its writer
and eviction) and each model's :class:`~wasinn_host.core.prompt_cache.cache.ModelPromptCache`;
:mod:`.entry` is one entry's file (its layout, reading and verifying it).  The worker's use of the
cache (prefetch, restore, save) is :mod:`wasinn_host.core.scheduling.prompt_cache_use`.  Imports no
other room.

``PromptCache`` is re-exported here because the docs once named this path as its module; its public
name is ``wasinn_host.PromptCache``.
"""

from .cache import PromptCache

__all__ = ["PromptCache"]
