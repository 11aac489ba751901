"""Write a :class:`~edgefuse.fuzz.spec.CaseSpec` out as Python source, and build modules from it.

The fuzzer runs exactly the source a reproducer file holds: :func:`build` executes the text
:func:`source` returns, so a reproducer rebuilds the same module, weights and inputs without edgefuse's
generator (weights and inputs come from seeded ``torch.Generator`` draws, not from stored numbers).

The source holds no text of the spec's own: each name a spec holds picks a fixed snippet from a table
here (an unknown name raises ``ValueError``), and each number is written as the ``repr`` of an ``int``
or ``float`` (anything else raises), so a spec read from a file cannot put code into what is executed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from edgefuse.core import forms as registry
from edgefuse.fuzz import spec as _spec
from edgefuse.fuzz.spec import (
    DTYPES,
    HEADS_VIEWS,
    SCALED,
    CastSpec,
    CaseSpec,
    NormSpec,
    WeightSpec,
    normalized_shape,
)

HEADER = '''import math

import torch
from torch import nn


def _rand(shape, seed, scale=1.0, around=0.0, dtype=torch.float32):
    """Seeded normal draws, ``around + scale * randn``, rounded to ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    return (around + scale * torch.randn(shape, generator=generator, dtype=torch.float64)).to(dtype)
