"""``python -m edgefuse.fuzz``: see :func:`edgefuse.fuzz.cli.main`."""

import sys

from edgefuse.fuzz.cli import main

sys.exit(main())
