"""Less library noise: the warnings torch, torchao and transformers log as they are imported, torch's own
loggers while a block runs, and the root logger below a level. Nothing here prints."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

#: Loggers that warn at import time about things a user of edgefuse cannot act on.
_NOISY_LOGGERS = (
    "torchao",
    "torch.utils._pytree",
    "torch._export",
    "torch.export",
    "torch.fx.experimental.symbolic_shapes",  # dumps the graph when export fails; the error says why
)


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
