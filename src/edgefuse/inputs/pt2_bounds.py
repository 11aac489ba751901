"""The bounds a ``.pt2`` is read within: bytes, ranks, nesting, and the time its load may take.

Every bound is checked before what it bounds is allocated or evaluated, and a file past one exits 2 naming
the bound (and the option that raises it):

- ``--max-bytes`` (:data:`DEFAULT_MAX_BYTES`): the file; each tensor it declares or makes and their total
  (weights, constants, sample inputs, and every tensor the program makes on its sample inputs);
- :data:`MAX_RANK`, :data:`MAX_DEPTH`, :data:`MAX_SUBGRAPH_DEPTH`: fixed, far above what
  ``torch.export`` writes;
- ``--max-seconds`` (:data:`DEFAULT_MAX_SECONDS`): the whole load, checks and first run included.

The sizes an archive's JSON declares for its intermediates are only claims, so :func:`check_sizes`
propagates the real sample inputs' shapes through the program with fake tensors (shapes and dtypes, no
memory) and bounds what each operator really makes; an operator whose output size is data is refused.

Time. The static checks are linear in the file and run under an alarm (:class:`Deadline`), which stops
Python code past the deadline (sympy, torch's deserializer). The program itself runs in a forked child
(:func:`in_child`, through :mod:`edgefuse.runtime.contained`) that is killed at the deadline, because a program inside the byte bound can still run
for hours, and no static cost model covers every kernel: FlopCounterMode counts matrix products and
convolutions, but a ``max_pool2d`` of a 64 MB input with a 2048-wide window makes a 16 MB output at 4
million comparisons an element (about 10^13 operations) and counts as nothing. The shape propagation runs
in that child too: the size arithmetic a program holds (``_operator.pow`` of sizes) is plain Python
integers, which one huge operation computes in C, past any alarm. The child pins torch to one thread
before it computes: OpenMP's pool does not survive a fork, and a child that used it hung.

Measured on this project's 2-core machine, loaded: the fork and the wait cost 70 to 130 ms; for one layer
of tiny-gemma3 the static checks take 0.1 s, the shape propagation 0.3 s, the first run 0.3 s, and loading
its ``.pt2`` went from 1.5 s to 2.3 s (tiny-llama: 1.0 s to 1.2 s).
"""

from __future__ import annotations

import contextlib
import functools
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

#: The default of ``--max-bytes``: the most bytes a ``.pt2`` may hold or make (4 GiB).
DEFAULT_MAX_BYTES = 4 << 30
#: The default of ``--max-seconds``: the longest a ``.pt2`` may take to load and run once (the test models
#: take under two seconds).
DEFAULT_MAX_SECONDS = 60.0
#: The largest rank of a tensor; ATen's own kernels stop at 25 dims in places, torch.export writes few.
MAX_RANK = 64
#: How deep a JSON record or the sample inputs may nest (a program without subgraphs nests 17 deep, each
#: subgraph adds 8), and how deep subgraphs may nest in one another: each checked before anything recurses.
MAX_DEPTH = 200
MAX_SUBGRAPH_DEPTH = 16


