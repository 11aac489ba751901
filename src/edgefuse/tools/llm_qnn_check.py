"""Acceptance check of ``export-llm`` for QNN: ExecuTorch's Llama and Qwen3 from small params through
export_llm's own QNN path, stock beside edgefuse, run on QNN's x86 HTP emulator.

``python -m edgefuse.tools.llm_qnn_check [--cases llama-fp16,...] [--prefill 4] [--decode 6] [--mask -255]
[--calibration 16] [--seed 0] [--calibration-seed N]``

For each case: write small params and a random checkpoint, export with ExecuTorch's ``export_llm``
(``backend.qnn.enabled=True``, KV cache, static shapes, SM8650) with the released QNN passes and with
edgefuse's, count the QNN ``RmsNorm`` ops QNN compiled, and run each ``.pte`` on the emulator through a
prompt (one token per call: export_llm's QNN programs take ``[1, 1]`` tokens) and decode steps.

- **fp16** (the HTP computes in float16): each step's logits against the eager model of the config
  (float32) at :data:`~edgefuse.compare.qnn_flows.FP16_ULPS` units in the last place of float16 at the largest
  logit, the bound ``lower --backend qnn`` derives for the tiny models (about 16 float16 roundings
  reach the output undamped, half a unit each).
- **quantized** (``quantization.pt2e_quantize=qnn_16a4w``, ``qnn_8a8w``, ``qnn_16a16w``): against the
  converted (fake-quantized) module export_llm lowered, at the derived tolerance of
  :func:`edgefuse.qnn.emulator.output_tolerances` on each call's inputs (the one ``lower --backend qnn``
  uses: one logit step per rounding on the longest path, or what the module carries to the logits when
  each rounding lands one level off, whichever is more); against float eager as information. A program
  whose tolerance is set by one coarse op cannot be told apart from a
  wrong one and does not pass (:func:`edgefuse.compare.qnn_flows.told_apart`: a tolerance looser than
  float16's on the same logits).

  ``llama-16a4w`` is not among the default cases: as ExecuTorch ships it, it cannot pass. export_llm's
  QNN path puts a causal mask of -inf in place of the model's boolean one (``replace_causal_mask``), and
  quantized at 16 bits it sets the scores' step at 1.0: 9962 logit steps (measured on QNN 2.51's
  emulator, SM8650, 4 prompt tokens and 6 decode steps: stock 0.74 and edgefuse 2.08 off the
  fake-quantized module, where 33 and 22 roundings allow 0.0033 and 0.0022; the module carries its
  levels to 0.68 and 2.26). ``--mask -255`` puts ExecuTorch's QNN Llama example's mask in its place;
  then the 8-bit KV cache of the 16a4w recipe is the coarsest step, 202 logit steps, and neither program
  can be told apart from a wrong one on these logits. export_llm calibrates on one call (its example
  input) unless given calibration data, so every later call leaves ranges that call set, and the norms
  stock leaves in pieces clip their ``rsqrt``: the ``clipped`` column says which ops and how far.
  ``--calibration 16`` has export_llm calibrate over 16 calls instead; ``--seed`` draws other weights
  and another calibration prompt (from 0 to 2**63 - 2; the checked prompt stays the same);
  ``--calibration-seed`` draws the calibration prompt alone, the weights staying those of ``--seed``, so
  that what the calibration alone changes can be set beside what another model changes. ``module vs
  float eager`` is how far the fake-quantized module itself is from float eager (largest and mean), which
  tells the error the quantization makes from the error the HTP adds to it. ``mean err`` is the mean absolute error of the logits against the
  module (steadier than the largest, which one logit sets); for a program of rebuilt norms, ``mean err,
  RmsNorm rounding down`` is the same against its module with each ``rms_norm`` output rounding down as
  QNN's RmsNorm does when ExecuTorch's builder builds it (:func:`edgefuse.qnn.emulator.rounding_down`):
  the two side by side say how much the program's error moves when the module rounds so. edgefuse's
  builder makes the HTP round to nearest (:mod:`edgefuse.qnn.visitors`), yet on these logits that does
  not make ``mean err`` the smaller of the two: at 16a4w it was the larger at 5 of 12 seeds. docs/qnn-16a4w.md has the measurements and what they show about the norms.

A case passes when edgefuse's program rebuilds every norm it decided on into one QNN ``RmsNorm``, has no
fewer RmsNorm ops than stock's, and stays within its bound at every step, as stock's is held to.
"""