'''

_METHODS = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double"}
_DTYPES = {name: f"torch.{name}" for name in DTYPES}
#: The source of each way to square ``v`` (the registry's, then the near misses'), to apply the root of
#: ``a`` (the registry's spellings, then a reciprocal by ``1.0 /``, which stays decomposed), and of each
#: tensor that is scaled. Keyed by name, never zipped by position, so a new spelling maps to its own text.
SQUARE_SOURCE = {
    **{name: text.format(v="v") for name, text in registry.SQUARES.items()},
    "pow3": "v.pow(3)",
    "mul3": "v * v * v",
    "product": "v * yv",
}
INVERSE_SOURCE = {
    **{name: spelling.source.format(a="a") for name, spelling in registry.SPELLINGS.items()},
    "one-over-sqrt": "1.0 / torch.sqrt(a)",
}
#: The spellings that divide the scaled tensor by the root (``h / source``) rather than multiply it.
DIVIDES = frozenset(name for name, spelling in registry.SPELLINGS.items() if spelling.divides)
SCALED_SOURCE = dict(zip(SCALED, ("h", "y", "h.to({via}).to(h.dtype)")))
VIEW_SOURCE = {name: name for name in HEADS_VIEWS}  # the Tensor methods of the same names


def _pick(table: dict, value: object, what: str) -> str:
    """The snippet ``table`` holds for ``value``: never ``value``'s own text."""
    if isinstance(value, str) and value in table:
        return table[value]
    raise ValueError(f"{what} {value!r} is not one the renderer knows")


def _named(value: object, names: Sequence[str], what: str) -> str:
    """``value``, one of ``names`` (the spec's fixed set), for a docstring."""
    if isinstance(value, str) and value in names:
        return value
    raise ValueError(f"{what} {value!r} is not one of the fuzzer's")


def _int(value: object) -> str:
    if type(value) is not int:
        raise ValueError(f"{value!r} is not an integer")
    return repr(value)


def _num(value: float | int) -> str:
    if type(value) not in (int, float):
        raise ValueError(f"{value!r} is not a number")
    if math.isnan(value):
        return "float('nan')"
    if math.isinf(value):
        return "float('inf')" if value > 0 else "float('-inf')"
    return repr(value)


def _dt(name: str) -> str:
    return _pick(_DTYPES, name, "dtype")


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(_int, shape)) + ("," if len(shape) == 1 else "") + ")"


def _ints(values: Sequence[int]) -> str:
    return ", ".join(map(_int, values))


def _memory_format(rank: int, channels_last: bool) -> str:
    if not channels_last:
        return "torch.contiguous_format"
    return "torch.channels_last_3d" if rank == 5 else "torch.channels_last"


class _Init:
    """Collects the statements of an ``__init__``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.probes: set[str] = set()

    def probe(self, dtype: str) -> str:
        if dtype not in self.probes:
            self.probes.add(dtype)
            # _dt refuses a name it has no snippet for, so the name is one of DTYPES in the identifier too
            self.lines.append(f'self.register_buffer("probe_{dtype}", torch.zeros((), dtype={_dt(dtype)}))')
        return f"self.probe_{dtype}"


def _cast(var: str, cast: CastSpec, rank: int, init: _Init, source: str = "x") -> str:
    """The expression that applies ``cast`` to ``var``; "input" is ``source``'s dtype."""
    dtype = f"{source}.dtype" if cast.dtype == "input" else _dt(cast.dtype)
    if cast.kind == "method":
        return f"{var}.to({dtype})" if cast.dtype == "input" else f"{var}.{_pick(_METHODS, cast.dtype, 'dtype')}()"
    if cast.kind == "type_as":
        return f"{var}.type_as({source if cast.dtype == 'input' else init.probe(cast.dtype)})"
    if cast.kind == "to-contiguous":
        return f"{var}.to({dtype}, memory_format=torch.contiguous_format)"
    if cast.kind == "to-channels-last":
        return f"{var}.to({dtype}, memory_format={_memory_format(rank, True)})"
    return f"{var}.to({dtype})"


def _casts(lines: list[str], var: str, casts: Sequence[CastSpec], rank: int, init: _Init, source: str = "x") -> None:
    for cast in casts:
        lines.append(f"{var} = {_cast(var, cast, rank, init, source)}")


def norm_inputs(norm: NormSpec) -> list[str]:
    """The extra inputs a norm's forward takes after ``x``."""
    names = []
    if norm.scaled == "other" or norm.square == "product":
        names.append("y")
    if norm.eps_how in ("input", "row"):
        names.append("e")
    if norm.weight is not None and norm.weight.kind == "input":
        names.append("w")
    return names


def weight_shape(norm: NormSpec, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the weight tensor: the normalized shape (the full width for a grouped norm)."""
    shape = (input_shape[-1],) if norm.grouped else normalized_shape(norm, input_shape)
    if norm.weight is not None and norm.weight.shape == "row":
        return (1, *shape)
    return shape


def _weight_expr(lines: list[str], weight: WeightSpec, rank: int, init: _Init) -> str:
    w = "w" if weight.kind == "input" else "self.weight"
    if weight.cast is not None or weight.offset:
        lines.append(f"g = {w}")
        w = "g"
        if weight.cast is not None:
            lines.append(f"g = {_cast('g', weight.cast, rank, init)}")
        if weight.offset:
            lines.append("g = 1.0 + g")
    return w


def _render_norm(cls: str, norm: NormSpec, input_shape: tuple[int, ...]) -> str:
    """The source of one norm module reading a tensor of ``input_shape``."""
    init = _Init()
    rank = len(input_shape)
    shape = normalized_shape(norm, input_shape)
    if norm.weight is not None and norm.weight.kind != "input":
        w = norm.weight
        value = f"_rand({_shape(weight_shape(norm, input_shape))}, {_int(w.seed)}, 0.5, {_num(w.around)}, {_dt(w.dtype)})"
        if w.kind == "param":
            init.lines.append(f"self.weight = nn.Parameter({value})")
        else:
            init.lines.append(f'self.register_buffer("weight", {value})')
    if norm.eps_how == "const":
        init.lines.append(f'self.register_buffer("eps_t", torch.tensor([{_num(norm.eps)}], dtype={_dt(norm.eps_dtype)}))')
    if norm.eps_how == "vector":
        init.lines.append(
            f'self.register_buffer("eps_t", _rand({_shape(shape)}, 7, 0.01, 0.05, {_dt(norm.eps_dtype)}).abs())'
        )

    body: list[str] = []
    args = ", ".join(["x", *norm_inputs(norm)])
    body.append("h = x")
    _casts(body, "h", norm.pre, rank, init)
    if "y" in norm_inputs(norm):
        body.append("y = y.to(x.dtype)")
        _casts(body, "y", norm.pre, rank, init)
    lead, width = input_shape[:-1], input_shape[-1]
    if norm.grouped:
        split = _ints((*lead, norm.groups, width // norm.groups))
        body.append(f"h = h.reshape({split})")
        if "y" in norm_inputs(norm):
            body.append(f"y = y.reshape({split})")
        rank += 1
    if norm.functional:
        weight = "None"
        if norm.weight is not None:
            weight = _weight_expr(body, norm.weight, rank, init)
        body.append(f"n = torch.nn.functional.rms_norm(h, [{_ints(shape)}], {weight}, {_num(norm.eps)})")
    elif norm.form == "coreml":
        body.append(
            f"n = h * {math.sqrt(shape[-1])!r} / torch.clamp_min("
            f"torch.linalg.vector_norm(h, dim=-1, keepdim=True), {_num(norm.eps if norm.eps is not None else 1e-6)})"
        )
    else:
        body.append("v = h")
        _casts(body, "v", norm.var_pre, rank, init)
        if "y" in norm_inputs(norm):
            body.append("yv = y")
            _casts(body, "yv", norm.var_pre, rank, init)
        square = _pick(SQUARE_SOURCE, norm.square, "square")
        dims = norm.mean_dims if norm.mean_dims is not None else tuple(range(-norm.dims, 0))
        if norm.dims_style.endswith("pos"):
            dims = tuple(d % rank for d in dims)
        if norm.dims_style.startswith("list"):
            dims_text = f"[{_ints(dims)}]"
        else:
            dims_text = _int(dims[0]) if len(dims) == 1 else f"({_ints(dims)})"
        if norm.keepdim:
            body.append(f"m = ({square}).mean({dims_text}, keepdim=True)")
        else:
            body.append(f"m = ({square}).mean({dims_text}).unsqueeze(-1)")
        eps = _num(norm.eps) if norm.eps is not None else None
        scaled = _pick(SCALED_SOURCE, norm.scaled, "scaled")
        if norm.scaled == "rounded":
            scaled = scaled.format(via=_dt(norm.rounded_via))
        if norm.eps_how == "outside":
            body.append(f"n = {scaled} / (torch.sqrt(m) + {eps})")
        else:
            if norm.eps is None and norm.eps_how not in ("input", "row", "vector"):
                body.append("a = m")
            else:
                addend = {"right": eps, "left": eps, "const": "self.eps_t", "vector": "self.eps_t", "input": "e", "row": "e"}[
                    norm.eps_how
                ]
                body.append(f"a = {addend} + m" if norm.eps_how == "left" else f"a = m + {addend}")
            inverse = _pick(INVERSE_SOURCE, norm.inverse, "inverse")
            if norm.inverse in DIVIDES:
                body.append(f"n = {scaled} / {inverse}")
            else:
                body.append(f"r = {inverse}")
                body.append(f"n = r * {scaled}" if norm.scale_left else f"n = {scaled} * r")
        _casts(body, "n", norm.mid, rank, init)
        if norm.also_return_normalized:
            body.append("normalized = n")
        if norm.grouped:
            body.append(f"n = n.reshape({_ints(input_shape)})")
            rank -= 1
        if norm.weight is not None:
            weight = _weight_expr(body, norm.weight, rank, init)
            body.append(f"n = {weight} * n" if norm.weight.left else f"n = n * {weight}")
    if norm.form == "coreml" and norm.weight is not None:
        weight = _weight_expr(body, norm.weight, rank, init)
        body.append(f"n = {weight} * n" if norm.weight.left else f"n = n * {weight}")
    _casts(body, "n", norm.post, rank, init)
    body.append("return n, normalized" if _returns_normalized(norm) else "return n")

    form = _named(norm.form, _spec.FORMS, "form")
    out = [f"class {cls}(nn.Module):", f'    """{form} norm over [{_ints(shape)}] of a [{_ints(input_shape)}] tensor."""', ""]
    out.append("    def __init__(self):")
    out.append("        super().__init__()")
    out.extend(f"        {line}" for line in init.lines)
    out.append("")
    out.append(f"    def forward(self, {args}):")
    out.extend(f"        {line}" for line in body)
    return "\n".join(out) + "\n"


def norm_module(norm: NormSpec, input_shape: tuple[int, ...]) -> torch.nn.Module:
    """The module of one norm reading a tensor of ``input_shape``, built from its source (the form tests
    build each registry form so)."""
    namespace: dict = {"__name__": "edgefuse_fuzz_generated"}
    exec(compile(HEADER + "\n\n" + _render_norm("Norm", norm, input_shape), "<edgefuse-fuzz>", "exec"), namespace)
    return namespace["Norm"]().eval()


@dataclass(frozen=True)
class CaseIO:
    """The names of a case module's inputs and how many tensors it returns."""

    inputs: tuple[str, ...]
    outputs: int


def case_io(spec: CaseSpec) -> CaseIO:
    inputs = ["x"]
    if spec.residual:
        inputs.append("r")
    inputs += norm_inputs(spec.norm)
    outputs = 1 + _returns_normalized(spec.norm) + spec.return_input
    return CaseIO(tuple(inputs), outputs)


def _returns_normalized(norm: NormSpec) -> bool:
    return norm.also_return_normalized and norm.written_out


def _render_case(prefix: str, spec: CaseSpec) -> str:
    """The source of a case's norm classes, its module ``{prefix}Case`` and ``{prefix}inputs()``."""
    parts = []
    norm_shape = spec.norm_shape
    if spec.feed is not None:
        parts.append(_render_norm(f"{prefix}Feed", spec.feed, spec.shape))
    parts.append(_render_norm(f"{prefix}Norm", spec.norm, norm_shape))
    io = case_io(spec)

    init = ["super().__init__()"]
    if spec.feed is not None:
        init.append(f"self.feed = {prefix}Feed()")
    init.append(f"self.norm = {prefix}Norm()")
    body = []
    if spec.residual:
        body.append("x = x + r")
    if spec.feed is not None:
        body.append("x = self.feed(x)")
    h = "x"
    if spec.heads > 1:
        view = _pick(VIEW_SOURCE, spec.heads_view, "heads_view")
        body.append(f"h = x.{view}({_ints(norm_shape)})")
        h = "h"
    extra = [n for n in io.inputs if n not in ("x", "r")]
    call = f"self.norm({', '.join([h, *extra])})"
    if _returns_normalized(spec.norm):
        body.append(f"out, normalized = {call}")
    else:
        body.append(f"out = {call}")
    if spec.heads > 1:
        body.append(f"out = out.{view}({_ints(spec.shape)})")
    for i, tail in enumerate(spec.tails):
        if tail.kind == "mul-scalar":
            body.append(f"out = out * {_num(tail.value)}")
        elif tail.kind == "mul-0d":
            init.append(f'self.register_buffer("scale{i}", torch.tensor({_num(tail.value)}, dtype={_dt(tail.dtype)}))')
            body.append(f"out = out * self.scale{i}")
        elif tail.kind == "mul-tensor":
            init.append(f'self.register_buffer("scale{i}", _rand(({_int(spec.shape[-1])},), {_int(tail.seed)}, 0.5, 1.0, {_dt(tail.dtype)}))')
            body.append(f"out = out * self.scale{i}")
        elif tail.kind == "residual":
            body.append("out = out + x")
    returned = ["out"]
    if _returns_normalized(spec.norm):
        returned.append("normalized")
    if spec.return_input:
        returned.append("x")
    body.append(f"return ({', '.join(returned)},)")

    text = [f"class {prefix}Case(nn.Module):", f'    """{describe(spec)}"""', "", "    def __init__(self):"]
    text += [f"        {line}" for line in init]
    text += ["", f"    def forward(self, {', '.join(io.inputs)}):"]
    text += [f"        {line}" for line in body]
    parts.append("\n".join(text) + "\n")
    parts.append(_render_inputs(f"{prefix}inputs", spec, io))
    return "\n\n".join(parts)


def _render_inputs(name: str, spec: CaseSpec, io: CaseIO) -> str:
    rank = len(spec.shape)
    memory = _memory_format(rank, spec.channels_last)
    seed = spec.input_seed
    _int(seed)
    lines = [f"def {name}():", f'    """The inputs of case s{_int(spec.seed)}-c{_int(spec.index)}: {", ".join(io.inputs)}."""']
    lines.append(f"    x = _rand({_shape(spec.shape)}, {seed}, {_num(spec.scale)})")
    if spec.zero_row:
        lines.append(f"    x.view(-1, {_int(spec.shape[-1])})[0] = 0.0  # a row of zeros (padding)")
    lines.append(f"    x = x.to({_dt(spec.dtype)}).contiguous(memory_format={memory})")
    if spec.residual:
        lines.append(f"    r = _rand({_shape(spec.shape)}, {seed + 1}, {_num(spec.scale)}).to({_dt(spec.dtype)})")
        lines.append(f"    r = r.contiguous(memory_format={memory})")
    norm = spec.norm
    norm_shape = spec.norm_shape
    if "y" in io.inputs:
        lines.append(f"    y = _rand({_shape(norm_shape)}, {seed + 2}, {_num(spec.scale)}).to({_dt(spec.dtype)})")
    if "e" in io.inputs:
        if norm.eps_how == "input":
            lines.append(f"    e = torch.tensor({_num(norm.eps)}, dtype={_dt(norm.eps_dtype)})")
        else:
            rows = (*norm_shape[: len(norm_shape) - norm.dims], *([1] * norm.dims))
            if norm.grouped:
                rows = (*norm_shape[:-1], norm.groups, 1)
            lines.append(f"    e = _rand({_shape(rows)}, {seed + 3}, 0.01, 0.05, {_dt(norm.eps_dtype)}).abs()")
    if "w" in io.inputs:
        w = norm.weight
        lines.append(f"    w = _rand({_shape(weight_shape(norm, norm_shape))}, {_int(w.seed)}, 0.5, {_num(w.around)}, {_dt(w.dtype)})")
    lines.append(f"    return ({', '.join(io.inputs)},)")
    return "\n".join(lines) + "\n"


def describe(spec: CaseSpec) -> str:
    """One line that says what a case is."""
    name = f"s{_int(spec.seed)}-c{_int(spec.index)}"
    form = _named(spec.norm.form, _spec.FORMS, "form")
    parts = [f"case {name}: {form} norm", f"{_named(spec.dtype, DTYPES, 'dtype')} [{_ints(spec.shape)}]"]
    if spec.channels_last:
        parts.append("channels-last")
    if spec.near_miss:
        parts.append(f"near miss: {_named(spec.near_miss, _spec.NEAR_MISSES, 'near_miss')}")
    for flag, text in ((spec.residual, "residual add"), (spec.feed is not None, "fed by a norm"), (spec.heads > 1, f"{_int(spec.heads)} heads")):
        if flag:
            parts.append(text)
    if spec.tails:
        parts.append("then " + ", ".join(_named(t.kind, _spec.TAIL_KINDS, "tail kind") for t in spec.tails))
    return "; ".join(parts)


def source(specs: Sequence[CaseSpec]) -> str:
    """Python source defining, for each spec ``k``, ``C{k}_Case`` and ``C{k}_inputs()``, and for
    more than one spec a ``Batch`` module that runs them all on the concatenated inputs."""
    parts = [HEADER]
    for k, spec in enumerate(specs):
        parts.append(_render_case(f"C{k}_", spec))
    if len(specs) > 1:
        lines = ["class Batch(nn.Module):", '    """Every case side by side; its outputs are the cases\' outputs, in order."""', ""]
        lines += ["    def __init__(self):", "        super().__init__()"]
        lines += [f"        self.c{k} = C{k}_Case()" for k in range(len(specs))]
        names, calls, start = [], [], 0
        for k, spec in enumerate(specs):
            io = case_io(spec)
            args = [f"a{start + i}" for i in range(len(io.inputs))]
            names += args
            start += len(args)
            calls.append(f"*self.c{k}({', '.join(args)})")
        lines += ["", f"    def forward(self, {', '.join(names)}):", f"        return ({', '.join(calls)},)"]
        parts.append("\n".join(lines) + "\n")
    return "\n\n".join(parts)


@dataclass
class Built:
    """A module built from rendered source, its inputs, and where each case's inputs and outputs sit."""

    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_slices: list[slice]
    output_slices: list[slice]
    prefixes: list[str]  # module path prefix of each case ("c3." in a batch, "" alone)
    text: str


def build(specs: Sequence[CaseSpec]) -> Built:
    """Execute the source of ``specs`` and build the module (a ``Batch`` for several) and its inputs."""
    text = source(specs)
    namespace: dict = {"__name__": "edgefuse_fuzz_generated"}
    exec(compile(text, "<edgefuse-fuzz>", "exec"), namespace)
    inputs: list[torch.Tensor] = []
    input_slices, output_slices, start_out = [], [], 0
    for k, spec in enumerate(specs):
        case_inputs = namespace[f"C{k}_inputs"]()
        input_slices.append(slice(len(inputs), len(inputs) + len(case_inputs)))
        inputs.extend(case_inputs)
        n = case_io(spec).outputs
        output_slices.append(slice(start_out, start_out + n))
        start_out += n
    if len(specs) == 1:
        module, prefixes = namespace["C0_Case"](), [""]
    else:
        module, prefixes = namespace["Batch"](), [f"c{k}." for k in range(len(specs))]
    return Built(module.eval(), tuple(inputs), input_slices, output_slices, prefixes, text)
