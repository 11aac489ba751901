"""Acceptance check of ``export-llm`` on ExecuTorch's Llama and Qwen3 from small params, stock beside edgefuse.

``python -m edgefuse.tools.llm_check [--cases llama-fp32,...] [--dim 64] [--layers 1] [--prefill 10] [--decode 12]``

For each case: write small params and a random checkpoint, export with ExecuTorch's ``export_llm``
(KV cache, custom SDPA, XNNPACK with extended ops) stock and with edgefuse, read each ``.pte``'s
delegates and the kernels outside them, and run each in ``executorch.runtime`` through a prefill and
decode steps against the eager module ``export_llm`` exported (:mod:`edgefuse.llm.eager`). A program
passes when every step's logits are within the units in the last place of the model's dtype at the step's
largest logit that :data:`edgefuse.core.verify.TOLERANCES` allows ``model logits`` (:func:`edgefuse.core.verify.finite_tolerance`): the delegate sums in its own order
through the model's tens of ops, each of which may round once differently, as the tiny models'
acceptance check allows. In 8da4w the runtime quantizes activations with XNNPACK's own kernels, not as
torchao's eager reference does, and stock's program is itself far from eager (2% of the largest logit
on the small Llama): there edgefuse's program must match eager as closely as stock's does, up to what
summing the norms' means in another order does to eager itself. It is not held to stock's logits: the
runtime rounds each activation to int8, so a last-bit difference in a mean (computed inside a delegate
rather than by a portable kernel) moves a value by a whole step, and layer after layer such steps
spread; at width 1024 the two programs' logits were measured 0.037 apart at a largest logit of 2.77,
and 0.08 to 0.17 apart at Qwen3-0.6B's 28 layers (docs/scale.md). So each step's *rounding floor* is
measured: the largest logit difference from eager's of the eager module run again with every norm's
mean rounded another way (:func:`edgefuse.quant.rounding.means_rounded`: summed in float64 and rounded
once, or one unit in the last place up, or down; the one thing edgefuse's lowering changes in a norm),
the most of the three. edgefuse's error is allowed stock's at that step plus
the float32 bound plus the floor. The check fails when edgefuse leaves a mean or a cast
outside a delegate, or a program misses its bound.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if __name__ == "__main__":
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()

if TYPE_CHECKING:
    import torch

from edgefuse.llm.small import SMALL_LLAMA, SMALL_QWEN3

#: The overrides of every case: ExecuTorch's Llama with a KV cache and custom SDPA, lowered for XNNPACK.
BASE_OVERRIDES = (
    "model.use_kv_cache=True",
    "model.use_sdpa_with_kv_cache=True",
    "backend.xnnpack.enabled=True",
    "backend.xnnpack.extended_ops=True",
)
FP32 = ()
FP16 = ("model.dtype_override=fp16",)
Q8DA4W = ("quantization.qmode=8da4w", "quantization.group_size=32")
BF16 = ("model.dtype_override=bf16", "backend.xnnpack.enable_bf16=True")


@dataclass(frozen=True)
class Case:
    """One model and precision: params, ``base.model_class`` and the overrides that set the precision."""

    name: str
    params: dict
    model_class: str
    overrides: tuple[str, ...]
    dtype: str = "float32"  # the logits' dtype, by torch's name

    @property
    def quantized(self) -> bool:
        return "quantization.qmode=8da4w" in self.overrides


CASES = {
    case.name: case
    for case in (
        Case("llama-fp32", SMALL_LLAMA, "llama3", FP32),
        Case("llama-8da4w", SMALL_LLAMA, "llama3", Q8DA4W),
        Case("llama-bf16", SMALL_LLAMA, "llama3", BF16, "bfloat16"),
        Case("qwen3-fp32", SMALL_QWEN3, "qwen3_0_6b", FP32),
        Case("qwen3-8da4w", SMALL_QWEN3, "qwen3_0_6b", Q8DA4W),
        Case("qwen3-bf16", SMALL_QWEN3, "qwen3_0_6b", BF16, "bfloat16"),
    )
}


def sized(case: Case, dim: int | None = None, layers: int | None = None) -> Case:
    """``case`` with another width (heads of 16) and layer count."""
    params = dict(case.params)
    if dim is not None:
        params.update(dim=dim, hidden_dim=2 * dim, n_heads=dim // 16, n_kv_heads=max(1, dim // 32))
    if layers is not None:
        params["n_layers"] = layers
    return Case(case.name, params, case.model_class, case.overrides, case.dtype)


def case_arguments(case: Case, params_path: str, checkpoint_path: str) -> list[str]:
    """The export_llm overrides of ``case`` for the model files written for it."""
    return [
        f"base.model_class={case.model_class}", f"base.params={params_path}", f"base.checkpoint={checkpoint_path}",
        *BASE_OVERRIDES, *case.overrides,
    ]


@dataclass
class ProgramCheck:
    """One lowering of a case: its ``.pte``, what it holds, and its logits' errors against eager."""

    lowering: str
    path: str
    contents: object  # PteContents
    errors: list[float] = field(default_factory=list)
    allowed: list[float] = field(default_factory=list)
    versus_stock: list[float] = field(default_factory=list)  # against stock's logits, step by step
    versus_stock_allowed: list[float] = field(default_factory=list)
    #: Quantized: at each step, how far eager's logits move when its norms' means round once differently
    #: (part of what ``allowed`` allows edgefuse; empty in float).
    floor: list[float] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        """Within its bound against eager at every step, and within the dtype's bound of stock's logits. A
        step whose bound is not finite (stock's quantized program not a number there, or a floor that is
        not) fails: it would hold no error at all."""
        against_eager = bool(self.errors) and all(
            math.isfinite(a) and e <= a for e, a in zip(self.errors, self.allowed)
        )
        return against_eager and all(e <= a for e, a in zip(self.versus_stock, self.versus_stock_allowed))

    @property
    def worst_step(self) -> int:
        """The step nearest its bound or furthest past it, of the largest error among steps as near
        (stock's quantized program, allowed its own errors, shows its largest): a program that misses its
        bound at some step shows that step, not a larger error within its own. A step whose bound is not
        finite fails (:attr:`matches`) and counts as furthest past it."""

        def margin(i: int) -> float:
            return self.allowed[i] - self.errors[i] if math.isfinite(self.allowed[i]) else -math.inf

        return min(range(len(self.errors)), key=lambda i: (margin(i), -self.errors[i]))

    @property
    def worst(self) -> tuple[float, float]:
        """The (error, allowed) pair of :attr:`worst_step`."""
        step = self.worst_step
        return self.errors[step], self.allowed[step]


