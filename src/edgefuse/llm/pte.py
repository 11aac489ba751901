"""What a ``.pte`` file runs: its delegates by backend and the kernels it calls outside them, by op.

Read from the serialized program itself (the instructions of a method's execution plan), so the counts
are those of the file a runtime loads, after ``to_executorch`` (memory planning, ``et_view``, ...).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

#: Kernel names of a mean, and of a cast, as the program names its operators.
MEAN_KERNELS = ("aten::mean",)
CAST_KERNELS = ("aten::_to_copy", "dim_order_ops::_to_dim_order_copy", "aten::_to_dim_order_copy")

#: The floating-point dtypes, as the program's schema names them (``ScalarType``).
FLOAT_TYPES = ("HALF", "FLOAT", "DOUBLE", "BFLOAT16")


@dataclass(frozen=True)
class PteContents:
    """The delegate calls (by backend id) and kernel calls (by op, ``aten::mean.out``) of one method."""

    method: str
    delegates: Counter
    kernels: Counter
    #: The casts outside the delegates by (input dtype, output dtype), as ``("LONG", "FLOAT")``.
    cast_types: Counter = field(default_factory=Counter)

    @property
    def delegate_count(self) -> int:
        return sum(self.delegates.values())

    @property
    def kernel_count(self) -> int:
        return sum(self.kernels.values())

    def count(self, prefixes: tuple[str, ...]) -> int:
        """Kernel calls whose op name (without overload) is one of ``prefixes``."""
        return sum(n for op, n in self.kernels.items() if op.split(".", 1)[0] in prefixes)

    @property
    def means(self) -> int:
        return self.count(MEAN_KERNELS)

    @property
    def casts(self) -> int:
        return self.count(CAST_KERNELS)

    @property
    def float_casts(self) -> int:
        """Casts from one floating-point dtype to another: the casts around a norm."""
        return sum(n for (source, target), n in self.cast_types.items() if source in FLOAT_TYPES and target in FLOAT_TYPES)

    @property
    def integer_casts(self) -> int:
        """Casts from or to an integer dtype, such as rotary position ids (int64) made float: no norm's."""
        return self.casts - self.float_casts


def _program(source: str | os.PathLike | bytes):
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = source if isinstance(source, bytes) else open(source, "rb").read()
    program = deserialize_pte_binary(data)
    return getattr(program, "program", program)  # newer releases wrap the program


def _plan(source: str | os.PathLike | bytes, method: str):
    program = _program(source)
    plans = {plan.name: plan for plan in program.execution_plan}
    if method not in plans:
        raise ValueError(f"the program has no method {method!r}; it has {', '.join(sorted(plans))}")
    return plans[method]


def method_names(source: str | os.PathLike | bytes) -> list[str]:
    """The names of the methods a ``.pte`` holds (its execution plans), in the program's order."""
    return [plan.name for plan in _program(source).execution_plan]


def instruction_labels(source: str | os.PathLike | bytes, method: str = "forward") -> list[list[tuple[str, str]]]:
    """Each chain's instructions in order, as (kind, name): ``("kernel", "aten::mean.out")``,
    ``("delegate", "XnnpackBackend")``, or the instruction's kind and an empty name (moves, jumps, frees).
    ETDump names its events by chain and instruction index; these say what each one ran."""
    return [[(kind, name) for kind, name, _ in chain] for chain in _instructions(_plan(source, method))]


def _instructions(plan) -> list[list[tuple[str, str, object]]]:
    """:func:`instruction_labels` of an execution plan, each with its instruction's arguments."""
    operators = [op.name + (f".{op.overload}" if op.overload else "") for op in plan.operators]
    chains = []
    for chain in plan.chains:
        labels = []
        for instruction in chain.instructions:
            args = instruction.instr_args
            kind = type(args).__name__
            if kind == "KernelCall":
                labels.append(("kernel", operators[args.op_index], args))
            elif kind == "DelegateCall":
                labels.append(("delegate", plan.delegates[args.delegate_index].id, args))
            else:
                labels.append((kind, "", args))
        chains.append(labels)
    return chains


def _cast_types(plan, args) -> tuple[str, str]:
    """The (input, output) dtype names of a cast kernel's call: its first argument and its out tensor."""
    from executorch.exir.schema import ScalarType

    def dtype(index: int) -> str:
        value = plan.values[index].val
        return ScalarType(value.scalar_type).name if hasattr(value, "scalar_type") else type(value).__name__

    return dtype(args.args[0]), dtype(args.args[-1])


def read_pte(source: str | os.PathLike | bytes, method: str = "forward") -> PteContents:
    """The delegates and kernels of ``method`` in a ``.pte`` given as a path or as bytes."""
    delegates: Counter = Counter()
    kernels: Counter = Counter()
    cast_types: Counter = Counter()
    plan = _plan(source, method)
    for chain in _instructions(plan):
        for kind, name, args in chain:
            if kind == "kernel":
                kernels[name] += 1
                if name.split(".", 1)[0] in CAST_KERNELS:
                    cast_types[_cast_types(plan, args)] += 1
            elif kind == "delegate":
                delegates[name] += 1
    return PteContents(method, delegates, kernels, cast_types)
