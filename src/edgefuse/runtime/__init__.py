"""The one runner: ``.pte`` programs loaded and run in the released ``executorch.runtime``.

Every claim the command line makes about a lowered program (it loads, it matches eager, it is faster or
slower) is checked here, on the bytes that would ship, with the real XNNPACK kernels. Every command and
tool loads and runs a program through :class:`LoadedProgram`, and times it with
:mod:`edgefuse.runtime.timer`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from edgefuse.runtime.log import with_its_log, without_set_up_noise

T = TypeVar("T")


@functools.cache
def start_threadpool() -> int:
    """Create the runtime's threadpool, once per process; returns the thread count it was created with.

    Creating it probes the CPU and logs five lines (``cpuinfo_utils.cpp``: "Reading file" and "Failed to
    open midr file" twice each, then "CPU info and manual query on # of cpus dont match") that say
    nothing about any program, so they are dropped.
    """
    from executorch.extension.pybindings import portable_lib

    with without_set_up_noise():
        return portable_lib._threadpool_get_thread_count()


class MethodMissing(ValueError):
    """A program has no method of the name asked for; ``methods`` are the ones it has."""

    def __init__(self, method: str, methods: Sequence[str]) -> None:
        self.method, self.methods = method, tuple(methods)
        super().__init__(f"the program has no method {method!r}; its methods: {', '.join(self.methods) or 'none'}")


class LoadedProgram:
    """One method of a loaded ``.pte`` (``forward`` unless named); holds the program, which must outlive
    its method.

    Loading and running raise errors that say what the runtime logged about the failure; a method the
    program lacks raises :class:`MethodMissing` naming the ones it has. With ``etdump=True`` the runtime
    records every run's profile (:meth:`etdump`). ``pte`` is the program's bytes, or the name of its file,
    which the runtime maps rather than copies."""

    def __init__(self, pte: bytes | str, method: str = "forward", etdump: bool = False) -> None:
        from executorch.runtime import Runtime

        start_threadpool()
        self.program = with_its_log(lambda: Runtime.get().load_program(pte, enable_etdump=etdump))
        if method not in self.program.method_names:
            raise MethodMissing(method, sorted(self.program.method_names))
        self.method = with_its_log(lambda: self.program.load_method(method))

    def etdump(self) -> bytes:
        """The ETDump the runtime recorded since loading (load with ``etdump=True``): one run per
        ``execute``, each instruction's time, and each op's inside an XNNPACK delegate."""
        import os
        import tempfile

        with tempfile.TemporaryDirectory(prefix="edgefuse-etdump-") as folder:
            path = os.path.join(folder, "run.etdp")
            with_its_log(lambda: self.program.write_etdump_result_to_file(path, os.path.join(folder, "debug.bin")))
            with open(path, "rb") as f:
                return f.read()

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The tensor outputs of one run."""
        import torch

        flat = flat_inputs(inputs)
        result = with_its_log(lambda: self.method.execute(flat))
        return [t for t in result if isinstance(t, torch.Tensor)]

    def execute(self, flat: list) -> Sequence[Any]:
        """One full call as a Python user makes it, with nothing around it (what a timing times): copy the
        :func:`flat_inputs` in, run, and copy every output out."""
        return self.method.execute(flat)

    def run_again(self) -> None:
        """Run the method again on the inputs of the last :meth:`execute`, copying nothing in or out.

        This is the program's own time, as a C++ runner measures ``Method::execute``; the full call adds
        the binding's input copy and output clone, which cost the same for any two programs with the same
        inputs and outputs. ``executorch.runtime.Method`` only offers the full call, so this uses the
        pybindings method it wraps.
        """
        self.method._method.execute()


def takes_one_token(method) -> bool:
    """Whether a loaded LLM method (:attr:`LoadedProgram.method`) takes one token a call: its tokens input
    ``[1, n]`` declares ``n`` 1 (exported with static shapes, as optimum-executorch exports Gemma 3)."""
    return list(method.metadata.input_tensor_meta(0).sizes())[1:] == [1]


def prefill(step: Callable[[int, int], T], length: int, one_token: bool) -> T:
    """The last result of prefilling a prompt of ``length`` tokens with ``step(start, end)``, the call on the
    prompt's tokens ``start:end``: one call, or one call a token for a program that takes one token a call
    (:func:`takes_one_token`), as optimum's runner (``ExecuTorchModelForCausalLM``) prefills it."""
    if not one_token:
        return step(0, length)
    for start in range(length):
        result = step(start, start + 1)
    return result


@dataclass(frozen=True)
class TensorMeta:
    """A tensor input or output as a program's method declares it. The runtime sizes the buffer of an
    output the program does not plan by these (a delegate writes into it), and refuses an input of
    another dtype or shape. ``dtype`` is None for a type torch has no dtype for (``Bits16``, a code
    this ExecuTorch does not know), whose runtime code ``code`` then holds."""

    shape: tuple[int, ...]
    dtype: Any  # a torch.dtype
    nbytes: int
    code: int | None = None

    @property
    def type_name(self) -> str:
        """The declared type as a message names it: ``uint8``, or the runtime's name or code."""
        if self.dtype is not None:
            return str(self.dtype).removeprefix("torch.")
        from executorch.exir.schema import ScalarType

        known = {member.value: member.name for member in ScalarType}
        return f"ScalarType {known.get(self.code, self.code)}"


def method_io(pte: bytes | str, method: str = "forward") -> tuple[tuple[TensorMeta | None, ...], tuple[TensorMeta | None, ...]]:
    """Each input and each output of ``method`` of ``pte`` (its bytes, or its file's name: mapped, not read) as
    the program declares it (None for a value that is not a tensor), read from its method table: the method
    is not loaded, so no backend is initialised. A method the program lacks raises :class:`MethodMissing`."""
    from executorch.runtime import Runtime

    start_threadpool()

    def read():
        program = Runtime.get().load_program(pte)
        if method not in program.method_names:
            raise MethodMissing(method, sorted(program.method_names))
        meta = program.metadata(method)
        return (tuple(_tensor_meta(meta.input_tensor_meta, i) for i in range(meta.num_inputs())),
                tuple(_tensor_meta(meta.output_tensor_meta, i) for i in range(meta.num_outputs())))

    return with_its_log(read)


def _tensor_meta(read, index: int) -> TensorMeta | None:
    """The :class:`TensorMeta` that ``read(index)`` (a method meta's ``input_tensor_meta`` or
    ``output_tensor_meta``) gives, None where the value at ``index`` is not a tensor: the runtime logs
    why it refuses one, which goes into the refusal and is dropped with it."""
    try:
        info = with_its_log(lambda: read(index), explained=(IndexError, RuntimeError))
    except (IndexError, RuntimeError):
        return None
    code = info.dtype()
    dtype = _torch_dtype(code)
    return TensorMeta(tuple(info.sizes()), dtype, info.nbytes(), None if dtype is not None else code)


def _torch_dtype(code: int) -> Any:
    """The torch dtype of the runtime's ScalarType ``code``; None for one torch lacks or an unknown code."""
    from executorch.exir.schema import ScalarType
    from executorch.exir.tensor import get_scalar_type

    try:
        return get_scalar_type(ScalarType(code))
    except (KeyError, ValueError):
        return None


def set_threads(threads: int) -> int:
    """Reset the runtime's threadpool to ``threads`` (before loading programs); returns the count it has.

    Also pins eager PyTorch to one thread: its OpenMP workers keep spinning after a run and slow the
    runtime down on a small machine.
    """
    import torch
    from executorch.extension.pybindings import portable_lib

    torch.set_num_threads(1)
    start_threadpool()
    with without_set_up_noise():  # "Resetting threadpool to N threads": the caller states the count
        portable_lib._unsafe_reset_threadpool(threads)
    return portable_lib._threadpool_get_thread_count()


def flat_inputs(inputs: Sequence[Any]) -> list:
    """The tensors and values of ``inputs`` in the flat order a method takes them. torch is imported here,
    where a program runs, so that :mod:`edgefuse.runtime.files` imports without it."""
    from torch.utils import _pytree as pytree

    return list(pytree.tree_leaves(tuple(inputs)))