from __future__ import annotations

import argparse
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

#: The overrides of every case: ExecuTorch's Llama with a KV cache and static shapes, lowered for QNN.
BASE_OVERRIDES = (
    "model.use_kv_cache=True",
    "model.enable_dynamic_shape=False",
    "backend.qnn.enabled=True",
    "backend.qnn.soc_model=SM8650",
)


@dataclass(frozen=True)
class QnnCase:
    """One model and precision: params, ``base.model_class`` and the PT2E quantization (None: fp16)."""

    name: str
    params: dict
    model_class: str
    pt2e_quantize: str | None = None

    def arguments(self, params_path: str, checkpoint_path: str) -> list[str]:
        quantize = [f"quantization.pt2e_quantize={self.pt2e_quantize}"] if self.pt2e_quantize else []
        return [f"base.model_class={self.model_class}", f"base.params={params_path}",
                f"base.checkpoint={checkpoint_path}", *BASE_OVERRIDES, *quantize]


CASES = {
    case.name: case
    for case in (
        QnnCase("llama-fp16", SMALL_LLAMA, "llama3"),
        QnnCase("qwen3-fp16", SMALL_QWEN3, "qwen3_0_6b"),
        QnnCase("llama-16a4w", SMALL_LLAMA, "llama3", "qnn_16a4w"),
        QnnCase("llama-8a8w", SMALL_LLAMA, "llama3", "qnn_8a8w"),
        QnnCase("llama-16a16w", SMALL_LLAMA, "llama3", "qnn_16a16w"),
    )
}


@dataclass
class QnnProgramCheck:
    """One lowering of a case: its ``.pte``, what QNN built, and its logits' errors step by step."""

    lowering: str
    path: str
    contents: object  # PteContents
    rms_norms: int
    rebuilt: int  # norms edgefuse's passes rebuilt (0 for stock)
    decisions: int
    reference: str
    errors: list[float] = field(default_factory=list)
    allowed: list[float] = field(default_factory=list)
    versus_float: list[float] = field(default_factory=list)  # quantized programs: against float eager
    module_versus_float: list[float] = field(default_factory=list)  # the fake-quantized module against float eager
    module_mean_versus_float: list[float] = field(default_factory=list)  # the same, mean |error| per call
    tolerances: list = field(default_factory=list)  # quantized programs: (step, Roundings) per compared call
    clipped: dict = field(default_factory=dict)  # quantized programs: quantize op -> (op, most levels beyond range)
    mean_errors: list[float] = field(default_factory=list)  # quantized programs: mean |error| per call
    rounding_down: list[float] = field(default_factory=list)  # the same against the module whose norms round down

    @property
    def within(self) -> bool:
        return bool(self.errors) and all(e <= a for e, a in zip(self.errors, self.allowed))

    told_apart: bool = True  # quantized programs: no tolerance looser than float16's (qnn_flows.told_apart)

    @property
    def ok(self) -> bool:
        return self.within and self.told_apart


def one_token_at_a_time(step):
    """``step`` for a prompt of any length, fed one token per call as a static-shape QNN program takes it;
    the logits of the prompt's last token."""

    def fed(tokens: torch.Tensor, position: int) -> torch.Tensor:
        for i in range(tokens.shape[1]):
            logits = step(tokens[:, i : i + 1], position + i)
        return logits.reshape(-1).float()

    return fed


