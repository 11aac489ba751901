"""The QNN RmsNorm shape sweep: which input shapes QNN's own ``RmsNorm`` computes wrong on the HTP emulator.

``python -m edgefuse.tools.qnn_sweep PLAN --out DIR [--soc SM8650] [--precision fp16] [--flow stock]``
``python -m edgefuse.tools.qnn_sweep --table`` (the SoC table of docs/qnn-limits.md, from the profile)

Each case of the plan (:data:`PLANS`: an input shape, the norm written whole as ``F.rms_norm`` or
decomposed as the Llama form, with or without a weight) is lowered with ExecuTorch's QNN flow for the SoC
at the precision, run on the x86 HTP emulator and compared with its reference (eager for fp16, the
fake-quantized module otherwise). ``--flow stock`` (the default) measures QNN's op on the shape as
written; ``--flow edgefuse`` measures what edgefuse hands QNN. Cases are compiled 16 to a program; a
wrong norm can corrupt other outputs of its program, so every case found wrong in a program (or in a
program that failed to lower) is measured again alone, and its alone result is its verdict.

Each program's records go to ``DIR/<plan>__<soc>__<precision>__<flow>/<batch>.jsonl`` (one JSON line a
case); a rerun skips the batches already there. The table printed at the end counts the cases, the wrong
ones, and the wrong ones whose dims before the last two are all 1 (the ``[1, rows, D]`` view edgefuse
rebuilds on). Exit status: 0; 2 for bad options or a SoC QNN does not compile for at that precision; 3
when the QNN libraries are not set up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random

if __name__ == "__main__":  # run as a command: torchao and torch log warnings as they are imported below
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()

from edgefuse.console.command import run_command
from edgefuse.inputs.errors import OK, UsageError
from edgefuse.qnn.precisions import LOWER_PRECISIONS

PROG = "python -m edgefuse.tools.qnn_sweep"
EPS = 1e-6
#: The leading dims and widths of the grid plans (the issue's sweep), and the bounds a program keeps to.
LEAD = (1, 2, 3, 4, 8, 16, 128)
WIDTH = (8, 24, 32, 48, 64, 96, 128, 200, 256, 1024, 4096)
CASE_MAX = 1 << 18
BATCH_MAX = 1 << 18
BATCH_CASES = 16
FLOWS = ("stock", "edgefuse")


def _cases(shapes, forms=("whole",), weights=(True,)) -> list[dict]:
    return [dict(shape=list(s), form=f, weight=w) for s in shapes for f in forms for w in weights
            if math.prod(s) <= CASE_MAX]


def plan_rank2():
    """[S, D] for S in LEAD and 1024, 4096, every D in WIDTH."""
    return _cases([(s, d) for s in LEAD + (1024, 4096) for d in WIDTH])


def plan_rank3():
    """[a, S, D] for every a, S in LEAD and D in WIDTH."""
    return _cases([(a, s, d) for a in LEAD for s in LEAD for d in WIDTH])


def plan_rank4():
    """[a, b, S, D]: a, b in LEAD, S in {1, 2, 4, 8, 16, 128}, D in {8, 32, 64, 128}."""
    return _cases([(a, b, s, d) for a in LEAD for b in LEAD for s in (1, 2, 4, 8, 16, 128) for d in (8, 32, 64, 128)])


def plan_fine3():
    """[a, S, 32] on a fine grid of a and S: where the wrong region's edges lie at a last dim of 32."""
    fine_a = list(range(1, 21)) + [24, 31, 32, 33, 48, 64, 96, 128, 256]
    fine_s = list(range(1, 21)) + [24, 32, 64, 128]
    return _cases([(a, s, 32) for a in fine_a for s in fine_s])


def plan_width():
    """Last dims 1 to 72 at (a, S) pairs wrong at D=32 and right at D=32."""
    ds = list(range(1, 41)) + [44, 47, 48, 56, 63, 64, 65, 72]
    pairs = [(2, 16), (3, 16), (16, 1), (16, 4), (128, 4), (8, 16), (16, 16), (1, 64)]
    return _cases([(a, s, d) for a, s in pairs for d in ds])


def plan_hgrid():
    """Dim -3 on a fine grid, at last dims up to 512."""
    hs = list(range(1, 25)) + [25, 28, 32, 33, 36, 40, 48, 64, 72, 128]
    return _cases([(h, w, d) for h in hs for w in (1, 4, 8, 16, 64) for d in (16, 40, 64, 128, 512)])