def export_case(case: Case, directory: str, lowerings=("stock", "edgefuse"), api: bool = False) -> dict:
    """Write ``case``'s model files in ``directory`` and export it with each lowering; the LlmExports.

    Through export_llm's command line (:func:`~edgefuse.llm.export.run_export_llm`), or with ``api``
    edgefuse's program through the Python API (:func:`~edgefuse.llm.export.export_llm`) on the config
    the same overrides make."""
    from edgefuse.llm.eager import write_small_model

    model_files = write_small_model(directory, case.params)
    return export_programs(case, model_files, directory, lowerings, api)


def export_programs(case: Case, model_files: tuple[str, str], directory: str, lowerings=("stock", "edgefuse"),
                    api: bool = False, extra: tuple[str, ...] = ()) -> dict:
    """Export ``case`` from its model files (params, checkpoint) with each lowering, as ``HOW.pte`` in
    ``directory`` (hydra's run directory ``hydra-HOW`` beside it, not in the working directory), with the
    further overrides ``extra``; the LlmExports by lowering."""
    from edgefuse.llm.eager import config_from_overrides
    from edgefuse.llm.export import export_llm, run_export_llm

    arguments = [*case_arguments(case, *model_files), *extra]
    exports = {}
    for how in lowerings:
        overrides = [*arguments, f"export.output_name={os.path.join(directory, how + '.pte')}"]
        if api and how == "edgefuse":
            exports[how] = export_llm(config_from_overrides(overrides))
        else:
            exports[how] = run_export_llm(overrides, lowering=how, hydra_dir=os.path.join(directory, "hydra-" + how))
    return exports


def check_case(case: Case, directory: str, prefill: int = 10, decode: int = 12,
               lowerings=("stock", "edgefuse"), api: bool = False) -> dict[str, ProgramCheck]:
    """Export ``case`` both ways in ``directory`` (see :func:`export_case`) and check each program against eager."""
    exports = export_case(case, directory, lowerings, api)
    return check_programs(case, {how: e.path for how, e in exports.items()}, exports[lowerings[-1]].config,
                          prefill, decode)


