"""``python -m wasinn_host`` is the ``wasinn`` command."""

import sys

from .cli import main

sys.exit(main())