def plan_rows():
    """The remedy's view: [1, R, D] for R up to 16384 and every D in WIDTH (up to 4M elements a case)."""
    rows = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 1000,
            1024, 2048, 4095, 4096, 8192, 16384)
    return [dict(shape=[1, r, d], form="whole", weight=True) for r in rows for d in WIDTH if r * d <= 1 << 22]


def plan_random():
    """200 seeded random shapes of rank 2 to 4, last dims mostly up to 64."""
    rng = random.Random(26)
    lead = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 24, 31, 32, 33, 40, 48, 64, 96, 128]
    ds = list(range(1, 65)) + [72, 96, 100, 128, 200, 256, 384]
    shapes: set[tuple[int, ...]] = set()
    while len(shapes) < 200:
        rank = rng.choice((2, 3, 3, 4, 4))
        shape = tuple(rng.choice(lead) for _ in range(rank - 1)) + (rng.choice(ds),)
        if math.prod(shape) <= CASE_MAX:
            shapes.add(shape)
    return _cases(sorted(shapes))


#: Shapes found wrong at fp16 on SM8650, and right neighbours of them.
WRONG3 = [(2, 16, 32), (3, 16, 8), (4, 16, 24), (16, 1, 32), (16, 4, 8), (16, 8, 32), (128, 2, 24), (128, 8, 8)]
RIGHT3 = [(8, 16, 32), (16, 16, 32), (2, 8, 32), (2, 16, 48), (16, 4, 64), (128, 16, 8), (1, 128, 32), (2, 128, 32)]


def plan_forms():
    """Whole and decomposed, with and without a weight, on wrong and right shapes."""
    shapes = WRONG3 + RIGHT3 + [(1, 16, 4, 32), (1, 4, 16, 32), (2, 2, 16, 8), (1, 4, 16, 64), (2, 16, 64)]
    return _cases(shapes, forms=("whole", "dec"), weights=(True, False))


def plan_quant3():
    """[a, S, D] for a, S in LEAD and D in {8, 24, 32, 64, 128, 256, 1024}: the rank-3 plan for quantized precisions."""
    return _cases([(a, s, d) for a in LEAD for s in LEAD for d in (8, 24, 32, 64, 128, 256, 1024)])


def plan_confirm():
    """The subset run on every HTP generation: the map at D=32 on a coarse grid, the width edge, rank 4,
    rank 2 and the [1, rows, D] view (118 cases, 117 distinct)."""
    hs, ws = (1, 2, 5, 8, 9, 12, 13, 16, 128), (1, 4, 8, 9, 16, 17, 32, 64, 128)
    shapes = [(h, w, 32) for h in hs for w in ws]
    shapes += [(h, w, d) for h, w in ((2, 16), (16, 4), (9, 32)) for d in (8, 16, 31, 33, 48, 64, 128)]
    shapes += [(2, 16, 4, 32), (4, 2, 16, 32), (3, 12, 20, 16), (2, 1, 16, 32), (1, 4, 16, 64), (2, 16, 8, 128)]
    shapes += [(16, 32), (4096, 32), (128, 8)]
    shapes += [(1, r, d) for r in (64, 1024, 4096) for d in (32, 64, 128)]
    return _cases(shapes)


PLANS = {
    "rank2": plan_rank2, "rank3": plan_rank3, "rank4": plan_rank4, "fine3": plan_fine3, "width": plan_width,
    "hgrid": plan_hgrid, "rows": plan_rows, "random": plan_random, "forms": plan_forms, "quant3": plan_quant3,
    "confirm": plan_confirm,
}


