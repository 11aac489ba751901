"""Quantized XNNPACK flows (qs8, 8da4w) lowered with edgefuse: means inside the delegate, right axes.

Every program is serialized, loaded in ``executorch.runtime`` and run; its outputs are compared with the
eager run of the same quantized program (the converted module for qs8, the source-transformed module for
8da4w), at tolerances derived from the quantization scales and bit widths each test states. A bfloat16
quantized program leaves its quantized ops outside the delegate, stock or edgefuse, and the released
runtime has no kernel for them: that outcome is asserted instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch.export import export

from edgefuse.xnnpack import quantizer as qx
from edgefuse.quant.facts import is_dequantize, is_quantize
from edgefuse.core._fx import ops_outside
from edgefuse.xnnpack.inspect import node_type_counts, node_types, run_pte, to_pte
from tests.harness import norm_perturbation

pytestmark = pytest.mark.slow

EPS = 1e-6
DIM = 64
F32 = torch.finfo(torch.float32).eps
F16 = torch.finfo(torch.float16).eps
CAST = "dim_order_ops._to_dim_order_copy.default"


class Norm(torch.nn.Module):
    """Hugging Face Llama's RMSNorm in float32."""

    def __init__(self, gen: torch.Generator):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(DIM, generator=gen))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(x.dtype)


class Block(torch.nn.Module):
    """A pre-norm residual block ``x + W norm(x)``, and optionally a second norm of its output (and then
    the first norm's output too, which no quantized op touches)."""

    def __init__(self, second_norm: bool = False, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.norm = Norm(gen)
        self.proj = torch.nn.Linear(DIM, DIM, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(DIM, DIM, generator=gen) / DIM**0.5)
        self.after = Norm(gen) if second_norm else None

    def forward(self, x):
        a = self.norm(x)
        y = x + self.proj(a)
        return (y, self.after(y), a) if self.after is not None else y


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Eager torch runs on one thread while these tests run; the thread count is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def inputs(count: int, seed: int = 1) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 8, DIM, generator=gen),) for _ in range(count)]


def to_dtype(runs, dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(t.to(dtype) for t in args) for args in runs]


def means_outside(lowered) -> list[str]:
    return [op for op in ops_outside(lowered) if "mean" in op]


def _flat(value) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else [t for v in value for t in _flat(v)]


@pytest.fixture(scope="module")
def qs8():
    block = Block().eval()
    calibration = inputs(4)
    quantized = qx.quantize_qs8(block, calibration[0], calibration)
    program = qx.export_quantized(quantized, calibration[0])
    lowered = {how: qx.lower(program, how) for how in (qx.STOCK, qx.EDGEFUSE)}
    return block, calibration, quantized, lowered


def test_qs8_norm_mean_is_delegated_and_the_norm_is_quantized_around_its_float_core(qs8):
    """qs8 annotates a norm's ``add`` (eps) and multiplies, which quantize what they read; ``pow`` is not
    annotated, so the mean reads a float tensor and edgefuse delegates it: one delegate, where stock has
    the mean on the portable kernel between two."""
    block, _, quantized, lowered = qs8
    (norm,) = quantized.norms
    assert norm.how == "partly", norm.describe()
    assert norm.annotated_ops == ("add", "mul", "mul") and "pow" not in norm.quantized_ops, norm.describe()
    (mean,) = [n for n in quantized.module.graph.nodes if n.target == torch.ops.aten.mean.dim]
    assert not is_dequantize(mean.args[0])
    assert means_outside(lowered[qx.STOCK]) == ["aten.mean.dim"]
    assert len(node_types(lowered[qx.STOCK])) == 2
    assert means_outside(lowered[qx.EDGEFUSE]) == []
    assert len(node_types(lowered[qx.EDGEFUSE])) == 1
    assert "XNNFullyConnected" in node_types(lowered[qx.EDGEFUSE])[0]


