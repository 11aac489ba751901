"""QNN quantization capture with edgefuse: one op with one quantize/dequantize pair in and out.

Each norm is quantized with the released ``QnnQuantizer`` (16-bit activations, min/max observers),
calibrated on the very input it is checked on, so no value is outside its calibrated range and the
converted program differs from eager by rounding alone. The tolerance is then derived, element by
element, from the scales the converted graph holds (see :func:`one_op_bound`).
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

from edgefuse.core._fx import dtype_name
from edgefuse.quant.facts import DEQUANTIZE_CAST, NORM_KEY, NormQuantization, is_dequantize, is_quantize
from edgefuse.qnn.quantizer import (
    QnnUnavailable,
    capture,
    dequantize_in_float32,
    index_arithmetic,
    load_quantizer_module,
    qnn_available,
    qnn_quantizer,
    quantize_for_qnn,
)
from tests.harness import norm_perturbation

pytestmark = pytest.mark.slow  # quantizes and exports each model (capture, calibration, convert)

EPS = 1e-6
DIM = 64


class LlamaNorm(torch.nn.Module):
    """Hugging Face Llama's RMSNorm: normalize in float32, round to the input dtype, then the weight."""

    def __init__(self, dtype: torch.dtype, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter((1 + 0.1 * torch.randn(DIM, generator=gen)).to(dtype))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


class GemmaNorm(torch.nn.Module):
    """Gemma's RMSNorm: ``1 + w`` applied in float32, one cast at the end."""

    def __init__(self, dtype: torch.dtype, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter((0.1 * torch.randn(DIM, generator=gen)).to(dtype))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return (h * (1.0 + self.weight.float())).type_as(x)


class RoundsInside(torch.nn.Module):
    """A float32 norm that rounds the normalized tensor to float16 before its weight."""

    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(DIM, generator=gen))

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(torch.float16).to(torch.float32)


class Between(torch.nn.Module):
    """A Llama norm between two linears, whose annotation quantizes the norm's input and output."""

    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.first = torch.nn.Linear(DIM, DIM)
        self.norm = LlamaNorm(torch.float32, seed)
        self.last = torch.nn.Linear(DIM, DIM)
        with torch.no_grad():
            for linear in (self.first, self.last):
                linear.weight.copy_(torch.randn(DIM, DIM, generator=gen) / DIM**0.5)
                linear.bias.zero_()

    def forward(self, x):
        return self.last(self.norm(self.first(x)))


class Buckets(torch.nn.Module):
    """T5-like relative position buckets: float ops compute an embedding's indices."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Embedding(8, DIM)
        self.proj = torch.nn.Linear(DIM, DIM)

    def forward(self, x):
        position = torch.arange(x.shape[1])
        bucket = (torch.log(position.float() + 1) * 2.5).to(torch.long)
        return self.proj(x) + self.bias(bucket)


def sample(dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(1, 8, DIM, generator=gen)).to(dtype)


def _scale(dq) -> float:
    return float(dq.args[1])


def _rms_norm(converted):
    nodes = [n for n in converted.graph.nodes if n.target == torch.ops.aten.rms_norm.default]
    assert len(nodes) == 1, f"expected one rms_norm, found {len(nodes)}"
    return nodes[0]


def _through_cast(node):
    return node.args[0] if not is_dequantize(node) and node.args and is_dequantize(node.args[0]) else node


def one_op_scales(converted) -> tuple[float, float, float]:
    """The input, weight and output scales of the converted graph's one ``rms_norm``."""
    node = _rms_norm(converted)
    s_in = _scale(_through_cast(node.args[0]))
    s_w = _scale(_through_cast(node.args[2]))
    (q,) = [u for u in node.users if is_quantize(u)]
    return s_in, s_w, _scale(q)


def one_op_bound(x, weight, s_in, s_w, s_out, dtype) -> torch.Tensor:
    """The largest error a norm quantized as one op can have against eager, per element.

    ``y = w * x / r`` with ``r = sqrt(mean(x^2) + eps)``. The program reads ``x + dx`` and ``w + dw`` and
    rounds its output once more: ``|dx| <= s_in/2`` and ``|dw| <= s_w/2`` (16-bit rounding), each plus
    half a unit of ``dtype`` when the dequantized value is rounded to ``dtype``; the output quantization
    adds ``s_out/2``. To first order, ``|d(x_i/r)| <= dx_i/r + |x_i| * sum_j |x_j| dx_j / (D r^3)``.
    Float rounding adds two units in the last place of ``dtype`` at ``|y|``: eager rounds the normalized
    tensor and the product, the program rounds ``rms_norm``'s result and the dequantized output; and
    eight float32 units cover the float32 arithmetic of both.
    """
    half = torch.finfo(dtype).eps / 2
    x, w = x.double(), weight.double()
    n = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    dw = s_w / 2 + half * w.abs()
    y = (w * n).abs()
    return (
        norm_perturbation(x, w, s_in / 2 + half * x.abs(), EPS) + dw * n.abs() + s_out / 2
        + 2 * torch.finfo(dtype).eps * y + 8 * torch.finfo(torch.float32).eps * y
    )


def exact_norm(module, x) -> torch.Tensor:
    """The norm of ``x`` in float64 with the module's weight: what every rounding is measured from."""
    x = x.double()
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    w = module.weight.double()
    return n * (1 + w) if isinstance(module, GemmaNorm) else n * w


@pytest.fixture(scope="module")
def llama_runs():
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        module, x = LlamaNorm(dtype).eval(), sample(dtype)
        for mode in ("edgefuse", "none"):
            runs[dtype, mode] = (module, x, quantize_for_qnn(module, (x,), [(x,)], recompose=mode))
    return runs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_a_rebuilt_norm_is_one_op_with_one_pair_in_and_out(llama_runs, dtype):
    module, x, result = llama_runs[dtype, "edgefuse"]
    (decision,) = result.decisions
    assert decision.rebuilt, decision.reason
    (norm,) = result.norms
    assert norm.how == "one op", norm.describe()
    assert norm.annotated_ops == ("rms_norm",)
    assert (norm.pairs_in, norm.pairs_inside, norm.pairs_out, norm.pairs_constant) == (1, 0, 1, 1), norm.describe()

    _, _, decomposed = llama_runs[dtype, "none"]
    (pieces,) = decomposed.norms
    assert pieces.how == "pieces" and "rms_norm" not in pieces.ops, pieces.describe()
    # Each op's output is quantized: the input, the weight and eps, and every tensor but the output
    # read again (six in float32; seven in bfloat16, whose first cast to float32 is an op too).
    inside = {torch.float32: 6, torch.bfloat16: 7}[dtype]
    assert (pieces.pairs_in, pieces.pairs_inside, pieces.pairs_out, pieces.pairs_constant) == (1, inside, 1, 2), pieces.describe()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_the_one_op_norm_matches_eager_within_its_quantization_bound(llama_runs, dtype):
    module, x, result = llama_runs[dtype, "edgefuse"]
    with torch.no_grad():
        expected, actual = module(x).double(), result.converted(x).double()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    bound = one_op_bound(x, module.weight, *one_op_scales(result.converted), dtype)
    error = (actual - expected).abs()
    worst = int((error - bound).argmax())
    assert bool((error <= bound).all()), (
        f"error {float(error.flatten()[worst]):.3g} above its bound {float(bound.flatten()[worst]):.3g}"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_recomposition_does_not_make_the_norm_less_accurate(llama_runs, dtype):
    """Against the exact (float64) norm the rebuilt norm is at least as accurate as its pieces.

    Against eager bfloat16 it may differ by one unit more: the model rounds the normalized tensor and
    then the product, ``rms_norm`` rounds once, and the pieces reproduce eager's double rounding.
    """
    module, x, rebuilt = llama_runs[dtype, "edgefuse"]
    _, _, pieces = llama_runs[dtype, "none"]
    with torch.no_grad():
        exact = exact_norm(module, x)
        eager = module(x).double()
        ours, theirs = rebuilt.converted(x).double(), pieces.converted(x).double()
    assert float((ours - exact).abs().max()) <= float((theirs - exact).abs().max())
    unit = torch.finfo(dtype).eps * float(eager.abs().max())
    assert float((ours - eager).abs().max()) <= float((theirs - eager).abs().max()) + unit


TINY_MODELS = [("tiny-llama", torch.bfloat16), ("tiny-qwen3", torch.bfloat16), ("tiny-gemma3", torch.bfloat16),
               ("tiny-t5", torch.bfloat16), ("tiny-llama", torch.float32)]


def program_pairs(converted) -> int:
    """Every quantize/dequantize pair of a converted graph, counted as :mod:`edgefuse.quant.facts` counts
    a norm's: one per quantize node, and one per constant or graph input a dequantize reads directly."""
    nodes = list(converted.graph.nodes)
    direct = {n.args[0] for n in nodes if is_dequantize(n) and n.args[0].op in ("get_attr", "placeholder")}
    return sum(map(is_quantize, nodes)) + len(direct)


class RmsNormOperands(torch.fx.Interpreter):
    """Runs a converted graph and keeps, per ``rms_norm`` node, the weight it read."""

    def __init__(self, graph_module):
        super().__init__(graph_module)
        self.weights = {}

    def run_node(self, n):
        value = super().run_node(n)
        if n.target == torch.ops.aten.rms_norm.default:
            self.weights[n] = self.env[n.args[2]]
        return value


def _narrow(node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16)


def rebuilt_norm_bound(converted, key: str, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The largest error the rebuilt norm ``key`` of a whole converted model can have against the exact
    norm of the value ``x`` it read, per element, counting only the program's own roundings (the graph
    says which): the input rounded by a quantizer only where the norm kept a cast whose output is
    quantized before the ``rms_norm`` reads it (``dx = s_in/2``); the weight by its quantization
    (``s_w/2``) and, where its dequantized value is cast to ``dtype``, half a unit of it; the output by
    every quantize from the ``rms_norm`` on (``s_out/2`` each), and by half a unit of ``dtype`` for each
    result rounded to ``dtype`` (a half-precision ``rms_norm``, a kept downcast, a dequantize cast).
    First order as in :func:`one_op_bound` (:func:`harness.norm_perturbation`), and eight float32 units for
    the float32 arithmetic."""
    window = [n for n in converted.graph.nodes if n.meta.get(NORM_KEY) == key and n.op == "call_function"]
    (node,) = [n for n in window if n.target == torch.ops.aten.rms_norm.default]
    source = _through_cast(node.args[0])
    s_in = _scale(source) if is_dequantize(source) and source.args[0].args[0] in window else 0.0
    after = window[window.index(node):]
    quantizes = [u for n in after for u in n.users if is_quantize(u)]
    s_out = sum(map(_scale, quantizes))
    cast_back = sum(1 for q in quantizes if any(c.meta.get(DEQUANTIZE_CAST) for dq in q.users for c in dq.users))
    roundings = sum(map(_narrow, after)) + cast_back
    half = torch.finfo(dtype).eps / 2
    x, w = x.double(), weight.double()
    n = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    dw = _scale(_through_cast(node.args[2])) / 2 + (half * w.abs() if node.args[2].meta.get(DEQUANTIZE_CAST) else 0.0)
    y = (w * n).abs()
    return norm_perturbation(x, w, s_in / 2, EPS) + dw * n.abs() + s_out / 2 + roundings * half * y + 8 * torch.finfo(torch.float32).eps * y


@pytest.fixture(scope="module")
def tiny_flows():
    """A tiny model quantized for QNN rebuilt (``edgefuse``) and not (the ``casts`` flow), each model and
    dtype once: the model, its example, its calibration inputs and the two flows by mode. The accuracy
    test and the casts test read the same tiny Gemma3 flows."""
    from edgefuse.inputs.models import build_model
    from edgefuse.compare.quant_tables import calibration_inputs

    built = {}

    def flows(name, dtype):
        if (name, dtype) not in built:
            module, example = build_model(name, dtype, 0)
            calibration = calibration_inputs(example)
            built[name, dtype] = module, example, calibration, {
                mode: quantize_for_qnn(module, example, calibration, recompose=mode) for mode in ("edgefuse", "casts")}
        return built[name, dtype]

    return flows


@pytest.mark.parametrize("name, dtype", TINY_MODELS, ids=[f"{n}-{dtype_name(d)}" for n, d in TINY_MODELS])
def test_recomposition_never_makes_a_rebuilt_norm_of_a_tiny_model_less_accurate(tiny_flows, name, dtype):
    """Each norm edgefuse rebuilds, inside the whole quantized model, against the same graph not rebuilt.

    The baseline is the ``casts`` flow: edgefuse's graph before it rebuilds (casts that change nothing
    removed), so the two programs differ by the rebuilt norms alone. Each norm spans the same window in
    both (it reads the same model node and hands on to the same reader, casts it kept included; the
    pairs the norms save are the pairs the program saves), and is annotated as one op rebuilt and in
    pieces not. Its own error is what its readers got against the exact norm (float64 throughout) of
    the very input it read, over calibration and held-out inputs, both clamped to the range both flows'
    outputs represent (:mod:`edgefuse.quant.diagnose`): never higher rebuilt, always finite, and
    within the bound the program's own roundings give (:func:`rebuilt_norm_bound`), which a wrong
    weight or eps exceeds.
    The logits are not compared: there every quantized op downstream rounds, and a norm moved by a
    fraction of a step flips those roundings either way (``python -m edgefuse.tools.quant`` shows them).
    """
    from edgefuse.quant.diagnose import norm_ends, norm_runs, own_errors
    from edgefuse.compare.quant_tables import held_out_inputs

    module, example, calibration, flows = tiny_flows(name, dtype)
    runs = calibration + held_out_inputs(example, 4)
    rebuilt, baseline = flows["edgefuse"], flows["casts"]
    assert rebuilt.removed_casts == baseline.removed_casts
    keys = [n.key for n in rebuilt.norms if n.rebuilt]
    assert len(keys) == len([d for d in rebuilt.decisions if d.rebuilt]), "a rebuilt norm has no quantization facts"
    pieces = {n.key: n for n in baseline.norms}
    for norm in rebuilt.norms:
        if norm.key in keys:
            assert norm.how == "one op", norm.describe()
            assert pieces[norm.key].how in ("pieces", "partly") and "rms_norm" not in pieces[norm.key].ops
    saved = sum(n.pairs for n in baseline.norms) - sum(n.pairs for n in rebuilt.norms)
    assert saved == program_pairs(baseline.converted) - program_pairs(rebuilt.converted) > 0

    ours_ends, theirs_ends = norm_ends(rebuilt.converted), norm_ends(baseline.converted)
    windows = {k: ((ours_ends[k].source.name, ours_ends[k].reader.name), (theirs_ends[k].source.name, theirs_ends[k].reader.name))
               for k in keys}
    assert all(a == b for a, b in windows.values()), windows
    ours = norm_runs(rebuilt.converted, module.get_submodule, runs)
    own = own_errors(ours, norm_runs(baseline.converted, module.get_submodule, runs))
    worse = [f"{k}: {own[k].ours:.3g} > {own[k].theirs:.3g}" for k in keys
             if not own[k].ours <= own[k].theirs or not math.isfinite(own[k].ours)]
    assert not worse, worse

    operands = RmsNormOperands(rebuilt.converted)
    with torch.no_grad():
        operands.run(*runs[0])  # the weights are constants
    weights = {n.meta[NORM_KEY]: w for n, w in operands.weights.items()}
    for key in keys:
        for run in ours[key]:
            bound = rebuilt_norm_bound(rebuilt.converted, key, run.read, weights[key], dtype)
            error = (run.got.clamp(run.low, run.high) - run.exact.clamp(run.low, run.high)).abs()
            assert bool((error <= bound).all()), f"{key}: {float((error - bound).max()):.3g} beyond its bound"


def test_a_rebuilt_norm_covers_the_casts_its_decomposed_norm_covered(tiny_flows):
    """Tiny Gemma3 in bfloat16 keeps an upcast before and a ``type_as`` after each rebuilt float32 norm
    (its ``1 + w`` weight is float32, which a bfloat16 ``rms_norm`` would round). Those casts stay in
    the norm's window, so the pairs the norms are said to save are exactly the pairs the program saves."""
    *_, flows = tiny_flows("tiny-gemma3", torch.bfloat16)

    rebuilt = [n for n in flows["edgefuse"].norms if n.rebuilt]
    assert rebuilt and all(n.ops == ("to", "rms_norm", "type_as") for n in rebuilt), [n.ops for n in rebuilt]
    assert all(n.how == "one op" for n in rebuilt) and flows["edgefuse"].one_op == len(rebuilt) == 9
    saved_by_norms = sum(n.pairs for n in flows["casts"].norms) - sum(n.pairs for n in flows["edgefuse"].norms)
    assert saved_by_norms == program_pairs(flows["casts"].converted) - program_pairs(flows["edgefuse"].converted) > 0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-t5"])
def test_with_only_the_norms_quantized_recomposition_never_raises_the_logits_error(name):
    """Quantize the norms alone, rebuilt and not (the ``casts`` flow), of a float32 model, and compare the
    logits with the exact model (the same weights, float64 throughout) on held-out inputs: every other op is
    float32, so what differs is what the norms did.

    Not in bfloat16: there the rest of the model rounds every op to bfloat16 (eager alone is about 5e-3
    from the exact logits of tiny Llama), as much as the norms' quantization moves them, so the largest
    logit error goes either way by a fraction of a bfloat16 unit (tiny Llama, 8 held-out inputs: 3.446e-3
    rebuilt, 3.430e-3 not). Each rebuilt norm's own error is what the test above holds in bfloat16.
    """
    dtype = torch.float32

    from edgefuse.inputs.models import build_model
    from edgefuse.quant.exact import exact_module
    from edgefuse.compare.quant_tables import calibration_inputs, errors, held_out_inputs

    module, example = build_model(name, dtype, 0)
    exact = exact_module(module)
    calibration, others = calibration_inputs(example), held_out_inputs(example, 8)
    rebuilt, baseline = (
        quantize_for_qnn(module, example, calibration, recompose=mode, only_norms=True) for mode in ("edgefuse", "casts")
    )
    assert rebuilt.one_op > 0 and baseline.one_op == 0
    ours, theirs = errors(rebuilt.converted, exact, others), errors(baseline.converted, exact, others)
    assert ours.max <= theirs.max, f"{ours.max:.4g} > {theirs.max:.4g}"


def test_gemma_weight_is_folded_so_the_norm_is_one_op_where_stock_quantizes_its_pieces():
    dtype = torch.bfloat16
    module, x = GemmaNorm(dtype).eval(), sample(dtype)
    ours = quantize_for_qnn(module, (x,), [(x,)], recompose="edgefuse")
    stock = quantize_for_qnn(module, (x,), [(x,)], recompose="stock")
    # One float32 rms_norm (the 1 + w weight folded) between the model's upcast and type_as: the pair in,
    # the upcast's and the rms_norm's outputs quantized and read again, the weight; the final type_as is
    # left in float, as stock leaves it.
    (norm,) = ours.norms
    assert norm.how == "one op" and norm.ops == ("to", "rms_norm", "type_as"), norm.describe()
    assert (norm.pairs_in, norm.pairs_inside, norm.pairs_out, norm.pairs_constant) == (1, 2, 0, 1), norm.describe()
    (theirs,) = stock.norms
    assert theirs.how == "partly" and "rms_norm" not in theirs.ops, theirs.describe()
    # Nine ops quantized one by one and read again, the final type_as left in float (so nothing out),
    # and three constants: the weight, the 1 it is added to, and eps.
    assert (theirs.pairs_in, theirs.pairs_inside, theirs.pairs_out, theirs.pairs_constant) == (1, 9, 0, 3), theirs.describe()
    assert theirs.ops[-1] == "type_as" and theirs.quantized_ops == theirs.ops[:-1], theirs.describe()
    with torch.no_grad():
        expected, actual = module(x).double(), ours.converted(x).double()
    bound = one_op_bound(x, 1 + module.weight.float(), *one_op_scales(ours.converted), dtype)
    assert bool(((actual - expected).abs() <= bound).all())


def test_the_released_pass_inside_the_quantizer_would_drop_a_rounding_edgefuse_keeps():
    """edgefuse leaves a norm that rounds to float16 inside decomposed; the stock quantizer's own
    ``RecomposeRmsNorm`` then rebuilds it on ``x`` and drops the rounding, so edgefuse's quantizer runs
    its annotation pipeline without that pass."""
    module, x = RoundsInside().eval(), sample(torch.float32)
    ours = quantize_for_qnn(module, (x,), [(x,)], recompose="edgefuse")
    assert not ours.decisions[0].rebuilt and "float16" in ours.decisions[0].reason
    assert ours.norms[0].how in ("pieces", "partly") and "rms_norm" not in ours.norms[0].ops, ours.norms[0].describe()

    released = quantize_for_qnn(module, (x,), [(x,)], recompose="edgefuse", quantizer=qnn_quantizer(stock_recompose=True))
    node = _rms_norm(released.converted)
    source = _through_cast(node.args[0]).args[0].args[0]
    assert source.op == "placeholder", f"the released pass rebuilt the norm on {source}"
    with torch.no_grad():
        eager = module(x).double()
        unrounded = exact_norm(module, x)
        actual = released.converted(x).double()
    bound = one_op_bound(x, module.weight, *one_op_scales(released.converted), torch.float32)
    assert bool(((actual - unrounded).abs() <= bound).all()), "the rebuilt norm computes the unrounded norm"
    assert not bool(((actual - eager).abs() <= bound).all()), "and so misses the model's float16 rounding"


def test_dequantize_in_float32_rounds_a_16_bit_value_once():
    """``dequantize_per_tensor(out_dtype=bfloat16)`` rounds the integer to bfloat16 first; the fix does not."""
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (registers the quantized_decomposed ops)
    graph = torch.fx.Graph()
    q = graph.placeholder("q")
    scale, zero = 1e-4, 28573
    dq = graph.call_function(
        torch.ops.quantized_decomposed.dequantize_per_tensor.default,
        (q, scale, zero, 0, 65535, torch.int32),
        {"out_dtype": torch.bfloat16},
    )
    graph.output(dq)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    values = torch.arange(28573, 65535, 997, dtype=torch.int32)
    exact = ((values - zero).double() * scale).to(torch.bfloat16)
    assert not torch.equal(gm(values), exact)
    assert dequantize_in_float32(gm) == [dq.name]
    assert torch.equal(gm(values), exact)


def test_index_arithmetic_stays_in_float():
    module, x = Buckets().eval(), sample(torch.float32)
    names = index_arithmetic(capture(module, (x,)))
    assert {"log", "mul", "to"} <= {n.rstrip("_0123456789") for n in names}
    result = quantize_for_qnn(module, (x,), [(x,)], recompose="none")
    for node in result.converted.graph.nodes:
        if node.name in names:
            assert not any(is_quantize(u) for u in node.users), f"{node.name} was quantized"
    with torch.no_grad():
        assert torch.isfinite(result.converted(x)).all()


def test_a_norm_the_quantizer_did_not_annotate_is_not_one_op():
    """The linears around the norm quantize its input and output, so a pair enters the ``rms_norm`` and
    one leaves it whether or not the quantizer annotated it; only an annotated one is one op."""
    module, x = Between().eval(), sample(torch.float32)
    annotated = quantize_for_qnn(module, (x,), [(x,)])
    (norm,) = annotated.norms
    assert norm.how == "one op" and norm.annotated_ops == ("rms_norm",), norm.describe()

    quantizer = qnn_quantizer()
    quantizer.add_discard_nodes(norm.nodes)
    (skipped,) = quantize_for_qnn(module, (x,), [(x,)], quantizer=quantizer).norms
    assert skipped.ops == ("rms_norm",) and skipped.annotated_ops == (), skipped.describe()
    assert (skipped.pairs_in, skipped.pairs_out, skipped.pairs_constant) == (1, 1, 0), skipped.describe()
    assert skipped.how == "partly", skipped.describe()
    assert skipped.describe() == "one op (rms_norm), not annotated: 1 pair in, 0 inside, 1 out, 0 constant"


def test_a_quantizer_used_twice_quantizes_the_second_graph_as_a_fresh_one_would():
    """The index arithmetic of the first graph (``mul``, ``add``, ...) shares node names with the norm's
    ops in the second; a quantizer that kept the first graph's names would leave those ops unannotated."""
    x = sample(torch.float32)
    norm = LlamaNorm(torch.float32).eval()
    quantizer = qnn_quantizer()
    first = Buckets().eval()
    shared = index_arithmetic(capture(first, (x,))) & {n.name for n in capture(norm, (x,)).graph.nodes}
    assert shared, "the two graphs share no node name, so the test cannot tell"
    quantize_for_qnn(first, (x,), [(x,)], recompose="none", quantizer=quantizer)
    reused = quantize_for_qnn(norm, (x,), [(x,)], recompose="none", quantizer=quantizer).norms
    fresh = quantize_for_qnn(norm, (x,), [(x,)], recompose="none").norms
    assert reused == fresh and fresh[0].how == "pieces", [n.describe() for n in reused]
    assert quantizer.discard_nodes == set()


def test_describe_tells_apart_ops_of_the_same_name():
    norm = NormQuantization(
        key="norm", how="partly", ops=("pow", "mul", "mul"), quantized_ops=("pow", "mul"), annotated_ops=("mul",),
        pairs_in=1, pairs_inside=1, pairs_out=0, pairs_constant=0,
        nodes=("pow", "mul", "mul_1"), quantized_nodes=("pow", "mul"),
    )
    assert norm.describe() == "3 ops, 2 output quantized, 1 in float (mul): 1 pair in, 1 inside, 0 out, 0 constant"


def test_the_pinned_executorch_ships_the_quantizer():
    """The QNN tests fail rather than skip: with the pinned ExecuTorch the quantizer imports."""
    assert qnn_available() is None


def test_a_missing_quantizer_is_a_clear_error():
    with pytest.raises(QnnUnavailable, match="importing executorch.backends.qualcomm.quantizer.absent failed"):
        load_quantizer_module("executorch.backends.qualcomm.quantizer.absent")


def test_building_the_quantizer_downloads_nothing_and_restores_the_environment():
    """``QnnQuantizer()`` would run the SDK set-up, which downloads the SDK; edgefuse's never reaches the network."""
    from executorch.backends.qualcomm.utils import qnn_sdk_setup

    events: list[str] = []
    recording = [True]

    def hook(event, args):
        if recording[0] and event in ("socket.getaddrinfo", "socket.connect", "urllib.Request"):
            events.append(f"{event} {str(args)[:120]}")

    before = os.environ.get("QNN_SDK_ROOT")
    sys.addaudithook(hook)
    try:
        quantizer = qnn_quantizer()
    finally:
        recording[0] = False
    assert quantizer is not None
    assert events == []
    assert os.environ.get("QNN_SDK_ROOT") == before
    if before is None:
        assert not qnn_sdk_setup._sdk_ready


def test_at_8a8w_a_rebuilt_norm_on_a_shape_qnn_gets_wrong_is_viewed_and_its_pairs_are_the_programs():
    """On ``[2, 8, 64]`` (dims before the last two not all 1) QNN computes 8a8w norms wrong, so the norm is
    rebuilt on a ``[1, 16, 64]`` view. Each view gets a quantize/dequantize pair with its input's encoding:
    the norm's window holds the views and counts their pairs inside it, so the pairs the norms are said to
    save are the pairs the program saves; the converted norm stays within its one-op bound, and gives
    exactly what the same norm rebuilt without the views gives (the views round nothing)."""
    import dataclasses

    import edgefuse.core.profiles
    from edgefuse.core.profiles import PROFILES

    dtype = torch.float32
    module, x = LlamaNorm(dtype).eval(), 2 * torch.randn(2, 8, DIM, generator=torch.Generator().manual_seed(1))
    ours = quantize_for_qnn(module, (x,), [(x,)], recompose="edgefuse", quant_dtype="use_8a8w")
    (decision,) = ours.decisions
    assert decision.rebuilt and "[1, 16, 64] view" in decision.note and "in 8a8w" in decision.note
    (norm,) = ours.norms
    assert norm.how == "one op" and norm.views == 2 and norm.ops == ("view", "rms_norm", "view"), norm.describe()
    assert (norm.pairs_in, norm.pairs_inside, norm.pairs_out, norm.pairs_constant) == (1, 2, 1, 1), norm.describe()
    pieces = quantize_for_qnn(module, (x,), [(x,)], recompose="casts", quant_dtype="use_8a8w")
    saved = sum(n.pairs for n in pieces.norms) - sum(n.pairs for n in ours.norms)
    assert saved == program_pairs(pieces.converted) - program_pairs(ours.converted) > 0

    with torch.no_grad():
        expected, actual = module(x).double(), ours.converted(x).double()
    bound = one_op_bound(x, module.weight, *one_op_scales(ours.converted), dtype)
    assert bool(((actual - expected).abs() <= bound).all())

    qnn = PROFILES["qnn"]
    limits = tuple(dataclasses.replace(l, precisions=l.precisions - {"8a8w"}) for l in qnn.limits)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(edgefuse.core.profiles.PROFILES, "qnn", dataclasses.replace(qnn, limits=limits))
        unviewed = quantize_for_qnn(module, (x,), [(x,)], recompose="edgefuse", quant_dtype="use_8a8w")
    assert unviewed.norms[0].views == 0
    with torch.no_grad():
        assert torch.equal(ours.converted(x), unviewed.converted(x))


def _recipe(default: str, *strategies):
    """A released ``QuantRecipe`` at ``default`` with ``strategies`` (``(kind, what, dtype, priority)``)."""
    from executorch.backends.qualcomm.quantizer.quant_recipe import QuantGranularity, QuantRecipe

    from torchao.quantization.pt2e import MinMaxObserver

    dtypes = load_quantizer_module().QuantDtype
    tensor = dict(act_observer=MinMaxObserver, granularity=QuantGranularity.PER_TENSOR)
    recipe = QuantRecipe(getattr(dtypes, default), False, **tensor)
    for kind, what, dtype, priority in strategies:
        getattr(recipe, kind)(what, getattr(dtypes, dtype), False, priority=priority, **tensor)
    quantizer = qnn_quantizer(quant_dtype=default)
    quantizer.set_recipe(recipe)
    return quantizer


def test_a_recipe_keyed_on_rms_norm_sets_the_precision_of_the_norm_edgefuse_rebuilds():
    """ExecuTorch's recipes pick a config by op target; edgefuse asks about the ``rms_norm`` it will build,
    not about the pieces' output, so a 16a8w recipe with ``rms_norm`` at 8a8w has the norm viewed."""
    quantizer = _recipe("use_16a8w", ("add_node_target", {torch.ops.aten.rms_norm.default}, "use_8a8w", 1))
    module, x = LlamaNorm(torch.float32).eval(), torch.randn(2, 8, DIM, generator=torch.Generator().manual_seed(1))
    ours = quantize_for_qnn(module, (x,), [(x,)], quantizer=quantizer)
    (decision,) = ours.decisions
    assert decision.rebuilt and "[1, 16, 64] view" in decision.note and "in 8a8w" in decision.note
    assert ours.norms[0].views == 2, ours.norms[0].describe()


def test_a_recipe_s_strategies_are_read_by_priority_then_order():
    """Two strategies match the norm: the one of higher priority, added second, gives its precision."""
    from edgefuse.qnn.quantizer import norm_precision

    norm = torch.ops.aten.rms_norm.default
    quantizer = _recipe("use_16a8w", ("add_node_target", {norm}, "use_16a16w", 1), ("add_node_target", {norm}, "use_8a8w", 2))
    gm = capture(torch.nn.RMSNorm(DIM), (torch.randn(2, 8, DIM),))
    (node,) = [n for n in gm.graph.nodes if n.target == norm]
    assert norm_precision(quantizer)(node) == "8a8w"


def test_an_object_that_is_not_a_qnn_quantizer_has_a_precision_not_known():
    from edgefuse.core.profiles import QUANTIZED
    from edgefuse.qnn.quantizer import norm_precision

    assert norm_precision(object()) == QUANTIZED
