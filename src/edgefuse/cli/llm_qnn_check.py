"""Acceptance check of ``export-llm`` for QNN: ExecuTorch's Llama and Qwen3 from small params through
export_llm's own QNN path, stock beside edgefuse, run on QNN's x86 HTP emulator.

``python -m edgefuse.cli.llm_qnn_check [--cases llama-fp16,...] [--prefill 4] [--decode 6]``

For each case: write small params and a random checkpoint, export with ExecuTorch's ``export_llm``
(``backend.qnn.enabled=True``, KV cache, static shapes, SM8650) with the released QNN passes and with
edgefuse's, count the QNN ``RmsNorm`` ops QNN compiled, and run each ``.pte`` on the emulator through a
prompt (one token per call: export_llm's QNN programs take ``[1, 1]`` tokens) and decode steps.

- **fp16** (the HTP computes in float16): each step's logits against the eager model of the config
  (float32) at :data:`~edgefuse.cli.qnn_flows.FP16_ULPS` units in the last place of float16 at the largest
  logit, the bound ``lower --backend qnn`` derives for the tiny models (about 16 float16 roundings
  reach the output undamped, half a unit each).
- **quantized** (``quantization.pt2e_quantize=qnn_16a4w``, ``qnn_8a8w``, ``qnn_16a16w``): against the
  converted (fake-quantized) module export_llm lowered, at
  :data:`~edgefuse.cli.qnn_flows.QUANT_STEPS` steps of the logits' quantization scale; against float eager
  as information.

A case passes when edgefuse's program rebuilds every norm it decided on into one QNN ``RmsNorm``, has no
fewer RmsNorm ops than stock's, and stays within its bound at every step, as stock's is held to.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field

if __name__ == "__main__":
    from edgefuse.cli.progress import quiet_libraries

    quiet_libraries()

import torch

from edgefuse.llm.eager import SMALL_LLAMA, SMALL_QWEN3

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

    @property
    def within(self) -> bool:
        return bool(self.errors) and all(e <= a for e, a in zip(self.errors, self.allowed))


def one_token_at_a_time(step):
    """``step`` for a prompt of any length, fed one token per call as a static-shape QNN program takes it;
    the logits of the prompt's last token."""

    def fed(tokens: torch.Tensor, position: int) -> torch.Tensor:
        for i in range(tokens.shape[1]):
            logits = step(tokens[:, i : i + 1], position + i)
        return logits.reshape(-1).float()

    return fed


def check_case(case: QnnCase, directory: str, prefill: int = 4, decode: int = 6,
               lowerings=("stock", "edgefuse")) -> dict[str, QnnProgramCheck]:
    """Export ``case`` with each lowering in ``directory`` and check each program on the emulator."""
    from edgefuse.cli.qnn_flows import FP16_ULPS, QUANT_STEPS
    from edgefuse.llm.eager import eager_model, eager_step, logits_sequence, prompt_and_steps, write_small_model
    from edgefuse.llm.export import run_export_llm
    from edgefuse.llm.pte import read_pte
    from edgefuse.qnn.emulator import compare_at_steps, output_steps
    from edgefuse.runtime import LoadedProgram
    from edgefuse.verify import compare, max_error

    params_path, checkpoint_path = write_small_model(directory, case.params)
    prompt, steps = prompt_and_steps(case.params["vocab_size"], prefill, decode)
    checks, float_logits = {}, None
    for how in lowerings:
        path = os.path.join(directory, f"{how}.pte")
        export = run_export_llm([*case.arguments(params_path, checkpoint_path), f"export.output_name={path}"],
                                lowering=how)
        record = export.swap.qnn
        if float_logits is None:
            float_logits = logits_sequence(one_token_at_a_time(eager_step(eager_model(export.config))), prompt, steps)
        with open(path, "rb") as f:
            loaded = LoadedProgram(f.read())
        actual = logits_sequence(one_token_at_a_time(lambda t, p: loaded.run([t, torch.tensor([p])])[0]), prompt, steps)
        decisions = record.decisions
        check = QnnProgramCheck(how, path, read_pte(path), record.rms_norms, sum(d.rebuilt for d in decisions),
                                len(decisions), "fake-quantized" if record.quantized else "eager")
        if record.quantized:
            reference = record.reference
            (step,) = output_steps(reference)[:1]
            expected = logits_sequence(one_token_at_a_time(eager_step(reference)), prompt, steps)
            comparisons = [compare_at_steps(e, a, step, QUANT_STEPS) for e, a in zip(expected, actual)]
            check.versus_float = [max_error(e, a) for e, a in zip(float_logits, actual)]
        else:
            comparisons = [compare(e, a, ulps=FP16_ULPS, dtype=torch.float16) for e, a in zip(float_logits, actual)]
        check.errors = [c.max_error for c in comparisons]
        check.allowed = [c.allowed for c in comparisons]
        checks[how] = check
    return checks