def check_programs(case: Case, paths: dict[str, str], config, prefill: int = 10,
                   decode: int = 12) -> dict[str, ProgramCheck]:
    """Check the ``.pte`` files ``paths`` (by lowering) of ``case`` against the eager module of ``config``;
    a quantized case's rounding floor is measured on that module (:func:`edgefuse.quant.rounding.rounding_floor`)."""
    import torch

    from edgefuse.compare.llm_programs import load_llm_kernels
    from edgefuse.llm.eager import eager_model, eager_step, logits_sequence, prompt_and_steps
    from edgefuse.quant.rounding import rounding_floor

    load_llm_kernels()
    model = eager_model(config)
    prompt, steps = prompt_and_steps(case.params["vocab_size"], prefill, decode)
    expected = logits_sequence(eager_step(model), prompt, steps)
    floor = None
    if case.quantized:
        floor = rounding_floor(model, lambda: logits_sequence(eager_step(model), prompt, steps), expected)
    del model  # not needed by the programs' runs, which each take gigabytes at real size
    logits = {how: program_logits(path, prompt, steps) for how, path in paths.items()}
    return checked_logits(expected, logits, paths, getattr(torch, case.dtype), case.quantized, floor)


def program_logits(path: str, prompt, steps) -> list:
    """The logits of the ``.pte`` at ``path`` over ``prompt`` and the decode ``steps`` (``execute`` returns
    copies, nothing of the program's memory); the program is released before this returns, so that checking two programs holds one
    at a time (keeping the first alive, the check of a 3 GB bfloat16 Llama-3.2-1B beside its eager module was
    killed loading the second, at 22.7 GiB resident: the machine's memory)."""
    import torch

    from edgefuse.llm.eager import logits_sequence
    from edgefuse.runtime import LoadedProgram

    with open(path, "rb") as f:
        loaded = LoadedProgram(f.read())
    return logits_sequence(
        lambda tokens, position: loaded.method.execute([tokens, torch.tensor([position], dtype=torch.long)])[0],
        prompt, steps,
    )


def checked_logits(expected: list[torch.Tensor], logits: dict[str, list[torch.Tensor]], paths: dict[str, str],
                   dtype: torch.dtype, quantized: bool, floor: list[float] | None = None) -> dict[str, ProgramCheck]:
    """Each program's logits (by lowering: ``stock``, ``edgefuse``) at each step held to eager's ``expected``
    by this module's rule: within the ``model logits`` units of ``dtype`` at the step's largest logit;
    quantized, within stock's own error, plus for edgefuse the bound and the step's rounding ``floor``
    (:func:`edgefuse.quant.rounding.rounding_floor`; none measured counts as 0); in float, also within the
    bound of stock's logits."""
    from edgefuse.core.verify import finite_tolerance
    from edgefuse.llm.pte import read_pte

    bound = [finite_tolerance(dtype, e, _ulps()) for e in expected]
    checks = {}
    for how, path in paths.items():
        errors = [_error(e, a) for e, a in zip(expected, logits[how])]
        checks[how] = ProgramCheck(how, path, read_pte(path), errors, list(bound))
    if quantized and "stock" in checks:
        stock = checks["stock"]
        stock.allowed = list(stock.errors)  # the reference of what the quantized runtime computes
        floor = list(floor) if floor is not None else [0.0] * len(expected)
        for how, check in checks.items():
            if how != "stock":
                check.floor = floor
                check.allowed = [s + b + f for s, b, f in zip(stock.errors, bound, floor)]
    if "stock" in logits and not quantized:
        # A float program must give stock's logits within the dtype's bound. A quantized one need not: its
        # activations are quantized at run time, so a last-bit difference before a quantize (a mean
        # computed inside a delegate rather than by a portable kernel) moves a value by a whole step, and
        # the two programs are held to eager instead (edgefuse's error within stock's plus the bound).
        for how, check in checks.items():
            check.versus_stock = [_error(s, a) for s, a in zip(logits["stock"], logits[how])]
            check.versus_stock_allowed = [finite_tolerance(dtype, s, _ulps()) for s in logits["stock"]]
    return checks


def _ulps() -> float:
    """Units in the last place of the dtype at the largest logit of a step."""
    from edgefuse.core.verify import TOLERANCES

    return TOLERANCES["model logits"].ulps


def _error(expected: torch.Tensor, actual: torch.Tensor) -> float:
    from edgefuse.core.verify import max_error

    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return float("inf")
    return max_error(expected, actual)


