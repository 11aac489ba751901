"""What native code writes to standard output while a library loads goes to standard error, so a
command's ``--json`` output stays one JSON document."""

from __future__ import annotations

import subprocess
import sys

WRITES_NATIVELY = """\
import os
from edgefuse.runtime.quiet import stdout_to_stderr
print("before", flush=True)
with stdout_to_stderr():
    os.write(1, b"a note from a native library\\n")
print("after")
"""


def test_native_writes_to_standard_output_go_to_standard_error_and_python_output_stays():
    done = subprocess.run([sys.executable, "-c", WRITES_NATIVELY], capture_output=True, text=True, check=True)
    assert done.stdout == "before\nafter\n"
    assert done.stderr == "a note from a native library\n"