def passed(checks: dict[str, QnnProgramCheck]) -> bool:
    """edgefuse's program rebuilt every norm it decided on into a QNN RmsNorm, has at least stock's
    RmsNorm ops, and every program is within its bound."""
    ours, stock = checks.get("edgefuse"), checks.get("stock")
    if ours is None or not all(c.within for c in checks.values()):
        return False
    return ours.rebuilt == ours.decisions == ours.rms_norms and (stock is None or ours.rms_norms >= stock.rms_norms)


HEADER = ("case", "lowering", "delegates", "kernels outside", "QNN RmsNorm", "rebuilt", "reference",
          "err", "allowed", "vs float eager", "ok")


def rows(case: QnnCase, checks: dict[str, QnnProgramCheck]) -> list[list[object]]:
    result = []
    for how, check in checks.items():
        worst = max(range(len(check.errors)), key=lambda i: check.errors[i] / max(check.allowed[i], 1e-30))
        result.append([
            case.name, how, dict(check.contents.delegates), dict(check.contents.kernels), check.rms_norms,
            f"{check.rebuilt}/{check.decisions}" if how == "edgefuse" else "-", check.reference,
            f"{check.errors[worst]:.3g}", f"{check.allowed[worst]:.3g}",
            f"{max(check.versus_float):.3g}" if check.versus_float else "-", "yes" if check.within else "NO",
        ])
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (default ``sys.argv[1:]``); its exit code."""
    from edgefuse.cli.errors import run_command

    return run_command("python -m edgefuse.cli.llm_qnn_check", _main, argv)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefuse.cli.llm_qnn_check", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="llama-fp16,qwen3-fp16,llama-16a4w",
                        help=f"comma-separated, of {', '.join(CASES)} (default: the fp16 ones and llama-16a4w)")
    parser.add_argument("--prefill", type=int, default=4, help="prompt tokens, one per call (default 4)")
    parser.add_argument("--decode", type=int, default=6, help="decode steps (default 6)")
    args = parser.parse_args(argv)
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.prefill < 1 or args.decode < 0 or args.prefill + args.decode > 127:
        parser.error("--prefill at least 1, --decode at least 0, together at most 127 (the default context is 128)")
    from edgefuse.cli.errors import UNAVAILABLE, Unavailable
    from edgefuse.cli.qnn_flows import require_libraries
    from edgefuse.cli.tables import format_table

    try:
        require_libraries()
    except Unavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return UNAVAILABLE
    torch.set_num_threads(1)
    ok, table = True, []
    with tempfile.TemporaryDirectory(prefix="edgefuse-llm-qnn-check-") as directory:
        for name in names:
            sub = os.path.join(directory, name)
            os.makedirs(sub)
            checks = check_case(CASES[name], sub, args.prefill, args.decode)
            ok = passed(checks) and ok
            table += rows(CASES[name], checks)
            print(format_table(HEADER, rows(CASES[name], checks)), file=sys.stderr, flush=True)
    print(format_table(HEADER, table))
    print("all passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
