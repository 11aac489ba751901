"""What the command line writes to stderr: one line when each slow step starts.

Exporting, lowering and loading take seconds each on a small CPU; a line per step (with the time since
the command started) shows that the command is alive and where the time goes. Results go to stdout, so
``edgefuse report MODEL --json > report.json`` stays clean.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import threading
import time
from types import ModuleType
from typing import Callable, Sequence, TextIO

#: The libraries a command waits for: importing them takes seconds warm, a minute or two cold.
LIBRARIES = ("torch", "executorch.exir", "executorch.runtime")

#: The packages whose loading a person waits for, by top-level name: any of their modules still being
#: imported (``transformers.*``, ``torch.distributed.tensor``, ``executorch.exir.*`` long after ``torch``
#: itself has loaded) is loading still.
PACKAGES = ("torch", "executorch", "transformers")

#: After this many seconds still loading :data:`LIBRARIES`, a command says that a first run takes a while.
SLOW_LOADING_SECONDS = 5.0

#: What a person waits for, said when the loading is slow.
SLOW_LOADING = ("still loading torch and ExecuTorch: the first run after installing them (or after the machine "
                "started) reads and compiles them, a minute or two; later runs take seconds")


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


def asks_for_help(argv: Sequence[str]) -> bool:
    """Whether a command line asks for help (``-h``, ``--help``): help is text, no work to announce."""
    return any(arg in ("-h", "--help") for arg in argv)


class FirstHeavyImport(importlib.abc.MetaPathFinder):
    """Says what a command is about to do when it first imports torch or ExecuTorch (:data:`LIBRARIES`),
    before the import starts, and that a first run takes a while if that loading still runs ``after``
    seconds later (a loading that has ended by then is said nothing about).

    Importing those libraries takes seconds warm and a minute or two on a cold first run, before any of
    the command's own progress: without this line a person sees nothing and cannot tell a slow start from
    a hang. Said at the import itself, it costs nothing to a command that stops before it (help, a usage
    error). Use it as a context manager, or :meth:`install` it for the rest of the process.
    """

    def __init__(self, say: Callable[[str], None], what: str, after: float = SLOW_LOADING_SECONDS,
                 libraries: Sequence[str] = LIBRARIES, packages: Sequence[str] = PACKAGES) -> None:
        self.say, self.what, self.after, self.libraries = say, what, after, tuple(libraries)
        self.packages = frozenset(packages)
        self.first: str | None = None  # the library whose import set it off

    def install(self) -> FirstHeavyImport:
        """Watch this process's imports; a process that has imported the first library (torch) already
        waits for nothing, so then this says nothing."""
        if self.libraries[0] not in sys.modules:
            sys.meta_path.insert(0, self)
        return self

    def find_spec(self, name: str, path=None, target=None):
        if name.partition(".")[0] in {library.partition(".")[0] for library in self.libraries}:
            self._remove()
            self.first = name.partition(".")[0]
            self.say(f"{self.what}; loading torch and ExecuTorch")
            slow = threading.Timer(self.after, self._say_if_still_loading)
            slow.daemon = True
            slow.start()
        return None  # the import itself is the usual finders' work

    def still_loading(self) -> bool:
        """Whether the import that set this off has not ended, or any module of :data:`PACKAGES` is being
        imported (a package that has loaded may still be importing its submodules)."""
        first = sys.modules.get(self.first) if self.first else None
        return (self.first is not None and (first is None or _initializing(first))) or any(
            _initializing(module) for name, module in sys.modules.copy().items()
            if name.partition(".")[0] in self.packages)

    def _say_if_still_loading(self) -> None:
        if self.still_loading():
            self.say(SLOW_LOADING)

    def _remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def __enter__(self) -> FirstHeavyImport:
        return self.install()

    def __exit__(self, *exc) -> None:
        self._remove()


def _initializing(module: ModuleType | None) -> bool:
    """Whether ``module`` is still being imported: importlib marks its spec so while the module's code runs."""
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))
