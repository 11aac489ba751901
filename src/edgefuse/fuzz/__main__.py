"""``python -m edgefuse.fuzz``: see :func:`edgefuse.fuzz.cli.main`."""

import sys

from edgefuse.runtime.quiet import quiet_libraries

quiet_libraries()  # before torch and torchao are imported: their import-time warnings are not the fuzzer's

from edgefuse.fuzz.cli import main  # noqa: E402

sys.exit(main())