def test_qs8_programs_match_the_quantized_eager_program(qs8):
    """Tolerance: one step of the output's int8 scale plus one step of each quantized tensor the final
    ``add`` reads. The delegate computes each quantized op in integers and can round a value on a tie
    the other way than the float reference, at the output and in the tensor before it."""
    _, calibration, quantized, lowered = qs8
    graph = quantized.module.graph
    (output,) = [n for n in graph.nodes if n.op == "output"]
    out_dq = output.args[0][0] if isinstance(output.args[0], (list, tuple)) else output.args[0]
    assert is_dequantize(out_dq) and is_quantize(out_dq.args[0])
    last = out_dq.args[0].args[0]
    steps = [float(out_dq.args[1])] + [float(a.args[1]) for a in last.all_input_nodes if is_dequantize(a)]
    allowed = sum(steps)
    for how, program in lowered.items():
        pte = to_pte(program)
        for args in calibration:
            with torch.no_grad():
                expected = quantized.module(*args)
            (actual,) = run_pte(pte, args)
            error = float((actual - expected).abs().max())
            assert error <= allowed, f"{how}: error {error:.3g} above {allowed:.3g} ({len(steps)} steps)"


def assert_8da4w_block_matches(block: Block, quantized, pte: bytes, runs, unit: float) -> None:
    """Run a two-norm 8da4w ``Block`` program and hold it to the quantized eager module, per element.

    Tolerance for ``y = x + W a`` (``a`` the first norm's output), per output element ``i``: XNNPACK and
    torchao's reference may quantize an activation one step apart (step ``s`` = the token's int8 range over
    255), which moves ``y_i`` by at most ``s * sum_j |W_ij|``; XNNPACK stores the group scales in bfloat16,
    which moves each weight by at most 2^-9 of itself, ``2^-9 * sum_j |W_ij a_j|``; the float sums and
    roundings (``unit``, the model dtype's) add eight units at ``sum_j |W_ij a_j| + |x_i|``. The second
    norm's tolerance is the first-order movement of a norm whose input moves by ``y``'s tolerance, plus
    eight units.

    Those bounds are wide enough to hide a norm computed a little wrong, so the first norm's output,
    float on both sides, is held to float32 rounding. With ``u`` half a float32 unit, each side's sum of
    DIM squares is within ``(DIM - 1) u`` of exact, relative, and the mean's scaling within two more;
    the square root halves that, about ``(DIM / 2 + 1) u``; eps, rsqrt (XNNPACK's within a few ``u``)
    and the multiply add about ``6 u``: ``(DIM / 2 + 8) u`` per side, so ``(DIM / 2 + 8)`` float32 units
    between the two sides at ``|a|``. Both sides then round to the model dtype, which can land them one
    unit of it apart, and the weight multiply in that dtype rounds once more: two of its units.
    """
    weight = quantized.module.proj.weight.dequantize().double()
    for args in runs:
        x = args[0]
        with torch.no_grad():
            y_expected, z_expected, a_expected = (t.double() for t in quantized.module(*args))
            a = block.norm(x).double()
        low = torch.minimum(a.amin(-1, keepdim=True), torch.zeros(()))
        high = torch.maximum(a.amax(-1, keepdim=True), torch.zeros(()))
        step = (high - low) / 255
        products = (a.abs() @ weight.abs().T)
        dy = step * weight.abs().sum(-1) + 2**-9 * products + 8 * unit * (products + x.double().abs())
        dz = norm_perturbation(y_expected, block.after.weight, dy) + 8 * unit * z_expected.abs()
        y_actual, z_actual, a_actual = (t.double() for t in run_pte(pte, args))
        da = ((DIM / 2 + 8) * F32 + 2 * unit) * a_expected.abs()
        assert bool(((a_actual - a_expected).abs() <= da).all()), f"norm off by {float((a_actual - a_expected).abs().max()):.3g}"
        assert bool(((y_actual - y_expected).abs() <= dy).all()), f"y off by {float((y_actual - y_expected).abs().max()):.3g}"
        assert bool(((z_actual - z_expected).abs() <= dz).all()), f"z off by {float((z_actual - z_expected).abs().max()):.3g}"


