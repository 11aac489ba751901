"""edgefuse.qnn.patched: edgefuse's passes in ExecuTorch's QNN pipelines for one block, and nothing after.

These tests need ExecuTorch's Qualcomm package, not the QNN libraries: annotation, the pass manager's
tables and the cast removal all run without them.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import edgefuse.qnn
from edgefuse.qnn.passes import QNN_PACKAGE, QnnRecomposeRmsNorm, QnnRemoveRedundancy
from edgefuse.qnn.quantizer import sdk_setup_left_to_caller
from edgefuse.qnn.visitors import visitor
from edgefuse.core.verify import compare_elementwise

pytestmark = pytest.mark.slow

STOCK = {
    "RecomposeRmsNorm": "executorch.backends.qualcomm._passes.recompose_rms_norm",
    "RemoveRedundancy": "executorch.backends.qualcomm._passes.remove_redundancy",
}


def _stock(name):
    return getattr(importlib.import_module(STOCK[name]), name)


def _holders():
    """Every loaded QNN module attribute that holds one of the two pass names, and what it holds."""
    return {
        (module_name, name): module.__dict__[name]
        for module_name, module in list(sys.modules.items())
        if module is not None and module_name.startswith(QNN_PACKAGE) and module_name not in STOCK.values()
        for name in STOCK
        if name in module.__dict__
    }


def _rms_norm_builder():
    """The builder ExecuTorch's QNN lowering takes for ``aten.rms_norm`` now."""
    from edgefuse.qnn.visitors import RMS_NORM_TARGET, VISITORS_MODULE

    return importlib.import_module(VISITORS_MODULE)._node_visitor_dict[RMS_NORM_TARGET]


def _manager():
    from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls

    return get_qnn_pass_manager_cls()


def test_patched_swaps_every_reference_and_restores_them_when_the_block_raises():
    with edgefuse.qnn.patched():
        pass  # imports every module that names the passes
    before, builder = _holders(), _rms_norm_builder()
    assert before and all(value is _stock(name) for (_, name), value in before.items())
    assert builder.__module__.startswith("executorch.")
    with pytest.raises(KeyError, match="raised inside"):
        with edgefuse.qnn.patched() as patch:
            assert _rms_norm_builder() is visitor() and issubclass(visitor(), builder)
            inside = _holders()
            assert all(value is getattr(patch, "recompose" if name == "RecomposeRmsNorm" else "remove_redundancy")
                       for (_, name), value in inside.items())
            manager = _manager()
            annotation = manager.get_annotation_passes()
            assert patch.recompose in annotation and patch.remove_redundancy in annotation
            assert _stock("RecomposeRmsNorm") not in annotation and _stock("RemoveRedundancy") not in annotation
            assert manager.get_passes_dependency_for_capture_program()[patch.recompose] == [patch.remove_redundancy]
            assert patch.recompose in manager.get_capture_program_passes()
            raise KeyError("raised inside")
    assert _holders() == before
    assert _rms_norm_builder() is builder


def test_the_pass_manager_hands_edgefuse_the_program_it_asks_for():
    from executorch.backends.qualcomm.utils.constants import QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY

    with edgefuse.qnn.patched() as patch:
        jobs = _manager().get_capture_program_passes()
    defaults = jobs[patch.recompose][QCOM_PASS_ARGS_KWARGS_DEFAULTS_KEY]
    assert defaults == {"quantization_capture": False, "edge_program": None}  # filled in by name at to_edge


def test_nested_blocks_restore_in_turn():
    from executorch.backends.qualcomm._passes import qnn_pass_manager

    with edgefuse.qnn.patched() as outer:
        with edgefuse.qnn.patched() as inner:
            assert qnn_pass_manager.RecomposeRmsNorm is inner.recompose
        assert qnn_pass_manager.RecomposeRmsNorm is outer.recompose
    assert qnn_pass_manager.RecomposeRmsNorm is _stock("RecomposeRmsNorm")


def test_blocks_that_end_out_of_order_leave_the_stock_classes():
    # Two blocks of two threads: the first ends while the second is open, then the second ends.
    from executorch.backends.qualcomm._passes import qnn_pass_manager

    first, second = edgefuse.qnn.patched(), edgefuse.qnn.patched()
    builder = _rms_norm_builder()
    a = first.__enter__()
    b = second.__enter__()
    first.__exit__(None, None, None)
    assert qnn_pass_manager.RecomposeRmsNorm is b.recompose  # the open block keeps its classes
    assert _rms_norm_builder() is visitor()  # and edgefuse's rms_norm builder
    second.__exit__(None, None, None)
    assert _rms_norm_builder() is builder and builder is not visitor()
    assert qnn_pass_manager.RecomposeRmsNorm is _stock("RecomposeRmsNorm")
    assert qnn_pass_manager.RemoveRedundancy is _stock("RemoveRedundancy")
    assert a.recompose is not b.recompose


