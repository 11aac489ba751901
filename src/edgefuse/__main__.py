"""``python -m edgefuse``: the same command line as the ``edgefuse`` console script."""

from edgefuse.cli import main

raise SystemExit(main())