def test_8da4w_block_lowers_to_one_delegate_and_matches_the_quantized_eager_program():
    """8da4w: int4 weights in groups of 32, int8 activations quantized per token at run time; norms float."""
    block = Block(second_norm=True).eval()
    example = inputs(1)[0]
    quantized = qx.quantize_8da4w(block)
    program = qx.export_quantized(quantized, example)
    lowered = qx.lower(program, qx.EDGEFUSE)
    assert means_outside(lowered) == [] and len(node_types(lowered)) == 1
    assert_8da4w_block_matches(block, quantized, to_pte(lowered), inputs(3, seed=5), F32)


def test_float16_8da4w_block_keeps_the_norms_casts_and_means_in_one_delegate():
    """A float16 model whose norms compute in float32 (Hugging Face Llama's): stock leaves each norm's
    upcast, mean and downcast on the portable kernel, six delegates for two norms; edgefuse lowers the
    casts as XNNPACK converts and the means as its own, one delegate. Tolerance as in
    :func:`assert_8da4w_block_matches`, in float16 units."""
    block = Block(second_norm=True).half().eval()
    (example,) = to_dtype(inputs(1), torch.float16)
    quantized = qx.quantize_8da4w(block)
    program = qx.export_quantized(quantized, example)
    stock, ours = qx.lower(program, qx.STOCK), qx.lower(program, qx.EDGEFUSE)
    assert sorted(ops_outside(stock)) == sorted(["aten.mean.dim"] * 2 + [CAST] * 4), ops_outside(stock)
    assert len(node_types(stock)) == 6
    assert ops_outside(ours) == [] and len(node_types(ours)) == 1
    # the four norm casts became converts, beside the one that quantizes the linear's activations
    assert node_type_counts(ours)["XNNConvert"] == node_type_counts(stock)["XNNConvert"] + 4
    assert_8da4w_block_matches(block, quantized, to_pte(ours), to_dtype(inputs(3, seed=5), torch.float16), F16)


class LinearOperands(torch.fx.Interpreter):
    """Runs a quantized graph and keeps the dequantized activations and weight its one linear reads."""

    def call_function(self, target, args, kwargs):
        if target == torch.ops.aten.linear.default:
            self.activations, self.weight = args[0], args[1]
        return super().call_function(target, args, kwargs)