def make_input(shape, seed: int):
    """A float16-exact input whose rows have scales from 0.5 to 2, so a norm that reads another row's rms shows."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = math.prod(shape[:-1])
    scales = torch.exp(torch.empty(rows).uniform_(math.log(0.5), math.log(2.0), generator=g))
    x = torch.randn(rows, shape[-1], generator=g) * scales[:, None] * 1.5
    return x.reshape(shape).half().float()


def _batch_module(cases, seed: int):
    """One module holding a norm per case: N inputs in, N outputs out."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Norm(nn.Module):
        def __init__(self, case, seed):
            super().__init__()
            self.form, d = case["form"], case["shape"][-1]
            weight = (torch.rand(d, generator=torch.Generator().manual_seed(seed)) + 0.5).half().float()
            self.weight = nn.Parameter(weight) if case["weight"] else None

        def forward(self, x):
            if self.form == "whole":
                return F.rms_norm(x, (x.shape[-1],), self.weight, EPS)
            h = x.float()
            h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x)
            return self.weight * h if self.weight is not None else h

    class Batch(nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = nn.ModuleList(Norm(c, seed + 7777 + i) for i, c in enumerate(cases))

        def forward(self, *xs):
            return tuple(norm(x) for norm, x in zip(self.norms, xs))

    return Batch().eval()


def measure(cases, *, soc: str, precision: str, flow: str, runs: int, seed: int = 0) -> list[dict]:
    """Lower the cases as one program, run it ``runs`` times (the emulator is not deterministic on the
    shapes it computes wrong) and return a record per case with its worst run, or a failure per case."""
    import torch

    from edgefuse.core.verify import TOLERANCES
    from edgefuse.qnn import QnnLoweringFailed, lower
    from edgefuse.qnn.emulator import output_steps, run_on_emulator

    xs = tuple(make_input(c["shape"], seed * 1000 + i) for i, c in enumerate(cases))
    try:
        with torch.no_grad():
            lowered = lower(_batch_module(cases, seed * 1000), xs, soc=soc, precision=precision, recompose=flow)
        pte = lowered.to_pte()
        outs = [run_on_emulator(pte, xs) for _ in range(runs)]
    except (QnnLoweringFailed, RuntimeError) as error:
        return [dict(c, status="failed", error=" ".join(str(error).split())[:600]) for c in cases]
    with torch.no_grad():
        refs = lowered.reference(*xs)
    steps = output_steps(lowered.reference) if lowered.quantized else [None] * len(cases)
    seen = sorted(list(op.inputs[0][0]) for g in lowered.graphs.delegates for op in g.ops if op.type == "RmsNorm")
    records = []
    for i, case in enumerate(cases):
        ref = refs[i].float()
        scale = max(float(ref.abs().max()), 1e-12)
        error = max(float((run[i].float() - ref).abs().max()) for run in outs)
        if lowered.quantized:
            allowed = TOLERANCES["qnn sweep quantized"].ulps * (steps[i] or 0.0)
        else:
            allowed = TOLERANCES["qnn sweep float16"].ulps * torch.finfo(torch.float16).eps * scale
        records.append(dict(case, status="ok", error=error, scale=scale, allowed=allowed, wrong=error > allowed,
                            step=steps[i], qnn_shapes=seen))
    return records


def batches(cases: list[dict], prefix: str) -> list[tuple[str, list[dict]]]:
    """The cases packed in order, at most :data:`BATCH_CASES` cases and :data:`BATCH_MAX` elements a program."""
    out, current, size = [], [], 0
    for case in cases:
        n = math.prod(case["shape"])
        if current and (len(current) >= BATCH_CASES or size + n > BATCH_MAX):
            out.append(current)
            current, size = [], 0
        current.append(case)
        size += n
    if current:
        out.append(current)
    return [(f"{prefix}{i}", b) for i, b in enumerate(out)]


def sweep(plan: str, folder: str, *, soc: str, precision: str, flow: str, runs: int, say) -> list[dict]:
    """Run ``plan``, writing each program's records to ``folder`` and skipping those written; the verdict
    of each case (its alone result where it was measured alone)."""
    from edgefuse.runtime.files import own_folder, read_regular, write_new

    own_folder(folder)
    cases = sorted(PLANS[plan](), key=lambda c: math.prod(c["shape"]))
    jobs = [(bid, b, "batch") for bid, b in batches(cases, "")]
    verdicts: dict[str, dict] = {}
    while jobs:
        bid, job, mode = jobs.pop(0)
        path = os.path.join(folder, f"{bid}.jsonl")
        if os.path.exists(path):
            records = [json.loads(line) for line in read_regular(path, 1 << 24, "a sweep record").decode().splitlines()]
        else:
            records = [dict(r, batch=bid, mode=mode) for r in measure(job, soc=soc, precision=precision, flow=flow, runs=runs)]
            write_new(path, "".join(json.dumps(r) + "\n" for r in records))
        wrong = [i for i, r in enumerate(records) if r["status"] != "ok" or r["wrong"]]
        say(f"{bid}: {len(records)} cases, {len(wrong)} wrong or failed")
        if mode == "batch" and len(job) > 1:
            jobs += [(f"{bid}-alone-{i}", [job[i]], "alone") for i in wrong]
        for record in records:
            key = json.dumps([record["shape"], record["form"], record["weight"]])
            if mode == "alone" or key not in verdicts:
                verdicts[key] = record
    return list(verdicts.values())


def summary(records: list[dict]) -> dict[str, int]:
    """The counts the table prints: cases, wrong, failed, and cases and wrong ones whose dims before the last two are all 1."""
    def leading_ones(r):
        return math.prod(r["shape"][:-2]) == 1

    ok = [r for r in records if r["status"] == "ok"]
    return dict(
        cases=len(records), wrong=sum(r["wrong"] for r in ok), failed=len(records) - len(ok),
        rows_cases=sum(leading_ones(r) for r in ok), rows_wrong=sum(r["wrong"] and leading_ones(r) for r in ok),
    )


TABLE_HEADER = ("SoC", "HTP arch", "fp16 compiles", "limits held", "measured on")


def limits_table() -> str:
    """The Markdown table of each SoC, its HTP generation, whether float16 compiles, its limits and where they were measured."""
    from edgefuse.qnn.socs import limits_by_soc
    from edgefuse.tools.qnn_check import markdown

    return markdown(TABLE_HEADER, limits_by_soc())


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (default ``sys.argv[1:]``); its exit code."""
    return run_command(PROG, _main, argv)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="Which input shapes QNN's RmsNorm computes wrong on "
                                     "the x86 HTP emulator, plan by plan.")
    parser.add_argument("plan", nargs="?", choices=sorted(PLANS))
    parser.add_argument("--out", help="the folder the JSON lines go to (made if missing)")
    parser.add_argument("--table", action="store_true", help="print the SoC table of the qnn profile and stop")
    parser.add_argument("--soc", default="SM8650", help="the Qualcomm SoC to compile for (default SM8650)")
    parser.add_argument("--precision", default="fp16", choices=LOWER_PRECISIONS, help="fp16 (default) or a "
                        "quantized precision of edgefuse's QNN pipeline")
    parser.add_argument("--flow", default="stock", choices=FLOWS, help="stock: QNN's op on the shape as written "
                        "(default); edgefuse: what edgefuse hands QNN")
    parser.add_argument("--runs", type=int, default=3, help="runs of each program (the worst counts)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.table:
        print(limits_table())
        return OK
    if args.plan is None or args.out is None:
        raise UsageError("give a PLAN and --out DIR (or --table)")
    if args.runs < 1:
        raise UsageError("--runs must be 1 or more")
    from edgefuse.qnn.socs import htp_arch, soc_problem

    problem = soc_problem(args.soc, args.precision)
    if problem is not None:
        raise UsageError(problem)

    from edgefuse.compare.qnn_flows import require_libraries
    from edgefuse.console.progress import Progress
    from edgefuse.console.tables import format_table
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()
    require_libraries()
    folder = os.path.join(args.out, f"{args.plan}__{args.soc}__{args.precision}__{args.flow}")
    records = sweep(args.plan, folder, soc=args.soc, precision=args.precision, flow=args.flow, runs=args.runs,
                    say=Progress(enabled=not args.quiet))
    counts = summary(records)
    header = ("plan", "SoC", "HTP", "precision", "flow", "cases", "wrong", "failed", "[1, rows, D] cases",
              "[1, rows, D] wrong")
    print(format_table(header, [[args.plan, args.soc, htp_arch(args.soc), args.precision, args.flow, *counts.values()]]))
    wrong = sorted((r for r in records if r["status"] == "ok" and r["wrong"]), key=lambda r: (len(r["shape"]), r["shape"]))
    if wrong:
        rows = [[str(r["shape"]), r["form"], "yes" if r["weight"] else "no", f"{r['error']:.3g}", f"{r['allowed']:.3g}"]
                for r in wrong]
        print(format_table(("wrong shape", "form", "weight", "max err", "allowed"), rows))
    print(f"records: {folder}")
    return OK


if __name__ == "__main__":
    raise SystemExit(main())