def passed(checks: dict[str, ProgramCheck]) -> bool:
    """Every program matches eager, and edgefuse's leaves no mean and no cast outside a delegate."""
    ours = checks.get("edgefuse")
    return all(c.matches for c in checks.values()) and (ours is None or (ours.contents.means == 0 and ours.contents.casts == 0))


def rows(case: Case, checks: dict[str, ProgramCheck]) -> list[list[object]]:
    """One table row per lowering: delegates, kernels outside, means, casts, error, bound."""
    result = []
    for how, check in checks.items():
        error, allowed = check.worst
        c = check.contents
        versus = f"{max(check.versus_stock):.3g}" if check.versus_stock else "-"
        result.append([case.name, how, c.delegate_count, c.kernel_count, c.means, c.casts,
                       f"{error:.3g}", f"{allowed:.3g}", versus, "yes" if check.matches else "NO"])
    return result


# -- export recipes -----------------------------------------------------------------------------------

#: The models of the recipe check: ExecuTorch's Llama and Qwen3 (one layer, no KV cache), on 8 tokens.
RECIPE_MODELS = {"llama": SMALL_LLAMA, "qwen3": SMALL_QWEN3}
RECIPE_TOKENS = 8


def recipe_model(params: dict, dtype: torch.dtype, seed: int = 0):
    """ExecuTorch's transformer of ``params`` with random weights (norm weights near 1), in ``dtype``, and
    its example inputs (tokens ``[1, 8]``)."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    from edgefuse.llm.eager import random_state

    model = construct_transformer(ModelArgs(**params))
    model.load_state_dict(random_state(model, seed))
    model = model.to(dtype).eval()
    tokens = torch.randint(0, params["vocab_size"], (1, RECIPE_TOKENS), generator=torch.Generator().manual_seed(seed))
    return model, (tokens,)


def _quantized_reference(session, model):
    """The module a recipe's session quantized, run as the eager reference: the converted graph (PT2E) or
    the source-transformed module (TorchAO); the model itself when the recipe quantizes nothing."""
    from executorch.export.types import StageType

    artifacts = session.get_stage_artifacts()
    for stage in (StageType.QUANTIZE, StageType.SOURCE_TRANSFORM):
        artifact = artifacts.get(stage)
        if artifact is not None and isinstance(artifact.data, dict) and artifact.data.get("forward") is not model:
            return artifact.data["forward"]
    return model


@dataclass
class RecipeCheck:
    """One recipe type on one model: both programs' contents and errors (against eager, and between them)."""

    recipe: str
    model: str
    stock_recipe: str
    stock: object  # PteContents
    ours: object
    stock_error: float
    error: float
    allowed: float
    versus_stock: float
    versus_stock_allowed: float

    @property
    def ok(self) -> bool:
        return (self.ours.means == 0 and self.ours.casts == 0 and self.error <= self.allowed
                and self.versus_stock <= self.versus_stock_allowed)


def check_recipe(recipe_type, model_name: str) -> RecipeCheck:
    """Export ``model_name`` with the edgefuse recipe ``recipe_type`` and with the stock recipe it mirrors
    (stock FP32 for FP16 and BF16), run both in the runtime and compare with eager and with each other.

    Float recipes are held to the ``model logits`` units of the model's dtype at the largest output; quantized
    ones to stock's own error against the quantized eager module plus that bound, and to stock's output
    within the bound (the programs differ only in where means and casts run)."""
    import torch
    from executorch.backends.xnnpack.recipes import XNNPackRecipeType
    from executorch.export import ExportRecipe, export

    from edgefuse.llm.pte import read_pte
    from edgefuse.xnnpack.recipes import EdgefuseRecipeType
    from edgefuse.runtime import LoadedProgram
    from edgefuse.core.verify import finite_tolerance

    dtype = {EdgefuseRecipeType.FP16: torch.float16, EdgefuseRecipeType.BF16: torch.bfloat16}.get(recipe_type, torch.float32)
    model, inputs = recipe_model(RECIPE_MODELS[model_name], dtype)
    stock_type = recipe_type.stock or XNNPackRecipeType.FP32
    outputs, contents, references = {}, {}, {}
    for label, kind in (("stock", stock_type), ("edgefuse", recipe_type)):
        session = export(model, [inputs], export_recipe=ExportRecipe.get_recipe(kind))
        pte = session.get_pte_buffer()
        contents[label] = read_pte(pte)
        outputs[label] = LoadedProgram(pte).run(list(inputs))[0]
        with torch.no_grad():
            references[label] = _quantized_reference(session, model)(*inputs)
    bound = finite_tolerance(dtype, references["edgefuse"], _ulps())
    stock_error = _error(references["stock"], outputs["stock"])
    error = _error(references["edgefuse"], outputs["edgefuse"])
    quantized = recipe_type.stock is not None and recipe_type.stock is not XNNPackRecipeType.FP32
    return RecipeCheck(
        recipe_type.name, model_name, stock_type.name, contents["stock"], contents["edgefuse"], stock_error, error,
        stock_error + bound if quantized else bound,
        _error(outputs["stock"], outputs["edgefuse"]), finite_tolerance(dtype, outputs["stock"], _ulps()),
    )