def test_float16_qs8_block_lowers_the_norms_casts_and_mean_into_one_delegate_within_one_output_step_of_eager():
    """qs8 of a float16 block whose norm computes in float32. The pinned quantizer annotates the linear,
    and ``add`` and ``mul`` only where they read float32 tensors: the norm's float32 core is quantized
    around its float square and mean; its casts, weight multiply and the residual add stay float16
    (unquantized). Stock leaves the two casts and the mean on the portable kernel between three
    delegates; edgefuse lowers the casts as XNNPACK converts and the mean as its own, one delegate.

    Tolerance for ``y = x + d``, ``d`` the linear's dequantized output (int8 step ``s``), per element: the
    delegate computes the norm's float core in another order (its mean as a fully-connected), so an
    int8 activation of the linear can land one step ``a`` of its scale away on a tie: ``a * sum_j |W_ij|``
    bounds every such flip at once. On the same activations the delegate sums in integers; the
    reference computes the linear in float16 on float16 dequantized activations and weights (a half unit
    each, a half unit at the output, float32 accumulation of 64 products), which the test checks stays
    below one step, so its int8 output lands at most one step away: ``s``. Dequantizing ``d`` rounds to
    float16 once in the reference and twice in the delegate (XNNPACK's convert holds the scale in
    float16): three half units at ``|d| <= |x| + |y|``, two of them at ``|d| + s``; ``y`` is rounded on
    both sides, a half unit at ``|y|`` and one at ``|y| + s``.
    """
    block = Block().half().eval()
    calibration = to_dtype(inputs(4), torch.float16)
    quantized = qx.quantize_qs8(block, calibration[0], calibration)
    graph = quantized.module.graph
    (mean,) = [n for n in graph.nodes if n.target == torch.ops.aten.mean.dim]
    assert not is_dequantize(mean.args[0])
    (linear,) = [n for n in graph.nodes if n.target == torch.ops.aten.linear.default]
    (output_q,) = [u for u in linear.users if is_quantize(u)]
    step = float(output_q.args[1])
    assert is_dequantize(linear.args[0])
    activation_step = float(linear.args[0].args[1])

    program = qx.export_quantized(quantized, calibration[0])
    stock, ours = qx.lower(program, qx.STOCK), qx.lower(program, qx.EDGEFUSE)
    assert sorted(ops_outside(stock)) == sorted(["aten.mean.dim"] + [CAST] * 2), ops_outside(stock)
    assert len(node_types(stock)) == 3
    assert ops_outside(ours) == [] and len(node_types(ours)) == 1
    assert node_type_counts(ours)["XNNConvert"] == node_type_counts(stock)["XNNConvert"] + 2

    ptes = {qx.STOCK: to_pte(stock), qx.EDGEFUSE: to_pte(ours)}
    for args in to_dtype(inputs(3, seed=5), torch.float16):
        operands = LinearOperands(quantized.module)
        with torch.no_grad():
            y = operands.run(*args).double()
        products = operands.activations.double().abs() @ operands.weight.double().abs().T
        drift = (3 * F16 / 2 + DIM * F32 / 2) * products
        assert float(drift.max()) < step, "the float16 reference linear may miss by more than one step"
        x = args[0].double()
        flips = activation_step * operands.weight.double().abs().sum(-1)
        allowed = step + flips + F16 / 2 * (3 * x.abs() + 5 * y.abs() + 3 * step)
        for how, pte in ptes.items():
            (actual,) = run_pte(pte, args)
            error = (actual.double() - y).abs()
            assert bool((error <= allowed).all()), f"{how}: off by {float(error.max()):.3g}, allowed {float(allowed.min()):.3g}"


def missing_out_variants(program) -> set[str]:
    """The ops ``to_executorch`` names as having no out variant; empty when the program serializes."""
    try:
        to_pte(program)
    except RuntimeError as error:
        found = re.search(r"Missing out variants: \{(.*)\}", str(error))
        if found is None:
            raise
        return {name.strip(" '") for name in found.group(1).split(",")}
    return set()