def counted_step(reference, clipped: dict[str, tuple[str, float]] | None = None):
    """A step of the converted (fake-quantized) module ``reference`` as :func:`eager_step` makes it, and the
    list it appends each call's derived tolerance of the logits to
    (:func:`edgefuse.qnn.emulator.output_tolerances`: the logits' step and the roundings on their longest
    path, or what the module carries to them, on that call's inputs). The tolerance is read after the
    call, on the same tokens and position; reading it puts the module's KV cache back as it was.
    ``clipped``, when given, gathers per quantize op the most levels beyond its range a call put it
    (:func:`edgefuse.quant.diagnose.beyond_range`)."""
    import torch

    from edgefuse.llm.eager import eager_step
    from edgefuse.qnn.emulator import output_tolerances
    from edgefuse.quant.diagnose import beyond_range

    step, tolerances = eager_step(reference), []

    def counting(tokens: torch.Tensor, position: int) -> torch.Tensor:
        inputs = (tokens, {"input_pos": torch.tensor([position], dtype=torch.long)})
        if clipped is not None:
            for name, (op, beyond) in beyond_range(reference, inputs).items():
                clipped[name] = (op, max(beyond, clipped.get(name, (op, 0.0))[1]))
        logits = step(tokens, position)
        (tolerance,) = output_tolerances(reference, inputs)[:1]
        if tolerance is None:
            raise AssertionError("the converted module's logits come from no dequantize: no quantization step to compare at")
        tolerances.append(tolerance)
        return logits

    return counting, tolerances


#: The largest ``--seed``: the weights are drawn from the seed and the calibration prompt from ``seed + 1``.
#: torch's ``manual_seed`` takes up to 2**64 - 1 and refuses a larger seed with a traceback; the bound keeps
#: both within a signed 64-bit integer, a margin below that.
MAX_SEED = 2**63 - 2


def checked_seed(parser: argparse.ArgumentParser, value: int, option: str = "--seed") -> int:
    """``value`` of a seed option, or the parser's exit 2 naming ``option`` and its bounds (0 to
    :data:`MAX_SEED`): a seed torch refuses would end the command in a traceback after minutes of work."""
    if not 0 <= value <= MAX_SEED:
        parser.error(f"{option} is a whole number from 0 to {MAX_SEED}")
    return value


def calibration_arguments(directory: str, vocab: int, calls: int, seed: int = 0) -> list[str]:
    """The overrides that have export_llm calibrate over ``calls`` calls, one token each: a prompt of
    :data:`CALIBRATION_PROMPT` tokens drawn from ``seed + 1`` (not the checked prompt, drawn from 0), then
    the model's own next tokens, read through a word-level tokenizer written in ``directory``. None
    (export_llm's default): one call on its example input, token 1 at position 0."""
    from edgefuse.llm.eager import prompt_and_steps, token_text, write_token_tokenizer

    prompt, _ = prompt_and_steps(vocab, CALIBRATION_PROMPT, 0, seed=seed + 1)
    return [f"base.tokenizer_path={write_token_tokenizer(directory, vocab)}",
            f"quantization.calibration_data={token_text(prompt)}", f"quantization.calibration_seq_length={calls}"]


#: The tokens of the prompt export_llm calibrates on when asked to (``--calibration``).
CALIBRATION_PROMPT = 8