@dataclass(frozen=True)
class Limits:
    """The bounds of one load: ``max_bytes`` (file, tensors) and ``max_seconds`` (the whole load)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_seconds: float = DEFAULT_MAX_SECONDS


def byte_count(text: str) -> int:
    """``4096``, ``512K``, ``64M``, ``4G``, ``1T`` (powers of 1024) as a number of bytes; ``ValueError``
    for anything else. The type of ``--max-bytes``."""
    found = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not found:
        raise ValueError(f"{text!r} is not a number of bytes (4096, 512K, 64M, 4G)")
    return int(found.group(1)) << (10 * " KMGT".index(found.group(2).upper() or " "))


# TooLarge is imported where it is raised: edgefuse.runtime imports torch, which `edgefuse --help` skips.


def past_bytes(what: str, size: int, limits: Limits):
    """The error for ``what`` holding ``size`` bytes, past ``--max-bytes``."""
    from edgefuse.runtime.files import TooLarge

    return TooLarge(f"{what} holds {size:,} bytes, past the bound of {limits.max_bytes:,} bytes; raise it with "
                    "--max-bytes")


def past_fixed(what: str, value: int, bound: int, unit: str):
    """The error for ``what`` reaching ``value`` past a fixed bound no program torch.export writes reaches."""
    from edgefuse.runtime.files import TooLarge

    return TooLarge(f"{what} has {unit} {value:,}, past edgefuse's fixed bound of {bound:,} (far above what "
                    "torch.export writes)")


def check_tensor(what: str, shape, element_size: int, limits: Limits) -> int:
    """The bytes of a tensor of ``shape`` (its elements, however few its storage holds); raises
    :class:`~edgefuse.runtime.files.TooLarge` past :data:`MAX_RANK` or ``--max-bytes``."""
    if len(shape) > MAX_RANK:
        raise past_fixed(what, len(shape), MAX_RANK, "rank")
    size = element_size * _product(shape)
    if size > limits.max_bytes:
        dims = ", ".join(map(str, list(shape)[:8])) + (", ..." if len(shape) > 8 else "")
        raise past_bytes(f"{what}, of shape [{dims}],", size, limits)
    return size


def _product(shape) -> int:
    out = 1
    for dim in shape:
        out *= int(dim)
    return out


# --- time ---------------------------------------------------------------------------------------------


class OutOfTime(BaseException):
    """The load went past ``--max-seconds``. A BaseException, so that the ``except Exception`` of the code
    it interrupts (torch's deserializer) does not take it for that code's own failure."""


class Deadline:
    """The end of a load ``seconds`` from now: :meth:`alarm` interrupts Python code past it (in the main
    thread; elsewhere there is no alarm, and only the child's run is bounded), :meth:`remaining` is what
    is left for the child."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def expired(self, what: str) -> OutOfTime:
        return OutOfTime(f"{what} took more than {self.seconds:g} s, the bound of its load; raise it with "
                         "--max-seconds")

    @contextlib.contextmanager
    def alarm(self, what: str) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            yield
            return

        def ring(signum, frame):
            raise self.expired(what)

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.remaining(), 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


class ChildFailed(Exception):
    """The child that ran a step failed: ``kind`` is "bound" (a bound refused what it made), "error" (it
    raised) or "died" (a signal ended it); the message says what happened."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


def in_child(work: Callable[[], None], deadline: Deadline, what: str) -> None:
    """Run ``work()`` in a forked child (:func:`edgefuse.runtime.contained.contained`), killed at ``deadline``.

    Raises :class:`OutOfTime` when it does not finish in time, :class:`ChildFailed` when it raises (a
    :class:`TooLarge` or :class:`DataSized` as kind "bound") or dies.
    """
    from edgefuse.runtime.contained import Crashed, TimedOut, contained
    from edgefuse.runtime.files import TooLarge

    def step(note) -> dict | None:
        try:
            work()
        except (TooLarge, DataSized) as error:
            return {"kind": "bound", "message": _summary(error)}
        except Exception as error:  # noqa: BLE001  (the program's own failure, reported as such)
            return {"kind": "error", "message": _summary(error)}
        return None

    try:
        failed = contained(step, until=deadline.end)
    except TimedOut:
        raise deadline.expired(what) from None
    except Crashed as crash:
        how = f"ended with {crash.signal}" if crash.signal else "ended without a result"
        raise ChildFailed("died", f"{what} {how} (the process that ran it was killed)") from None
    if failed is not None:
        raise ChildFailed(failed["kind"], failed["message"])


def _summary(error: BaseException) -> str:
    from edgefuse.runtime.files import TooLarge

    lines = [line for line in str(error).strip().splitlines() if line.strip()]  # FX appends the node's code
    first = lines[0] if lines else ""
    if isinstance(error, (TooLarge, DataSized, OutOfTime)):
        return first
    return f"{type(error).__name__}: {first}".rstrip(": ")


# --- what the program makes -----------------------------------------------------------------------------


class DataSized(ValueError):
    """An operator of the program makes a tensor whose size depends on values, not on shapes."""


def check_sizes(program, limits: Limits) -> None:
    """Bound every tensor ``program`` makes on its sample inputs, each and in total, before any is made.

    The sample inputs, weights and constants are replaced by fake tensors of the same shapes (no memory),
    and the program's graph, its subgraphs included, runs on them: each operator's outputs are checked as
    they come. Raises :class:`TooLarge` past a bound, :class:`DataSized` for an operator whose output
    size is data, and what the program raises on inputs it cannot take.
    """
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

    Sizes, Interpreter = _size_checkers()
    args, kwargs = program.example_inputs
    flat = program._graph_module_flat_inputs(args, kwargs)
    sizes = Sizes(limits)
    with FakeTensorMode() as mode, _sized_subgraphs(program.graph_module, sizes, Interpreter):
        fake = [mode.from_tensor(value) if isinstance(value, torch.Tensor) else value for value in flat]
        try:
            with sizes:
                Interpreter(program.graph_module, sizes).run(*fake)
        except (DynamicOutputShapeException, DataDependentOutputException):
            raise DataSized(f"node {sizes.where()}: the size of its output depends on the values of its input, "
                            "so no bound on it can be checked before it runs") from None


@functools.cache
def _size_checkers():
    """The dispatch mode that checks what each operator makes, and the interpreter that names the node it
    runs: classes made on first use, since they need torch."""
    import torch
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sizes(TorchDispatchMode):
        """Checks each tensor an operator makes: its rank and bytes, and the bytes of new storages in total.
        Higher-order operators pass through it too; their subgraphs push it again (:func:`_sized_subgraphs`)."""

        supports_higher_order_operators = True

        def __init__(self, limits: Limits):
            super().__init__()
            self.limits = limits
            self.nodes: list[str] = []
            self.total = 0
            self.kept: list = []  # the fake storages counted, kept alive so that no address is counted twice
            self.seen: set[int] = set()

        def where(self) -> str:
            return repr(" > ".join(self.nodes) or "(the program)")

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for value in pytree.tree_leaves(out):
                if isinstance(value, torch.Tensor):
                    self.count(value, func)
            return out

        def count(self, tensor: torch.Tensor, func) -> None:
            dtype = str(tensor.dtype).removeprefix("torch.")
            check_tensor(f"the {dtype} tensor node {self.where()} makes ({func})", tensor.shape,
                         tensor.element_size(), self.limits)
            storage = tensor.untyped_storage()
            if storage._cdata in self.seen:
                return
            self.seen.add(storage._cdata)
            self.kept.append(storage)
            self.total += storage.nbytes()
            if self.total > self.limits.max_bytes:
                raise past_bytes(f"what the program makes on its sample inputs, up to node {self.where()},",
                                 self.total, self.limits)

    class Interpreter(torch.fx.Interpreter):
        def __init__(self, module, sizes: Sizes):
            super().__init__(module)
            self.sizes = sizes

        def run_node(self, node):
            self.sizes.nodes.append(node.name)
            try:
                return super().run_node(node)
            finally:
                self.sizes.nodes.pop()

    return Sizes, Interpreter


@contextlib.contextmanager
def _sized_subgraphs(module, sizes, interpreter) -> Iterator[None]:
    """Make each subgraph of ``module`` run under ``sizes``, node by node, when a higher-order operator
    calls it (the operator's own rule runs it with the mode popped); put their ``forward`` back after."""
    import torch

    patched = []
    for sub in module.modules():
        if sub is module or not isinstance(sub, torch.fx.GraphModule):
            continue

        def forward(*args, _sub=sub):
            with sizes:
                return interpreter(_sub, sizes).run(*args)

        patched.append(sub)
        sub.forward = forward
    try:
        yield
    finally:
        for sub in patched:
            del sub.forward
