"""``python -m edgefuse.tools.llm_qnn_check``: a mask, a calibration or a seed it cannot use is an error
naming the option, before any work; ``--seed`` draws the weights and the calibration prompt."""

from __future__ import annotations

import pytest
import torch

import edgefuse.llm.eager
from edgefuse.tools import llm_qnn_check
from edgefuse.tools.llm_qnn_check import CASES, calibration_arguments, check_case, main


@pytest.mark.parametrize("argv, message", [
    (["--mask", "3"], "--mask is a negative float16 value"),
    (["--mask=-1e6"], "--mask is a negative float16 value"),
    (["--mask", "nan"], "--mask is a negative float16 value"),
    (["--calibration", "-1"], "--calibration from 0 to 128 calls"),
    (["--calibration", "129"], "--calibration from 0 to 128 calls"),
    (["--seed", "-1"], "--seed is a whole number from 0 to 9223372036854775806"),
    (["--seed", str(2**63 - 1)], "--seed is a whole number from 0 to 9223372036854775806"),
    (["--calibration", "16", "--calibration-seed", "-1"], "--calibration-seed is a whole number from 0 to 9223372036854775806"),
    (["--calibration", "16", "--calibration-seed", str(2**63 - 1)],
     "--calibration-seed is a whole number from 0 to 9223372036854775806"),
    (["--calibration-seed", "3"], "--calibration-seed draws the prompt of --calibration: give --calibration CALLS"),
])
def test_each_bad_option_names_itself(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_seed_reaches_each_case(monkeypatch):
    """The command hands ``--seed`` to every case it checks, 0 when not given."""
    import edgefuse.compare.qnn_flows

    seeds = []
    monkeypatch.setattr(edgefuse.compare.qnn_flows, "require_libraries", lambda: None)
    monkeypatch.setattr(llm_qnn_check, "check_case", lambda *args, seed, **kwargs: seeds.append(seed) or {})
    main(["--cases", "llama-16a4w,llama-8a8w", "--seed", "3"])
    main(["--cases", "llama-16a4w"])
    assert seeds == [3, 3, 0]


def test_calibration_seed_reaches_each_case_none_when_not_given(monkeypatch):
    """``--calibration-seed`` reaches every case beside ``--seed``; not given, the case draws the
    calibration from ``--seed`` as before."""
    import edgefuse.compare.qnn_flows

    seeds = []
    monkeypatch.setattr(edgefuse.compare.qnn_flows, "require_libraries", lambda: None)
    monkeypatch.setattr(llm_qnn_check, "check_case",
                        lambda *args, seed, calibration_seed, **kwargs: seeds.append((seed, calibration_seed)) or {})
    main(["--cases", "llama-16a4w", "--calibration", "16", "--seed", "7", "--calibration-seed", "2"])
    main(["--cases", "llama-16a4w", "--calibration", "16", "--seed", "7"])
    assert seeds == [(7, 2), (7, None)]


class _Stop(Exception):
    """Ends :func:`check_case` before it exports."""


def test_seed_draws_the_weights_and_the_calibration(monkeypatch, tmp_path):
    drawn = {}

    def weights(directory, params, seed=0):
        drawn["weights"] = seed
        return "params.json", "checkpoint.pth"

    def calibration(directory, vocab, calls, seed=0):
        drawn["calibration"] = seed
        raise _Stop

    monkeypatch.setattr(edgefuse.llm.eager, "write_small_model", weights)
    monkeypatch.setattr(llm_qnn_check, "calibration_arguments", calibration)
    with pytest.raises(_Stop):
        check_case(CASES["llama-16a4w"], str(tmp_path), calibration=16, seed=5)
    assert drawn == {"weights": 5, "calibration": 5}
    with pytest.raises(_Stop):
        check_case(CASES["llama-16a4w"], str(tmp_path), calibration=16, seed=5, calibration_seed=9)
    assert drawn == {"weights": 5, "calibration": 9}


def test_calibration_prompt_follows_the_seed_and_seed_0_keeps_the_first_one(tmp_path):
    """Seed 0 calibrates on the prompt the command always drew (from 1, so never the checked prompt, drawn
    from 0); another seed on another prompt."""
    from edgefuse.llm.eager import prompt_and_steps, token_text

    def data(seed):
        (override,) = [a for a in calibration_arguments(str(tmp_path), 256, 16, seed) if "calibration_data" in a]
        return override.split("=", 1)[1]

    first, _ = prompt_and_steps(256, llm_qnn_check.CALIBRATION_PROMPT, 0, seed=1)
    assert data(0) == token_text(first)
    assert data(0) != data(1) and data(1) != data(2)


class _NormModel(torch.nn.Module):
    """A converted module's shape as export_llm's QNN programs take it (tokens, then the position), with a
    quantized norm, or without one (``norm=False``: as stock's norms in pieces hold no ``rms_norm``); it counts
    its calls in a buffer, as a KV cache is written."""

    def __init__(self, norm: bool = True):
        super().__init__()
        self.norm = norm
        self.embedding = torch.nn.Embedding(16, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, tokens, input_pos):
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

        self.calls.add_(input_pos.new_ones(()))
        x = self.embedding(tokens) + input_pos
        y = torch.ops.aten.rms_norm.default(x, [8], None, 1e-6) if self.norm else x * 0.5
        ops = torch.ops.quantized_decomposed
        return ops.dequantize_per_tensor.default(ops.quantize_per_tensor.default(y, 0.01, 0, -128, 127, torch.int8),
                                                 0.01, 0, -128, 127, torch.int8)


def test_norms_rounding_down_runs_a_copy_with_each_norm_output_rounded_down():
    from edgefuse.tools.llm_qnn_check import norms_rounding_down

    torch.manual_seed(0)
    reference = torch.fx.symbolic_trace(_NormModel())
    prompt, steps = torch.tensor([[3, 5]]), torch.tensor([[[7]], [[9]]])
    got = norms_rounding_down(reference, prompt, steps)
    for logits, (token, position) in zip(got, [(5, 1), (7, 2), (9, 3)]):
        exact = torch.ops.aten.rms_norm.default(reference.embedding(torch.tensor([[token]])) + position, [8], None, 1e-6)
        assert torch.equal(logits, (torch.floor(exact / 0.01).clamp(-128, 127) * 0.01).reshape(-1))
    assert reference.calls == 0  # a copy ran: the reference's state is as it was
    assert norms_rounding_down(torch.fx.symbolic_trace(_NormModel(norm=False)), prompt, steps) is None


def test_each_row_gives_the_mean_errors():
    from edgefuse.tools.llm_qnn_check import HEADER, QnnProgramCheck, rows

    def check(how, rounding_down):
        return QnnProgramCheck(how, "p.pte", type("Contents", (), {"delegates": {}, "kernels": {}})(), 0, 0, 0,
                               "fake-quantized", errors=[0.1, 0.2], allowed=[1.0, 1.0], mean_errors=[0.01, 0.03],
                               rounding_down=rounding_down, module_versus_float=[3.5, 2.0],
                               module_mean_versus_float=[2.0, 3.0])

    table = rows(CASES["llama-16a4w"], {"stock": check("stock", []), "edgefuse": check("edgefuse", [0.002, 0.004])})
    mean, down = HEADER.index("mean err"), HEADER.index("mean err, RmsNorm rounding down")
    assert [(row[mean], row[down]) for row in table] == [("0.02", "-"), ("0.02", "0.003")]
    module = HEADER.index("module vs float eager (max, mean)")
    assert [row[module] for row in table] == ["3.5, 2.5"] * 2


class _Reference(torch.fx.GraphModule):
    """A traced :class:`_NormModel` called as export_llm's converted module is: tokens, then ``{"input_pos": ...}``."""

    def __call__(self, tokens, kwargs):
        return super().__call__(tokens, kwargs["input_pos"])


#: What the stand-in program adds to its module's logits: two of their quantization steps.
_OFF = 0.02


def _stand_ins(monkeypatch, fed: list) -> None:
    """export_llm, the float model and the program loader replaced: each lowering's converted module is a
    :class:`_Reference` (a norm for edgefuse, none for stock), the float model gives logits of 5, and the
    program gives its module's logits plus :data:`_OFF`, recording the tokens it is fed in ``fed``."""
    import copy
    from types import SimpleNamespace

    import edgefuse.llm.export
    import edgefuse.llm.pte
    import edgefuse.runtime

    references = {}

    def export(arguments, lowering):
        (path,) = [a.split("=", 1)[1] for a in arguments if a.startswith("export.output_name=")]
        open(path, "wb").close()
        torch.manual_seed(0)
        model = _NormModel(norm=lowering == "edgefuse")
        references[path] = _Reference(model, torch.fx.Tracer().trace(model))
        decisions = [SimpleNamespace(rebuilt=True)] if lowering == "edgefuse" else []
        record = SimpleNamespace(decisions=decisions, rms_norms=len(decisions), quantized=True, reference=references[path])
        return SimpleNamespace(config=None, swap=SimpleNamespace(qnn=record))

    class Program:
        def __init__(self, pte):
            self.module = copy.deepcopy(next(reversed(references.values())))  # the program just written

        def run(self, inputs):
            tokens, position = inputs
            fed.append(tokens.flatten().tolist())
            return [self.module(tokens, {"input_pos": position}) + _OFF]

    monkeypatch.setattr(edgefuse.llm.eager, "write_small_model", lambda directory, params, seed=0: ("p.json", "c.pth"))
    monkeypatch.setattr(edgefuse.llm.eager, "eager_model", lambda config: lambda tokens, kwargs: torch.full((1, 1, 8), 5.0))
    monkeypatch.setattr(edgefuse.llm.export, "run_export_llm", export)
    monkeypatch.setattr(edgefuse.llm.pte, "read_pte", lambda path: None)
    monkeypatch.setattr(edgefuse.runtime, "LoadedProgram", Program)


def test_a_quantized_program_is_held_to_its_module_and_edgefuses_to_its_norms_rounding_down(monkeypatch, tmp_path):
    """The quantized branch of :func:`check_case`: errors and mean errors against the converted module's
    logits, not float eager's, each allowed the module's step times its counted steps, at the calls whose
    logits are compared (not the prompt's first); against the module whose norms round down for
    edgefuse's lowering, whose module has a norm (none for stock's)."""
    case = llm_qnn_check.QnnCase("tiny-8a8w", {"vocab_size": 16}, "llama3", "qnn_8a8w")
    _stand_ins(monkeypatch, [])
    checks = check_case(case, str(tmp_path), prefill=2, decode=3)
    for check in checks.values():
        assert check.errors == pytest.approx([_OFF] * 4, abs=1e-6)
        assert len(check.tolerances) == 4  # five calls (two prompt tokens, three decoded), the first one's logits unchecked
        assert [step for step, _ in check.tolerances] == [0.01] * 4  # the logits' quantization step
        steps = [counted.steps for _, counted in check.tolerances]
        assert steps == pytest.approx([1.0] * 4, abs=1e-4)  # one rounding, carried one step
        allowed = [step * counted.steps for step, counted in check.tolerances]
        assert check.allowed == pytest.approx(allowed, abs=1e-6)  # plus float32's rounding at the logits' magnitude
        assert check.told_apart is False  # 0.01 is looser than float16's bound on logits within 1.28 of 0
        assert check.mean_errors == pytest.approx([_OFF] * 4, abs=1e-6)
        assert min(check.versus_float) > 3  # the module's logits are within 1.28 of 0, the float model's 5
        # the module itself against float eager: the program's distance from it less the program's offset
        assert check.module_versus_float == pytest.approx([v + _OFF for v in check.versus_float], abs=1e-6)
        means = check.module_mean_versus_float
        assert len(means) == 4 and all(5 - 1.28 <= m <= v for m, v in zip(means, check.module_versus_float))
    ours = checks["edgefuse"]  # a norm's logits differ from one another: their mean error is not the largest
    assert all(m < v for m, v in zip(ours.module_mean_versus_float, ours.module_versus_float))
    assert checks["stock"].rounding_down == []
    down = checks["edgefuse"].rounding_down
    assert len(down) == 4 and all(_OFF < d <= _OFF + 0.01 + 1e-6 for d in down)


def test_the_checked_prompt_does_not_change_with_the_seed(monkeypatch, tmp_path):
    case = llm_qnn_check.QnnCase("tiny-8a8w", {"vocab_size": 16}, "llama3", "qnn_8a8w")
    fed = {}
    for seed in (0, 3):
        fed[seed] = []
        (tmp_path / str(seed)).mkdir()
        _stand_ins(monkeypatch, fed[seed])
        check_case(case, str(tmp_path / str(seed)), prefill=2, decode=3, lowerings=("edgefuse",), seed=seed)
    assert len(fed[0]) == 5 and fed[0] == fed[3]