def norms_rounding_down(reference, prompt: torch.Tensor, steps: torch.Tensor) -> list[torch.Tensor] | None:
    """The logits of a copy of the converted module ``reference`` whose ``rms_norm`` outputs round down, as
    QNN's RmsNorm built by ExecuTorch's builder does (:func:`edgefuse.qnn.emulator.rounding_down`), through the prompt and the steps;
    None for a module without ``rms_norm`` (stock's norms are in pieces, which the HTP rounds as the
    module does)."""
    import copy

    import torch
    from torch.utils import _pytree as pytree

    from edgefuse.llm.eager import logits_sequence
    from edgefuse.qnn.emulator import rms_norm_roundings, rounding_down

    module = copy.deepcopy(reference)  # the reference's KV cache is left as it is
    norms = rms_norm_roundings(module)
    if not norms:
        return None
    call = rounding_down(module, norms)

    def step(tokens: torch.Tensor, position: int) -> torch.Tensor:
        return pytree.tree_leaves(call(tokens, {"input_pos": torch.tensor([position], dtype=torch.long)}))[0]

    return logits_sequence(one_token_at_a_time(step), prompt, steps)


def check_case(case: QnnCase, directory: str, prefill: int = 4, decode: int = 6,
               lowerings=("stock", "edgefuse"), mask: float | None = None,
               calibration: int = 0, seed: int = 0, calibration_seed: int | None = None) -> dict[str, QnnProgramCheck]:
    """Export ``case`` with each lowering in ``directory`` and check each program on the emulator.

    ``mask`` replaces the -inf of export_llm's QNN causal mask (:func:`edgefuse.llm.qnn.qnn_causal_mask`);
    ``calibration`` calls (:func:`calibration_arguments`) replace its one calibration call. ``seed`` draws
    the random weights and the calibration prompt, so that a difference between the lowerings can be
    set beside what another model or calibration gives; the checked prompt stays the same.
    ``calibration_seed``, when given, draws the calibration prompt in place of ``seed``, the weights
    staying those of ``seed``."""
    import contextlib

    import torch

    from edgefuse.compare.qnn_flows import FP16_ULPS, told_apart
    from edgefuse.llm.eager import eager_model, eager_step, logits_sequence, prompt_and_steps, write_small_model
    from edgefuse.llm.export import run_export_llm
    from edgefuse.llm.pte import read_pte
    from edgefuse.llm.qnn import qnn_causal_mask
    from edgefuse.qnn.emulator import compare_at_steps
    from edgefuse.runtime import LoadedProgram
    from edgefuse.core.verify import compare, max_error, mean_error

    params_path, checkpoint_path = write_small_model(directory, case.params, seed=seed)
    prompt, steps = prompt_and_steps(case.params["vocab_size"], prefill, decode)
    vocab = case.params["vocab_size"]
    drawn = seed if calibration_seed is None else calibration_seed
    calibrated = calibration_arguments(directory, vocab, calibration, drawn) if calibration else []
    checks, float_logits = {}, None
    for how in lowerings:
        path = os.path.join(directory, f"{how}.pte")
        arguments = [*case.arguments(params_path, checkpoint_path), *calibrated, f"export.output_name={path}"]
        with qnn_causal_mask(mask) if mask is not None else contextlib.nullcontext():
            export = run_export_llm(arguments, lowering=how)
            if float_logits is None:
                float_logits = logits_sequence(one_token_at_a_time(eager_step(eager_model(export.config))), prompt, steps)
        record = export.swap.qnn
        with open(path, "rb") as f:
            loaded = LoadedProgram(f.read())
        actual = logits_sequence(one_token_at_a_time(lambda t, p: loaded.run([t, torch.tensor([p])])[0]), prompt, steps)
        decisions = record.decisions
        check = QnnProgramCheck(how, path, read_pte(path), record.rms_norms, sum(d.rebuilt for d in decisions),
                                len(decisions), "fake-quantized" if record.quantized else "eager")
        if record.quantized:
            rounded_down = norms_rounding_down(record.reference, prompt, steps)
            counting, tolerances = counted_step(record.reference, check.clipped)
            expected = logits_sequence(one_token_at_a_time(counting), prompt, steps)
            tolerances = tolerances[prompt.shape[1] - 1:]  # those of the calls whose logits are compared
            comparisons = [compare_at_steps(e, a, step, counted.steps)
                           for e, a, (step, counted) in zip(expected, actual, tolerances)]
            check.tolerances = tolerances
            check.told_apart = all(told_apart(e, c.allowed) for e, c in zip(expected, comparisons))
            check.versus_float = [max_error(e, a) for e, a in zip(float_logits, actual)]
            check.module_versus_float = [max_error(f, e) for f, e in zip(float_logits, expected)]
            check.module_mean_versus_float = [mean_error(f, e) for f, e in zip(float_logits, expected)]
            check.mean_errors = [mean_error(e, a) for e, a in zip(expected, actual)]
            check.rounding_down = [mean_error(e, a) for e, a in zip(rounded_down or [], actual)]
        else:
            comparisons = [compare(e, a, ulps=FP16_ULPS, dtype=torch.float16) for e, a in zip(float_logits, actual)]
        check.errors = [c.max_error for c in comparisons]
        check.allowed = [c.allowed for c in comparisons]
        checks[how] = check
    return checks


