"""Rule 9 through QNN's quantizer: a norm rebuilt before its transpose is annotated as one op, and tiny
Gemma3 captured for QNN has all 13 norms, q and k norms included, rebuilt and quantized so, each q and k
norm handing on the strides the model's did."""

from __future__ import annotations

import copy

import torch

import edgefuse
from edgefuse.qnn.quantizer import capture, quantize_for_qnn
from tests.core.test_rule_transposed import QKNorm, _permute_after, _x
from tests.forms import GemmaNorm


def test_qnn_quantizes_a_rebuilt_transposed_norm_as_one_op():
    """Through QNN's quantizer, the norm rebuilt before the transpose is annotated as one op: one pair in,
    one out and its weight, where left decomposed it was quantized one op at a time; the converted program
    keeps the model's strides and lies within the bound its own scales give (``one_op_bound``)."""
    from tests.quant.test_quantized_qnn import one_op_bound, one_op_scales

    module, x = QKNorm(GemmaNorm()).eval(), _x(shape=(1, 64, 4, 16), seed=1)
    quantized = quantize_for_qnn(module, (x,), [(x,)])
    [decision] = quantized.decisions
    assert decision.rebuilt and decision.input == "x", decision
    [norm] = quantized.norms
    assert norm.how == "one op" and norm.ops == ("rms_norm",), norm.describe()
    assert (norm.pairs_in, norm.pairs_inside, norm.pairs_out, norm.pairs_constant) == (1, 0, 1, 1), norm.describe()
    with torch.no_grad():
        expected, actual = module(x), quantized.converted(x)
    assert actual.stride() == expected.stride()
    scales = one_op_scales(quantized.converted)
    bound = one_op_bound(x.transpose(1, 2), 1 + module.norm.weight.detach(), *scales, torch.float32)
    assert bool(((actual.double() - expected.double()).abs() <= bound).all())


class _Strides(torch.fx.Interpreter):
    """Runs a graph and keeps the strides of every tensor it computes, by node name."""

    def __init__(self, graph_module):
        super().__init__(graph_module)
        self.strides = {}

    def run_node(self, n):
        value = super().run_node(n)
        if isinstance(value, torch.Tensor):
            self.strides[n.name] = value.stride()
        return value


def test_tiny_gemma3_for_qnn_rebuilds_every_norm_as_one_op_and_keeps_each_qk_norms_layout():
    """Tiny Gemma3 captured for QNN: its 13 norms, q and k norms included, are rebuilt and quantized as one
    op each; every node that reads a rebuilt q or k norm reads a tensor with the strides it read in the
    model, run by run (the graph's readers are the model's own nodes, under their own names)."""
    from edgefuse.inputs.models import build_model

    module, inputs = build_model("tiny-gemma3")
    model = capture(module, inputs)  # captured once: the quantizer rewrites a copy, the test reads another
    quantized = quantize_for_qnn(copy.deepcopy(model), inputs, [inputs])
    assert len(quantized.decisions) == 13 and all(d.rebuilt for d in quantized.decisions), quantized.decisions
    assert [n.how for n in quantized.norms] == ["one op"] * 13, [n.describe() for n in quantized.norms]

    # the graph the quantizer annotated, before annotation rewrites it: as quantize_for_qnn makes it
    graph = copy.deepcopy(model)
    edgefuse.remove_redundant_casts(graph)
    decisions = edgefuse.recompose_rms_norm(graph, backend="qnn", quantization_capture=True, precision="16a8w").decisions
    assert decisions == quantized.decisions
    qk = [d for d in decisions if d.module_path.endswith(("q_norm", "k_norm"))]
    assert len(qk) == 4 and all("permuted by transpose" in d.note for d in qk)

    theirs, ours = _Strides(model), _Strides(graph)
    with torch.no_grad():
        theirs.run(*inputs)
        ours.run(*inputs)
    nodes = {n.name: n for n in graph.graph.nodes}
    readers = [u for d in qk for u in _permute_after(nodes[d.node]).users]
    assert len(readers) == 12  # each q and k norm feeds the rotary embedding: a multiply and two slices
    for reader in readers:
        read = reader.args[0]
        [model_read] = [n.args[0] for n in model.graph.nodes if n.name == reader.name]
        assert ours.strides[read.name] == theirs.strides[model_read.name], (reader.name, ours.strides[read.name])
