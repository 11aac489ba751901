"""What the command line writes to stderr: one line when each slow step starts.

Exporting, lowering and loading take seconds each on a small CPU; a line per step (with the time since
the command started) shows that the command is alive and where the time goes. Results go to stdout, so
``edgefuse report MODEL --json > report.json`` stays clean.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


class Progress:
    """Prints ``[  3.2s] what`` to ``stream`` when a step starts; silent when ``enabled`` is false."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.start = process_start()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, what: str) -> None:
        if self.enabled:
            print(f"[{self.elapsed():6.1f}s] {what}", file=self.stream, flush=True)


def process_start() -> float:
    """The ``time.monotonic()`` at which this process started (Linux), else now.

    Importing torch and ExecuTorch takes seconds before any edgefuse code runs; counting from the
    process start makes the times on the progress lines the times a person waited.
    """
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time
        return time.monotonic() - max(age, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()