#: The ops of a bfloat16 program of each scheme that the delegate leaves outside and that need an out variant.
BFLOAT16_OPS_OUTSIDE = {
    "qs8": {f"quantized_decomposed::{op}" for op in ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel")},
    "8da4w": {f"torchao::{op}" for op in ("choose_qparams_affine", "quantize_affine", "dequantize_affine")},
}


def has_out_variant(qualified_name: str) -> bool:
    """Whether this process has registered an ``out`` overload of the op: importing some ExecuTorch modules
    (the QNN quantizer among them) loads the quantized kernels library, which registers them."""
    # An op packet caches its overload names when first touched, so ask the registry itself.
    return any(schema.overload_name == "out" for schema in torch._C._jit_get_schemas_for_operator(qualified_name))


@pytest.mark.parametrize("scheme", qx.SCHEMES)
def test_bfloat16_quantized_block_is_refused_at_serialization_by_stock_and_edgefuse_alike(scheme):
    """In bfloat16 the delegate takes no quantize or dequantize op of a bfloat16 tensor (nor the linear
    between them): both lowerings leave the same ops outside but the mean, which edgefuse delegates, and
    ``to_executorch`` refuses both programs, naming the quantized ops without an out variant in this
    process (all of them, unless a module that loads ExecuTorch's quantized kernels library, such as the
    QNN quantizer, was imported first, as a pytest worker may have done: the test below shows the
    refusal in a fresh process)."""
    block = Block().to(torch.bfloat16).eval()
    calibration = to_dtype(inputs(2), torch.bfloat16)
    quantized = qx.quantize(scheme, block, calibration[0], calibration)
    program = qx.export_quantized(quantized, calibration[0])
    stock, ours = qx.lower(program, qx.STOCK), qx.lower(program, qx.EDGEFUSE)
    outside = sorted(ops_outside(ours))
    assert sorted(ops_outside(stock)) == sorted(outside + ["aten.mean.dim"])
    quantized_ops = {op.rsplit(".", 1)[0].replace(".", "::", 1) for op in outside if op.startswith(("quantized_decomposed.", "torchao."))}
    assert quantized_ops == BFLOAT16_OPS_OUTSIDE[scheme]
    without_kernel = {op for op in quantized_ops if not has_out_variant(op)}
    assert missing_out_variants(stock) == missing_out_variants(ours) == without_kernel


def test_the_bfloat16_refusal_holds_in_a_process_without_the_quantized_kernels():
    """The refusal is a fact of the released stack, not of test order: in a fresh process, the qs8
    bfloat16 block lowered by edgefuse is refused for every quantized op it leaves outside."""
    import subprocess
    import sys

    probe = (
        "import sys, torch\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from tests.quant.test_quantized_xnnpack import Block, inputs, to_dtype, qx, missing_out_variants\n"
        "calibration = to_dtype(inputs(2), torch.bfloat16)\n"
        "quantized = qx.quantize('qs8', Block().to(torch.bfloat16).eval(), calibration[0], calibration)\n"
        "program = qx.export_quantized(quantized, calibration[0])\n"
        "print(sorted(missing_out_variants(qx.lower(program, qx.EDGEFUSE))))"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(Path(__file__).parents[2])], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(sorted(BFLOAT16_OPS_OUTSIDE["qs8"]))


class IndexedScale(torch.nn.Module):
    """Integer index arithmetic (``arange * 2 + 1``) picking positions of a tensor that is scaled and shifted."""

    def forward(self, x):
        positions = torch.arange(x.shape[1] // 2) * 2 + 1
        return x[:, positions] * 0.5 + 1.0


def test_qs8_lifts_the_scalars_of_float_ops_and_keeps_integer_index_arithmetic():
    """The float ``mul``/``add`` read their scalars as quantized constants; the integer ones keep their
    integer scalars, so the indices stay integers and calibration runs."""
    calibration = inputs(2)
    quantized = qx.quantize_qs8(IndexedScale().eval(), calibration[0], calibration)
    graph = quantized.module.graph
    arithmetic = [n for n in graph.nodes if n.target in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)]
    integer = [n for n in arithmetic if not n.meta["val"].dtype.is_floating_point]
    floating = [n for n in arithmetic if n.meta["val"].dtype.is_floating_point]
    assert [n.args[1] for n in integer] == [2, 1]
    assert len(floating) == 2
    for node in floating:
        dq = node.args[1]
        assert is_dequantize(dq) and dq.args[0].op == "get_attr", node.format_node()
    assert not any(n.op == "get_attr" and not n.users for n in graph.nodes)
    # Each quantized activation on the way is off by at most half its step; the constants 0.5 and 1.0
    # are exact in int8 and the scaling by 0.5 only shrinks an error.
    allowed = sum(float(q.args[1]) / 2 for q in graph.nodes if is_quantize(q))
    for (x,) in calibration:
        with torch.no_grad():
            (actual,) = _flat(quantized.module(x))
        error = float((actual - (x[:, 1::2] * 0.5 + 1.0)).abs().max())
        assert error <= allowed, f"error {error:.3g} above {allowed:.3g}"


MEANS = {"pooling": [2, 3], "channels": [1], "width": [-1]}


class ConvAndMeans(torch.nn.Module):
    """A convolution of the input and three means of it: over dims [2, 3], over channels, over width."""

    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)
        with torch.no_grad():
            bound = 1 / (4 * 3 * 3) ** 0.5
            self.conv.weight.copy_(bound * (2 * torch.rand(6, 4, 3, 3, generator=gen) - 1))
            self.conv.bias.copy_(bound * (2 * torch.rand(6, generator=gen) - 1))

    def forward(self, x):
        return (self.conv(x), *(x.mean(dims, keepdim=True) for dims in MEANS.values()))