class GemmaBlock(nn.Module):
    """Linear -> transformers' GemmaRMSNorm (``1 + w``) -> Linear: the released pass leaves it decomposed."""

    def __init__(self):
        super().__init__()
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

        self.a, self.norm, self.b = nn.Linear(32, 32), GemmaRMSNorm(32), nn.Linear(32, 32)
        self.norm.weight.data = torch.rand(32, generator=torch.Generator().manual_seed(0))

    def forward(self, x):
        return self.b(self.norm(self.a(x)))


def _annotated(patch: bool):
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    import contextlib
    import io

    model = GemmaBlock().eval()
    captured = torch.export.export(model, (torch.randn(1, 8, 32),)).module()
    block = edgefuse.qnn.patched() if patch else contextlib.nullcontext(None)
    with block as swap, sdk_setup_left_to_caller(), contextlib.redirect_stdout(io.StringIO()):
        quantizer = QnnQuantizer()
        quantizer.set_default_quant_config(QuantDtype.use_16a8w)
        prepared = prepare_pt2e(captured, quantizer)
    norms = [n for n in prepared.graph.nodes if n.target == torch.ops.aten.rms_norm.default]
    return norms, swap, (model, prepared)


def test_a_quantizer_script_gets_edgefuse_with_one_line():
    norms, swap, (model, prepared) = _annotated(patch=True)
    assert len(norms) == 1
    # the prepared graph (observers pass values through) computes the model: 2 units of float32, the
    # rebuilt rms_norm reading the first Linear's output and the folded 1 + w
    x = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        comparison = compare_elementwise(model(x), prepared(x), 2.0)
    assert comparison.dtype_ok and comparison.ok, comparison
    [run] = [r for r in swap.runs if r.name == "RecomposeRmsNorm"]
    assert run.pipeline == "annotation" and [d.rebuilt for d in run.decisions] == [True]
    stock_norms, _, _ = _annotated(patch=False)
    assert stock_norms == []  # the released pass takes Gemma's 1 + w for no weight at all


class CastTo16(nn.Module):
    """A float32 model that computes in float16 on purpose, its cast naming a memory format."""

    def forward(self, x):
        return x.to(torch.float16, memory_format=torch.contiguous_format) * 3


def _edge_without_dim_order(x):
    from executorch.exir import to_edge

    config = edgefuse.edge_compile_config(_skip_dim_order=True)
    return to_edge(torch.export.export(CastTo16(), (x,)), compile_config=config).exported_program()


def test_the_cast_removal_keeps_a_to_copy_that_changes_the_dtype():
    x = torch.randn(4, 8) * 1000
    program = _edge_without_dim_order(x)
    [cast] = [n for n in program.graph_module.graph.nodes if "memory_format" in n.kwargs]
    assert cast.meta["val"].dtype == torch.float16
    QnnRemoveRedundancy()(program.graph_module)
    assert cast in program.graph_module.graph.nodes
    torch.testing.assert_close(program.module()(x), CastTo16()(x), rtol=0, atol=0)
    stock = _edge_without_dim_order(x)  # the released pass drops it, and the model's float16 rounding with it
    _stock("RemoveRedundancy")()(stock.graph_module)
    assert not [n for n in stock.graph_module.graph.nodes if "memory_format" in n.kwargs]


def test_the_qnn_passes_take_the_keywords_qnns_pass_manager_passes():
    import inspect

    assert list(inspect.signature(QnnRecomposeRmsNorm.__init__).parameters) == ["self", "quantization_capture", "edge_program"]
    assert list(inspect.signature(QnnRemoveRedundancy.__init__).parameters) == ["self", "quantization_capture"]


def test_bad_arguments_are_usage_errors():
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        edgefuse.qnn.lower(nn.Linear(2, 2), (torch.randn(1, 2),), precision="int4")
    with pytest.raises(ValueError, match="unknown SoC 'SM0000'"):
        edgefuse.qnn.lower(nn.Linear(2, 2), (torch.randn(1, 2),), soc="SM0000")
    with pytest.raises(ValueError, match="unknown recompose"):
        edgefuse.qnn.lower(nn.Linear(2, 2), (torch.randn(1, 2),), recompose="both")


