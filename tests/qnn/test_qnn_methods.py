"""Programs of several methods, as ExecuTorch's static-Llama script makes them (its prefill and decode share
one QNN context): each helper reads and runs the method it is asked for.

A two-method program is lowered once per session: a norm in ``norm`` and a sum in ``add``, compiled by
QNN in one call into one context binary.
"""

from __future__ import annotations

import pytest
import torch

from edgefuse.qnn.selfcheck import RmsNormBlock, SOC

pytestmark = pytest.mark.slow  # lowers multi-method programs for QNN and runs them on the emulator


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


@pytest.fixture(scope="module")
def two_methods(qnn_sdk):
    """``(edge, compiled, pte, x)`` of the program with methods ``norm`` and ``add``, fp16 on SM8650."""
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        to_edge_transform_and_lower_to_qnn,
    )

    from edgefuse.qnn.emulator import to_pte
    from edgefuse.qnn.graphs import recording_compiled_graphs

    torch.manual_seed(0)
    x = torch.randn(1, 8, 64)
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=getattr(QcomChipset, SOC), backend_options=generate_htp_compiler_spec(use_fp16=True)
    )
    modules = {"norm": RmsNormBlock(64).eval(), "add": Add().eval()}
    with recording_compiled_graphs() as compiled:
        edge = to_edge_transform_and_lower_to_qnn(
            modules, {name: (x,) for name in modules}, {name: specs for name in modules}
        )
    return edge, compiled, to_pte(edge), x


def test_both_methods_share_one_context_binary(two_methods):
    edge, compiled, _, _ = two_methods
    assert len({binary for _, _, binary in compiled.graphs}) == 1
    assert sorted(name for name, _, _ in compiled.graphs) == ["add", "norm"]


def test_qnn_graphs_labels_each_method_with_its_own_graph(two_methods):
    from edgefuse.qnn.graphs import qnn_graphs

    edge, compiled, _, _ = two_methods
    by_method = qnn_graphs(edge, compiled).methods()
    assert sorted(by_method) == ["add", "norm"]
    assert [g.rms_norms for g in by_method["norm"]] == [1]
    assert [g.rms_norms for g in by_method["add"]] == [0]
    assert "ElementWiseAdd" in by_method["add"][0].op_types()


def test_run_on_emulator_runs_the_method_it_is_asked_for(two_methods):
    from edgefuse.core.verify import TOLERANCES, compare
    from edgefuse.qnn.emulator import run_on_emulator

    _, _, pte, x = two_methods
    (added,) = run_on_emulator(pte, [x], method="add")
    (normed,) = run_on_emulator(pte, [x], method="norm")
    ulps = TOLERANCES["qnn float16"].ulps
    assert compare(x + x, added.float(), ulps=ulps, dtype=torch.float16).ok
    assert compare(RmsNormBlock(64)(x).detach(), normed.float(), ulps=ulps, dtype=torch.float16).ok


def test_a_method_the_program_lacks_names_the_ones_it_has(two_methods):
    from edgefuse.qnn.emulator import run_on_emulator
    from edgefuse.runtime import MethodMissing

    _, _, pte, x = two_methods
    with pytest.raises(MethodMissing, match=r"no method 'forward'; its methods: add, norm"):
        run_on_emulator(pte, [x])


def test_method_io_reads_each_methods_declared_inputs_and_outputs(two_methods):
    """The declarations the runtime sizes a delegate's buffers by, per method, read without loading it."""
    from edgefuse.runtime import MethodMissing, TensorMeta, method_io

    _, _, pte, x = two_methods
    declared = TensorMeta((1, 8, 64), torch.float32, x.numel() * 4)
    assert method_io(pte, "norm") == ((declared,), (declared,))
    assert method_io(pte, "add") == ((declared,), (declared,))
    with pytest.raises(MethodMissing, match=r"no method 'forward'; its methods: add, norm"):
        method_io(pte)
