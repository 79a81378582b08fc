"""``python -m wasinn_host.cli`` is the ``wasinn`` command (as ``python -m wasinn_host``)."""

import sys

from . import main

sys.exit(main())