def test_missing_libraries_name_the_command_that_sets_them_up(tmp_path):
    script = textwrap.dedent(
        """
        import torch, edgefuse.qnn
        from edgefuse.qnn import QnnLibrariesMissing
        try:
            edgefuse.qnn.lower(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
        except QnnLibrariesMissing as error:
            print("EXIT", error)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("QNN_SDK_ROOT", "LD_LIBRARY_PATH")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    line = [l for l in done.stdout.splitlines() if l.startswith("EXIT")]
    assert line and line[0].startswith("EXIT") and "edgefuse qnn setup" in line[0], done.stdout + done.stderr


class TwoQkNorms(nn.Module):
    """Two whole norms on a shape QNN computes wrong at 8a8w, in two submodules."""

    def __init__(self):
        super().__init__()
        self.q_norm, self.k_norm = nn.RMSNorm(32), nn.RMSNorm(32)

    def forward(self, x):
        return self.q_norm(x), self.k_norm(x)


def _held_while_annotating(quantizer):
    """What the edgefuse passes held each whole norm to while ``quantizer`` annotated :class:`TwoQkNorms`."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    x = torch.randn(2, 16, 32)
    captured = torch.export.export(TwoQkNorms(), (x,)).module()
    with edgefuse.qnn.patched() as patch:
        prepare_pt2e(captured, quantizer)
    return [(n.module_path, n.action, n.reason.split(" (")[0]) for n in patch.legalized]


def _quantizer(quant_dtype):
    from edgefuse.qnn.quantizer import qnn_quantizer

    return qnn_quantizer(stock_recompose=True, quant_dtype=quant_dtype)


def test_the_quantizer_tells_the_annotation_pipeline_its_precision():
    viewed = "qnn computes rms_norm wrong for an input of shape [2, 16, 32] in 8a8w"
    assert _held_while_annotating(_quantizer("use_8a8w")) == [("q_norm", "viewed", f"normalized on a [1, 32, 32] view of its input: {viewed}"),
                                                  ("k_norm", "viewed", f"normalized on a [1, 32, 32] view of its input: {viewed}")]
    kept = "no limit of qnn covers [2, 16, 32] in 16a8w; yet htp-fp16-rms-norm-layout: 16a8w was measured right on these shapes on V75 only"
    held = _held_while_annotating(_quantizer("use_16a8w"))
    assert [(path, action) for path, action, _ in held] == [("q_norm", "kept"), ("k_norm", "kept")]
    assert all(reason.startswith(kept) for _, _, reason in held), held


def test_a_submodule_config_sets_one_norm_apart():
    from executorch.backends.qualcomm.quantizer.quantizer import ModuleQConfig, QuantDtype, get_submodule_name_predicate

    quantizer = _quantizer("use_16a8w")
    quantizer.set_submodule_qconfig_list([(get_submodule_name_predicate("k_norm"), ModuleQConfig(QuantDtype.use_8a8w))])
    assert [(path, action) for path, action, _ in _held_while_annotating(quantizer)] == [("q_norm", "kept"), ("k_norm", "viewed")]


def test_a_recipe_sets_one_norm_apart():
    from executorch.backends.qualcomm.quantizer.quant_recipe import QuantGranularity, QuantRecipe
    from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype
    from torchao.quantization.pt2e import MinMaxObserver

    quantizer = _quantizer("use_16a8w")
    recipe = QuantRecipe(QuantDtype.use_16a4w, False, act_observer=MinMaxObserver, granularity=QuantGranularity.PER_TENSOR)
    recipe.add_regex({r"q_norm"}, QuantDtype.use_8a8w, False, act_observer=MinMaxObserver, granularity=QuantGranularity.PER_TENSOR)
    quantizer.set_recipe(recipe)
    assert [(path, action) for path, action, _ in _held_while_annotating(quantizer)] == [("q_norm", "viewed"), ("k_norm", "kept")]


def test_outside_a_block_the_quantizer_is_the_released_one():
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer

    released = QnnQuantizer.__dict__["transform_for_annotation"]
    with edgefuse.qnn.patched():
        with edgefuse.qnn.patched():
            assert QnnQuantizer.__dict__["transform_for_annotation"].__wrapped__ is released
        assert QnnQuantizer.__dict__["transform_for_annotation"].__wrapped__ is released
    assert QnnQuantizer.__dict__["transform_for_annotation"] is released