def passed(checks: dict[str, QnnProgramCheck]) -> bool:
    """edgefuse's program rebuilt every norm it decided on into a QNN RmsNorm, has at least stock's
    RmsNorm ops, and every program is within a bound that tells a wrong program apart."""
    ours, stock = checks.get("edgefuse"), checks.get("stock")
    if ours is None or not all(c.ok for c in checks.values()):
        return False
    return ours.rebuilt == ours.decisions == ours.rms_norms and (stock is None or ours.rms_norms >= stock.rms_norms)


HEADER = ("case", "lowering", "delegates", "kernels outside", "QNN RmsNorm", "rebuilt", "reference",
          "err", "allowed", "steps = max(roundings, carried) (coarsest step, in logit steps)", "vs float eager",
          "module vs float eager (max, mean)", "mean err", "mean err, RmsNorm rounding down",
          "clipped (ops, per op: how many, most levels beyond range)", "ok")


def rows(case: QnnCase, checks: dict[str, QnnProgramCheck]) -> list[list[object]]:
    result = []
    for how, check in checks.items():
        worst = max(range(len(check.errors)), key=lambda i: check.errors[i] / max(check.allowed[i], 1e-30))
        result.append([
            case.name, how, dict(check.contents.delegates), dict(check.contents.kernels), check.rms_norms,
            f"{check.rebuilt}/{check.decisions}" if how == "edgefuse" else "-", check.reference,
            f"{check.errors[worst]:.3g}", f"{check.allowed[worst]:.3g}", _roundings(check, worst),
            f"{max(check.versus_float):.3g}" if check.versus_float else "-",
            f"{max(check.module_versus_float):.3g}, {_mean(check.module_mean_versus_float)}"
            if check.module_versus_float else "-",
            _mean(check.mean_errors),
            _mean(check.rounding_down), _clipped(check),
            "yes" if check.ok else ("NOT TOLD APART" if check.within else "NO"),
        ])
    return result


def _mean(errors: list[float]) -> str:
    """The mean of per-call mean errors, "-" when there are none (a float program; stock's norms)."""
    return f"{sum(errors) / len(errors):.3g}" if errors else "-"


def _clipped(check: QnnProgramCheck) -> str:
    """``30 ops: mul 18 (1.6e+09), rsqrt 2 (1.8e+05), ...``: how many quantize ops of a quantized program's
    module clipped a value on the checked calls by more than half a level, and per op they quantize the
    output of, how many and the most levels beyond range, worst first."""
    if not check.tolerances:
        return "-"
    kinds: dict[str, list[float]] = {}
    for op, beyond in check.clipped.values():
        if beyond > 0.5:
            kinds.setdefault(op.split(".")[-2] if op.count(".") >= 2 else op, []).append(beyond)
    ranked = sorted(kinds.items(), key=lambda kind: -max(kind[1]))
    named = ", ".join(f"{op} {len(levels)} ({max(levels):.2g})" for op, levels in ranked)
    return f"{sum(len(levels) for levels in kinds.values())} ops: {named}" if kinds else "0 ops"


