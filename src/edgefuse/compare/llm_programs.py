"""The two ``.pte`` programs an LLM timing compares: read from regular files within a bound, checked as data,
tried in a child process before they are timed here, loaded with the kernels ExecuTorch's LLM programs call
outside their delegates; and the numbers a timing is asked for, checked. Shared by ``edgefuse bench-llm``
and ``python -m edgefuse.tools.llm_latency``."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from typing import Callable

from edgefuse.inputs.errors import UsageError

Say = Callable[[str], None]


def load_llm_kernels() -> None:
    """Register the kernels ExecuTorch's LLM programs call outside their delegates with the runtime:
    the LLM custom ops (``llama::custom_sdpa``, ``llama::update_cache``) and, where installed, the
    quantized kernels (a quantized embedding)."""
    import importlib

    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (loads the custom ops' kernels)

    for optional in ("executorch.kernels.quantized",):
        with contextlib.suppress(ImportError):
            importlib.import_module(optional)


#: The bound on what loading a ``.pte`` takes (the file's bytes and the memory its methods plan) unless
#: ``--max-bytes`` says otherwise: a Llama 3.2 1B in 8da4w (a 1.75 GB file) with its KV cache fits; a larger program
#: needs the option, and a small file that asks for gigabytes is refused.
MAX_BYTES = 2 * 1024**3


def add_max_bytes_argument(parser) -> None:
    """``--max-bytes`` on an argument parser: the bound :func:`read_llm_program` reads within."""
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, metavar="N",
                        help="the most bytes loading a .pte may take, its own and the memory its methods plan; "
                        f"a file past it is refused before it loads (default {MAX_BYTES:,})")


#: The delegates of the programs ``bench-llm`` times: those that run on this CPU.
TIMED_BACKENDS = ("XnnpackBackend",)


@dataclass
class CheckedPte:
    """A ``.pte`` file :func:`read_llm_program` read and checked, held open: the runtime loads this open file
    (``/dev/fd/N``), not whatever is put at ``path`` later, and maps it rather than copying it, so a loaded
    program costs the file pages it reads and what its delegates allocate, not a copy of the file besides. A
    bf16 Llama-3.2-1B (a 2.79 GiB file) takes 12.4 GiB loaded from its bytes and 10.1 GiB mapped: two of them
    fit in 23 GiB only mapped. ``identity`` is the file's ``fstat`` when it was checked, which a load and the
    end of a timing compare (:meth:`changed`)."""

    path: str
    file: io.BufferedReader
    identity: os.stat_result

    @property
    def source(self) -> str:
        """The name the runtime opens: this open file, by its descriptor."""
        return f"/dev/fd/{self.file.fileno()}"

    def changed(self) -> bool:
        """Whether the file was written since it was checked: its size or modification time moved, or its
        change time did while its links did not (a new file renamed over its name unlinks this one, which
        moves its change time, and leaves its content as it was). A write of the same size within the
        clock's tick that also puts the modification time back goes unseen."""
        now, then = os.fstat(self.file.fileno()), self.identity
        if (now.st_size, now.st_mtime_ns) != (then.st_size, then.st_mtime_ns):
            return True
        return now.st_ctime_ns != then.st_ctime_ns and now.st_nlink == then.st_nlink

    def read(self) -> bytes:
        """The file's bytes, for a reader that needs them all (a profile labels instructions from them);
        :class:`UsageError` if it was written since it was checked."""
        from edgefuse.runtime.files import TooLarge, read_open

        written = UsageError(f"{self.path} was written to after it was checked; run again once nothing writes it")
        if self.changed():
            raise written
        try:
            data = read_open(self.file, self.identity.st_size, f"{self.path} (a .pte)")
        except (TooLarge, OSError) as error:
            raise written from error
        if self.changed():
            raise written
        return data


def refuse_changed(programs) -> None:
    """:class:`UsageError` naming the first ``(path, checked)`` of ``programs`` written to since it was
    checked: the runtime maps the file, so a write during a timing reaches what it runs."""
    for path, checked in programs:
        if checked.changed():
            raise UsageError(f"{path} was written to after it was checked, while it was loaded or timed; time it "
                             "again once nothing writes it")


def read_llm_program(path: str, max_bytes: int) -> CheckedPte:
    """The ``.pte`` at ``path``, held open once the runtime may see it: a regular file whose headers,
    tables and size pass :func:`~edgefuse.runtime.pte_check.check_pte` within ``max_bytes``, delegating to
    XNNPACK or to nothing, whose ``forward`` takes tokens and their position (two int64 tensors: export_llm's
    start position, or optimum-executorch's cache positions). :class:`UsageError` naming the file and why
    otherwise."""
    from edgefuse.runtime.files import NotARegularFile, TooLarge, open_regular

    try:
        f = open_regular(path, max_bytes, "a .pte", "--max-bytes")
    except FileNotFoundError as error:
        raise UsageError(f"{path}: no such file") from error
    except OSError as error:
        raise UsageError(f"{path} cannot be read: {error.strerror or error}") from error
    except (NotARegularFile, TooLarge) as error:
        raise UsageError(str(error)) from error
    try:
        identity = os.fstat(f.fileno())
        _check_llm_program(f, path, max_bytes)
    except BaseException:
        f.close()
        raise
    return CheckedPte(path, f, identity)


