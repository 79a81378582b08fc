"""``--nn-prompt-cache DIR`` and ``--nn-prompt-cache-size SIZE`` (``wasinn run`` and ``wasinn serve``)."""

from __future__ import annotations

import argparse
import re

from ..core.prompt_cache.cache import DEFAULT_MAX_BYTES, PromptCache

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``1073741824``, ``512M``, ``2G`` or ``1.5GiB`` to bytes (argparse type)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a size such as 1073741824, 512M or 2G, got {text!r}")
    value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def add_prompt_cache_options(parser: argparse.ArgumentParser) -> None:
    """The two options, in their own group."""
    group = parser.add_argument_group("prompt cache (warm starts across processes)")
    group.add_argument(
        "--nn-prompt-cache",
        metavar="DIR",
        help="keep the KV state of prompt prefixes in DIR, so a later run (another process) with the same "
        "model and prompt start skips decoding them; entries are checked on read, written atomically, "
        "and shared safely by several processes",
    )
    group.add_argument(
        "--nn-prompt-cache-size",
        type=parse_size,
        default=DEFAULT_MAX_BYTES,
        metavar="SIZE",
        help=f"bound of --nn-prompt-cache: the least recently used entries are removed beyond it "
        f"(bytes, or with K/M/G; default: {DEFAULT_MAX_BYTES >> 30}G)",
    )


def prompt_cache_from(ns: argparse.Namespace) -> PromptCache | None:
    """The cache the options name (None without ``--nn-prompt-cache``); OSError if DIR cannot be made."""
    if not ns.nn_prompt_cache:
        return None
    try:
        return PromptCache(ns.nn_prompt_cache, ns.nn_prompt_cache_size)
    except OSError as exc:
        raise OSError(f"--nn-prompt-cache {ns.nn_prompt_cache!r}: {exc.strerror or exc}") from None