def conv_and_means_behind_one_pair():
    """qs8 convolution of a channels-last input, and means of the same quantized input.

    Each mean reads its own dequantize of the quantize the convolution's input goes through: how
    ``convert_pt2e`` leaves a tensor whose readers share its quantization.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 5, 7, generator=gen).to(memory_format=torch.channels_last)
    module = ConvAndMeans().eval()
    prepared = prepare_pt2e(export(module, (x,)).module(), qx.qs8_quantizer())
    prepared(x)
    converted = convert_pt2e(prepared)
    graph = converted.graph
    (conv,) = [n for n in graph.nodes if n.target == torch.ops.aten.conv2d.default]
    dq = conv.args[0]
    for mean in [n for n in graph.nodes if n.target == torch.ops.aten.mean.dim]:
        with graph.inserting_after(dq):
            own = graph.call_function(dq.target, dq.args, dict(dq.kwargs))
        mean.replace_input_with(mean.args[0], own)
    converted.recompile()
    return converted, x, dq


def _misread(x: torch.Tensor) -> torch.Tensor:
    """The channels-last buffer of ``x`` read as if it were contiguous NCHW: what wrong axes reduce."""
    n, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).contiguous().view(n, c, h, w)


def test_channels_last_input_behind_a_pair_feeds_means_and_a_convolution_on_the_right_axes():
    """The convolution's output is int8: one step of its scale covers an integer kernel rounding a tie the
    other way. A mean's output is float: the delegate's global average pooling (dims [2, 3]) sums the same
    dequantized values in another order, eight float32 units at its magnitude; a channel or width mean of
    a dequantized tensor keeps the stock path (portable kernel on the same values). Each tolerance is
    checked to be far below what a mean over the misread layout would give."""
    converted, x, dq = conv_and_means_behind_one_pair()
    program = export(converted, (x,))
    lowered = qx.lower(program, qx.EDGEFUSE)
    with torch.no_grad():
        conv_expected, *means_expected = converted(x)
        xq = torch.ops.quantized_decomposed.dequantize_per_tensor(
            torch.ops.quantized_decomposed.quantize_per_tensor(x, *dq.args[1:]), *dq.args[1:]
        )
    conv_actual, *means_actual = run_pte(to_pte(lowered), (x,))

    conv_q = [u for n in converted.graph.nodes if n.target == torch.ops.aten.conv2d.default for u in n.users][0]
    assert float((conv_actual - conv_expected).abs().max()) <= float(conv_q.args[1])
    for name, dims, actual, expected in zip(MEANS, MEANS.values(), means_actual, means_expected):
        allowed = 8 * F32 * max(float(expected.abs().max()), 1.0)
        wrong = _misread(xq).mean(dims, keepdim=True)
        assert float((wrong - expected).abs().max()) > 100 * allowed, f"{name}: the check cannot tell the axes apart"
        assert actual.shape == expected.shape, name
        assert float((actual - expected).abs().max()) <= allowed, f"{name}: {float((actual - expected).abs().max()):.3g}"

    placements = dict(zip(MEANS, qx.mean_placements(program, lowered)))
    for name, placement in placements.items():
        assert placement.reads == "dequantized" and "mean of a dequantized tensor" in placement.reason, name
    assert placements["pooling"].delegated
    assert any("XNNGlobalAvgPooling2d" in types for types in node_types(lowered))
    assert not placements["channels"].delegated and not placements["width"].delegated
    assert len(means_outside(lowered)) == 2