def _roundings(check: QnnProgramCheck, i: int) -> str:
    """``9 (1 after aten.add.Tensor = 15400)``: the roundings a quantized program's logits are allowed at
    call ``i``, and the coarsest step they depend on in steps of the logits ("-" for fp16)."""
    if not check.tolerances:
        return "-"
    step, counted = check.tolerances[i]
    return (f"{counted.steps:.0f} = max({counted.count}, {counted.carried:.1f}) "
            f"({counted.coarsest:.3g} after {counted.coarsest_op} = {counted.coarsest_steps:.0f}, "
            f"one level alone {counted.coarsest_carried:.0f})")


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (default ``sys.argv[1:]``); its exit code."""
    from edgefuse.console.command import run_command

    return run_command("python -m edgefuse.tools.llm_qnn_check", _main, argv)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefuse.tools.llm_qnn_check", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="llama-fp16,qwen3-fp16",
                        help=f"comma-separated, of {', '.join(CASES)} (default: the fp16 ones; the quantized "
                             "cannot be told apart from a wrong program, see the module doc)")
    parser.add_argument("--prefill", type=int, default=4, help="prompt tokens, one per call (default 4)")
    parser.add_argument("--decode", type=int, default=6, help="decode steps (default 6)")
    parser.add_argument("--mask", type=float, default=None, metavar="VALUE",
                        help="what the causal mask adds where a token may not look, in place of export_llm's "
                             "-inf (ExecuTorch's QNN Llama example: -255)")
    parser.add_argument("--calibration", type=int, default=0, metavar="CALLS",
                        help="quantized cases: calibrate over CALLS calls of a prompt and the model's own "
                             "tokens (default: export_llm's one call on its example input)")
    parser.add_argument("--seed", type=int, default=0,
                        help="draws the random weights and the calibration prompt (default 0); the checked "
                             "prompt stays the same")
    parser.add_argument("--calibration-seed", type=int, default=None, metavar="N",
                        help="draws the calibration prompt alone (default: --seed's), the weights staying "
                             "those of --seed")
    args = parser.parse_args(argv)
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.prefill < 1 or args.decode < 0 or args.prefill + args.decode > 127:
        parser.error("--prefill at least 1, --decode at least 0, together at most 127 (the default context is 128)")
    if not 0 <= args.calibration <= 128:
        parser.error("--calibration from 0 to 128 calls (the default context is 128)")
    if args.mask is not None and not -65504 <= args.mask < 0:
        parser.error("--mask is a negative float16 value, from -65504 to below 0")
    checked_seed(parser, args.seed)
    if args.calibration_seed is not None:
        checked_seed(parser, args.calibration_seed, "--calibration-seed")
        if not args.calibration:
            parser.error("--calibration-seed draws the prompt of --calibration: give --calibration CALLS")
    from edgefuse.inputs.errors import UNAVAILABLE, Unavailable
    from edgefuse.compare.qnn_flows import require_libraries
    from edgefuse.console.tables import format_table

    try:
        require_libraries()
    except Unavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return UNAVAILABLE
    import torch

    torch.set_num_threads(1)
    ok, table = True, []
    with tempfile.TemporaryDirectory(prefix="edgefuse-llm-qnn-check-") as directory:
        for name in names:
            sub = os.path.join(directory, name)
            os.makedirs(sub)
            checks = check_case(CASES[name], sub, args.prefill, args.decode, mask=args.mask,
                                calibration=args.calibration, seed=args.seed, calibration_seed=args.calibration_seed)
            ok = passed(checks) and ok
            table += rows(CASES[name], checks)
            print(format_table(HEADER, rows(CASES[name], checks)), file=sys.stderr, flush=True)
    print(format_table(HEADER, table))
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