def _check_llm_program(f: io.BufferedReader, path: str, max_bytes: int) -> None:
    """:func:`read_llm_program`'s checks on the open file ``f``; its bytes are let go once checked."""
    from executorch.exir._serialize.generated.executorch_flatbuffer.ScalarType import ScalarType

    from edgefuse.runtime.files import TooLarge, read_open
    from edgefuse.runtime.log import printable
    from edgefuse.runtime.pte_check import NAME_SHOWN, PteRejected, check_pte

    try:
        facts = check_pte(read_open(f, max_bytes, f"{path} (a .pte)", "--max-bytes"), path, max_bytes,
                          "--max-bytes")
    except (TooLarge, PteRejected) as error:
        raise UsageError(str(error)) from error
    except OSError as error:
        raise UsageError(f"{path} cannot be read: {error.strerror or error}") from error
    if "QnnBackend" in facts.delegates:
        raise UsageError(f"{path} runs on QNN (a QnnBackend delegate): this times programs that run on this "
                         "CPU (XNNPACK and portable kernels), not QNN ones")
    other = sorted(set(facts.delegates) - set(TIMED_BACKENDS))
    if other:
        raise UsageError(f"{path} holds a delegate of {printable(other[0], NAME_SHOWN)}: this times programs "
                         f"whose delegates are XNNPACK's ({', '.join(TIMED_BACKENDS)}), on this CPU")
    if "forward" not in facts.methods:
        methods = printable(", ".join(sorted(facts.methods)), NAME_SHOWN)
        raise UsageError(f"{path} has no forward method (it has {methods}): this times export_llm's programs")
    inputs = facts.methods["forward"]
    if inputs != (ScalarType.LONG, ScalarType.LONG):
        names = {number: name.lower() for name, number in vars(ScalarType).items() if not name.startswith("_")}
        taken = ", ".join("a value" if kind is None else f"{names.get(kind, kind)} tensor" for kind in inputs)
        raise UsageError(f"{path}: its forward takes ({taken}), not export_llm's tokens and start position (two "
                         "long tensors, as a program exported with a KV cache takes)")


def load_llm_programs(programs, say: Say) -> list:
    """Each ``(path, checked)`` of ``programs`` (the :class:`CheckedPte` :func:`read_llm_program` returned)
    loaded in ``executorch.runtime`` with the LLM kernels (a ``LoadedProgram`` each); :class:`UsageError`
    naming a file that does not load, or that was written to since it was checked. Set the threads first."""
    from edgefuse.runtime import LoadedProgram

    load_llm_kernels()
    loaded = []
    for path, checked in programs:
        say(f"loading {path}")
        if not os.path.exists(checked.source):
            raise UsageError(f"{path} cannot be loaded by its open descriptor: {checked.source} does not exist here "
                             "(is /proc mounted?)")
        try:
            loaded.append(LoadedProgram(checked.source))
        except Exception as error:  # the runtime says why in its log, which the error carries
            raise UsageError(f"{path} does not load in executorch.runtime: {error}") from error
    refuse_changed(programs)
    return loaded


def try_llm_programs(programs, prefill: int, decode: int) -> None:
    """Load ``programs`` and run each through a prefill and ``decode`` steps as the timing runs them (the
    prompt drawn from the first one's vocabulary), in a child process: :class:`UsageError` naming the file
    when the runtime crashes on it (the signal and what it was doing), cannot load it, or fails a step.

    A program can pass every check and still crash the runtime (a damaged delegate payload), which would
    end this process without a word; the trial's child takes the crash instead. The timing itself runs
    here, as it always has, on the open files the child ran.
    """
    from edgefuse.llm.latency import prompt_for, time_prefill_decode
    from edgefuse.runtime.contained import Crashed, contained

    paths = [path for path, _ in programs]

    def trial(note) -> str | None:
        try:
            methods = [program.method for program in load_llm_programs(programs, note)]
            note(f"running {paths[0]}")
            with failed_steps_named(paths):
                prompt, steps = prompt_for(methods[0], prefill, decode)
            for path, method in zip(paths, methods):
                note(f"running {path}")
                with failed_steps_named([path]):
                    time_prefill_decode([method], prompt, steps, 1, 0)
        except UsageError as error:
            return str(error)
        return None

    try:
        reason = contained(trial)
    except Crashed as error:
        raise UsageError(str(error)) from error
    if reason is not None:
        raise UsageError(reason)


@contextlib.contextmanager
def failed_steps_named(paths):
    """A step that fails in the block, or a program whose inputs the timing cannot feed as the others', becomes
    a :class:`UsageError` naming the program's file."""
    from edgefuse.llm.latency import InputsRefused, StepFailed

    try:
        yield
    except InputsRefused as error:
        raise UsageError(f"{paths[error.index]} {error}") from error
    except StepFailed as error:
        raise UsageError(f"{paths[error.index]} {error} (is --prefill plus --decode within the program's "
                         "context length?)") from error


def check_bench_numbers(args, more: tuple[tuple[str, int, int], ...] = ()) -> None:
    """:class:`UsageError` unless ``--prefill``, ``--decode``, ``--rounds``, ``--warmup``, ``--threads`` (and
    ``more``: name, value, least) are counts a timing can use."""
    from edgefuse.runtime.threads import threads_problem

    for name, value, least in (("--prefill", args.prefill, 1), ("--decode", args.decode, 1),
                               ("--rounds", args.rounds, 1), ("--warmup", args.warmup, 0), *more):
        if value < least:
            raise UsageError(f"{name} must be at least {least}")
    problem = threads_problem(args.threads)
    if problem:
        raise UsageError(problem)
