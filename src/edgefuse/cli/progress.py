"""What the command line writes to stderr: one line when each slow step starts, and less library noise.

Exporting, lowering and loading take seconds each on a small CPU; a line per step (with the time since
the command started) shows that the command is alive and where the time goes. Results go to stdout, so
``edgefuse report MODEL --json > report.json`` stays clean.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from typing import TextIO

#: Loggers that warn at import time about things a user of edgefuse cannot act on.
_NOISY_LOGGERS = (
    "torchao",
    "torch.utils._pytree",
    "torch._export",
    "torch.export",
    "torch.fx.experimental.symbolic_shapes",  # dumps the graph when export fails; the error says why
)


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


def quiet_libraries() -> None:
    """Silence import-time warnings of torch, torchao and transformers; call before importing them."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # transformers resets its logger's level
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)


@contextlib.contextmanager
def quiet_torch_logs():
    """Drop what torch's own loggers say while the block runs: a failed export logs the traceback of the
    op that failed and warnings about symbols, a bad ``.pt2`` a traceback; edgefuse's message says why.

    Importing torch sets its loggers' levels itself, undoing :func:`quiet_libraries`, so this sets them
    once torch is imported, on every ``torch`` logger that exists (new ones inherit from ``torch``).
    """
    loggers = [logging.getLogger("torch")] + [
        logger for name, logger in list(logging.root.manager.loggerDict.items())
        if name.startswith("torch.") and isinstance(logger, logging.Logger)
    ]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, before):
            logger.setLevel(level)


@contextlib.contextmanager
def quiet_root_logger(level: int = logging.ERROR):
    """Drop log records below ``level`` while the block runs: ExecuTorch's Qualcomm code logs SDK set-up
    notes and deprecations that say nothing about the user's model.

    Setting the root level is not enough: a module imported inside the block calls
    ``logging.basicConfig(level=INFO)``, and some loggers set their own level; the process-wide
    ``logging.disable`` holds against both, and is restored afterwards.
    """
    root = logging.getLogger()
    before, disabled, handlers = root.level, root.manager.disable, root.handlers[:]
    root.setLevel(max(level, before))
    logging.disable(max(level - 1, disabled))
    try:
        yield
    finally:
        logging.disable(disabled)
        root.setLevel(before)
        root.handlers[:] = handlers  # basicConfig inside the block added its own
