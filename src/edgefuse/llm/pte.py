"""What a ``.pte`` file runs: its delegates by backend and the kernels it calls outside them, by op.

Read from the serialized program itself (the instructions of a method's execution plan), so the counts
are those of the file a runtime loads, after ``to_executorch`` (memory planning, ``et_view``, ...).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

#: Kernel names of a mean, and of a cast, as the program names its operators.
MEAN_KERNELS = ("aten::mean",)
CAST_KERNELS = ("aten::_to_copy", "dim_order_ops::_to_dim_order_copy", "aten::_to_dim_order_copy")


@dataclass(frozen=True)
class PteContents:
    """The delegate calls (by backend id) and kernel calls (by op, ``aten::mean.out``) of one method."""

    method: str
    delegates: Counter
    kernels: Counter

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
    plan = _plan(source, method)
    operators = [op.name + (f".{op.overload}" if op.overload else "") for op in plan.operators]
    chains = []
    for chain in plan.chains:
        labels = []
        for instruction in chain.instructions:
            args = instruction.instr_args
            kind = type(args).__name__
            if kind == "KernelCall":
                labels.append(("kernel", operators[args.op_index]))
            elif kind == "DelegateCall":
                labels.append(("delegate", plan.delegates[args.delegate_index].id))
            else:
                labels.append((kind, ""))
        chains.append(labels)
    return chains


def read_pte(source: str | os.PathLike | bytes, method: str = "forward") -> PteContents:
    """The delegates and kernels of ``method`` in a ``.pte`` given as a path or as bytes."""
    delegates: Counter = Counter()
    kernels: Counter = Counter()
    for chain in instruction_labels(source, method):
        for kind, name in chain:
            if kind == "kernel":
                kernels[name] += 1
            elif kind == "delegate":
                delegates[name] += 1
    return PteContents(method, delegates, kernels)
