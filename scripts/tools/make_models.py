#!/usr/bin/env python3
"""Write the project's test models: the same as ``wasinn model`` (wasinn_host/cli/model.py), kept for old commands.

Examples::

    python scripts/tools/make_models.py --list
    python scripts/tools/make_models.py successor models/successor.gguf
    python scripts/tools/make_models.py successor models/noisy.gguf --logit-gap 1.0
    python scripts/tools/make_models.py random models/random.gguf --layers 4
"""

from __future__ import annotations

import sys

from wasinn_host.cli import main as wasinn_main


def main(argv: list[str] | None = None) -> int:
    return wasinn_main(["model", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
