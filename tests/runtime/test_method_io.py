"""A program's inputs and outputs as each of its methods declares them, read without loading a method: the
runtime sizes a delegate's output buffers by these declarations."""

from __future__ import annotations

import pytest
import torch

from edgefuse.runtime import TensorMeta, _tensor_meta


class _Info:
    """A runtime tensor info of the runtime's ScalarType ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def sizes(self) -> list[int]:
        return [2, 3]

    def dtype(self) -> int:
        return self.code

    def nbytes(self) -> int:
        return 12


@pytest.mark.parametrize("code", [22, 99])  # Bits16, which torch has no dtype for; a code ExecuTorch lacks
def test_a_declared_type_torch_lacks_keeps_the_runtimes_code(code):
    meta = _tensor_meta(lambda index: _Info(code), 0)
    assert meta == TensorMeta((2, 3), None, 12, code=code)
    assert meta.type_name == ("ScalarType BITS16" if code == 22 else "ScalarType 99")


def test_a_declared_type_torch_has_is_its_dtype():
    assert _tensor_meta(lambda index: _Info(6), 0) == TensorMeta((2, 3), torch.float32, 12)


@pytest.mark.slow
def test_method_io_reads_each_methods_own_declarations_and_logs_nothing(capfd):
    """Two methods of other dtypes and shapes; ``b`` also gives an int, which is no tensor (the runtime
    logs why it refuses its tensor meta)."""
    from executorch.exir import to_edge

    from edgefuse.runtime import MethodMissing, method_io

    class Twice(torch.nn.Module):
        def forward(self, x):
            return x * 2

    class PlusOne(torch.nn.Module):
        def forward(self, x):
            return x + 1, 3

    pte = to_edge({
        "a": torch.export.export(Twice(), (torch.ones(2, 3),)),
        "b": torch.export.export(PlusOne(), (torch.ones(4, dtype=torch.int32),)),
    }).to_executorch().buffer
    capfd.readouterr()
    floats, ints = TensorMeta((2, 3), torch.float32, 24), TensorMeta((4,), torch.int32, 16)
    assert method_io(pte, "a") == ((floats,), (floats,))
    assert method_io(pte, "b") == ((ints,), (ints, None))
    with pytest.raises(MethodMissing, match=r"no method 'forward'; its methods: a, b"):
        method_io(pte)
    assert capfd.readouterr().err == ""