RECIPE_HEADER = ("recipe", "model", "stock recipe", "stock delegates", "stock kernels", "stock means",
                 "delegates", "kernels", "means", "casts", "err vs eager", "allowed", "vs stock", "ok")


def recipe_row(check: RecipeCheck) -> list[object]:
    return [check.recipe, check.model, check.stock_recipe, check.stock.delegate_count, check.stock.kernel_count,
            check.stock.means, check.ours.delegate_count, check.ours.kernel_count, check.ours.means, check.ours.casts,
            f"{check.error:.3g}", f"{check.allowed:.3g}", f"{check.versus_stock:.3g}", "yes" if check.ok else "NO"]


HEADER = ("case", "lowering", "delegates", "kernels outside", "means", "casts", "err vs eager", "allowed",
          "vs stock", "ok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefuse.tools.llm_check", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--dim", type=int, default=None, help="model width, a multiple of 32 (default 64)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 1)")
    parser.add_argument("--prefill", type=int, default=10, help="prompt tokens (default 10)")
    parser.add_argument("--decode", type=int, default=12, help="decode steps (default 12)")
    parser.add_argument("--recipes", action="store_true",
                        help="check the export recipes instead: every edgefuse recipe type on the Llama and Qwen3 models")
    args = parser.parse_args(argv)
    if args.recipes:
        return recipes_main()
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.dim is not None and (args.dim < 32 or args.dim % 32):
        parser.error("--dim must be a multiple of 32 (8da4w groups of 32, heads of 16)")
    if args.layers is not None and args.layers < 1:
        parser.error("--layers must be at least 1")
    if args.prefill < 1 or args.decode < 0 or args.prefill + args.decode > 127:
        parser.error("--prefill at least 1, --decode at least 0, together at most 127 (the default context is 128)")
    import torch

    from edgefuse.console.tables import format_table
    from edgefuse.runtime.quiet import quiet_root_logger
    from edgefuse.llm.export import ConfigRejected

    torch.set_num_threads(1)
    ok = True
    table = []
    with tempfile.TemporaryDirectory(prefix="edgefuse-llm-check-") as directory:
        for name in names:
            case = sized(CASES[name], args.dim, args.layers)
            sub = os.path.join(directory, name)
            os.makedirs(sub)
            try:
                with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):  # stdout holds the table alone
                    checks = check_case(case, sub, args.prefill, args.decode)
            except ConfigRejected as error:  # stock's export fails as edgefuse's would: nothing to compare
                print(f"python -m edgefuse.tools.llm_check: export_llm rejected {name} ({case.params['dim']} wide, "
                      f"{case.params['n_layers']} layer(s)):\n{error}", file=sys.stderr)
                return 2
            ok = passed(checks) and ok
            table += rows(case, checks)
            print(format_table(HEADER, rows(case, checks)), file=sys.stderr, flush=True)
    print(format_table(HEADER, table))
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


def recipes_main() -> int:
    """Every edgefuse recipe type on each recipe model, against stock's recipe and eager."""
    import torch

    from edgefuse.xnnpack.recipes import EdgefuseRecipeType
    from edgefuse.console.tables import format_table

    torch.set_num_threads(1)
    table = []
    for recipe_type in EdgefuseRecipeType:
        for model_name in RECIPE_MODELS:
            table.append(recipe_row(check_recipe(recipe_type, model_name)))
            print(format_table(RECIPE_HEADER, table[-1:]), file=sys.stderr, flush=True)
    print(format_table(RECIPE_HEADER, table))
    ok = all(row[-1] == "yes" for row in table)
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
