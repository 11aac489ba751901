"""The bound ``python -m edgefuse.tools.llm_check`` holds an 8da4w program to: stock's error at each step,
plus for edgefuse the float32 bound and the step's rounding floor (what summing every norm's mean in
another order does to eager's own logits)."""

from __future__ import annotations

import pytest
import torch

from edgefuse.core.verify import TOLERANCES, finite_tolerance
from edgefuse.tools import llm_check


@pytest.fixture
def no_pte(monkeypatch):
    """checked_logits reads each program's contents; these logits have no program."""
    from edgefuse.llm import pte

    monkeypatch.setattr(pte, "read_pte", lambda path: None)


def _logits(off: float) -> list[torch.Tensor]:
    """Two steps of logits of order one, the first value ``off`` from eager's."""
    steps = [torch.linspace(-3.0, 3.0, 64), torch.linspace(-2.0, 4.0, 64)]
    for s in steps:
        s[0] += off
    return steps


def _checks(edgefuse_off: float, floor, quantized: bool = True):
    expected, stock, ours = _logits(0.0), _logits(0.2), _logits(edgefuse_off)
    paths = {"stock": "stock.pte", "edgefuse": "edgefuse.pte"}
    return llm_check.checked_logits(expected, {"stock": stock, "edgefuse": ours}, paths, torch.float32, quantized, floor)


def test_a_quantized_program_may_be_off_eager_by_stocks_error_plus_the_rounding_floor(no_pte):
    """edgefuse 0.25 off where stock is 0.2 off: within stock's error plus a floor of 0.1, not within stock's
    error plus the float32 bound alone; 0.31 off is beyond both (the floor is all it grants)."""
    checks = _checks(0.25, [0.1, 0.1])
    assert checks["stock"].matches and checks["edgefuse"].matches
    assert checks["edgefuse"].floor == [0.1, 0.1]
    bound = finite_tolerance(torch.float32, _logits(0.0)[0], TOLERANCES["model logits"].ulps)
    assert checks["edgefuse"].allowed[0] == pytest.approx(0.2 + bound + 0.1)
    assert not _checks(0.25, None)["edgefuse"].matches  # no floor measured: stock's error plus the bound
    assert not _checks(0.31, [0.1, 0.1])["edgefuse"].matches
    assert _checks(0.2, None)["edgefuse"].matches


def test_the_worst_step_is_the_one_that_misses_its_bound_not_the_largest_error():
    """The tables show one step a program: the step that misses its bound when one does (at Qwen3-0.6B's 2
    layers, stock's rule of before missed at the prompt by 0.003 where the largest error, at a decode step,
    was within; the row read 0.155 allowed 0.155 NO), and stock's largest error when every step is its own."""
    check = llm_check.ProgramCheck("edgefuse", "edgefuse.pte", None, [0.1476, 0.1551], [0.1445, 0.1552])
    assert check.worst == (0.1476, 0.1445) and not check.matches
    stock = llm_check.ProgramCheck("stock", "stock.pte", None, [0.1444, 0.1551, 0.1481], [0.1444, 0.1551, 0.1481])
    assert stock.worst == (0.1551, 0.1551)


def test_a_float_program_gets_no_floor(no_pte):
    """In float the programs are held to eager and to stock by the dtype's bound; a floor passed changes nothing
    (0.05 off is within a floor of 0.1, not within the bound)."""
    checks = _checks(0.05, [0.1, 0.1], quantized=False)
    bound = [finite_tolerance(torch.float32, e, TOLERANCES["model logits"].ulps) for e in _logits(0.0)]
    for check in checks.values():
        assert check.floor == [] and check.allowed == bound
    assert not checks["edgefuse"].matches


def test_stocks_quantized_program_gets_no_floor(no_pte):
    """Stock's program is the reference of what the quantized runtime computes: allowed its own errors, no floor."""
    stock = _checks(0.25, [0.1, 0.1])["stock"]
    assert stock.floor == [] and stock.allowed == stock.errors


def test_a_step_that_allows_no_finite_error_fails(no_pte):
    """A step whose bound is not finite (stock's logits not a number there, or a floor that is not) holds
    nothing: stock's program and edgefuse's, 5 off eager at every step, both fail."""
    expected, ours = _logits(0.0), _logits(5.0)
    stock = _logits(0.0)
    stock[0][3] = float("nan")
    paths = {"stock": "stock.pte", "edgefuse": "edgefuse.pte"}
    checks = llm_check.checked_logits(expected, {"stock": stock, "edgefuse": ours}, paths, torch.float32, True, [0.0, 0.0])
    assert not checks["stock"].matches and not checks["edgefuse"].matches
    checks = llm_check.checked_logits(expected, {"stock": _logits(0.2), "edgefuse": _logits(0.2)}, paths, torch.float32,
                                      True, [float("inf"), 0.0])
    assert checks["stock"].matches and not checks["edgefuse"].matches
    assert checks["edgefuse"].worst_step == 0  # the step that holds nothing is the one shown
    stock = llm_check.ProgramCheck("stock", "stock.pte", None, [0.1, float("inf")], [0.1, float("inf")])
    assert stock.worst_step == 1 and not stock.matches


@pytest.mark.parametrize("name", ["qwen3-8da4w", "qwen3-fp32"])
def test_check_programs_measures_the_floor_of_a_quantized_case_alone(tmp_path, monkeypatch, name):
    """check_programs hands checked_logits the floor measured on the eager module for a quantized case, and
    none for a float one (nothing runs: the module, the programs and the measure are stand-ins)."""
    from edgefuse import runtime
    from edgefuse.compare import llm_programs
    from edgefuse.llm import eager
    from edgefuse.quant import rounding

    model, logits, floor, seen = object(), [torch.zeros(4)], [0.5], {}
    monkeypatch.setattr(llm_programs, "load_llm_kernels", lambda: None)
    monkeypatch.setattr(runtime, "LoadedProgram", lambda data: None)
    monkeypatch.setattr(eager, "eager_model", lambda config: model)
    monkeypatch.setattr(eager, "logits_sequence", lambda step, prompt, steps: logits)
    monkeypatch.setattr(rounding, "rounding_floor",
                        lambda m, outputs, expected: floor if m is model and outputs() is logits else None)
    monkeypatch.setattr(llm_check, "checked_logits", lambda *args: seen.setdefault("args", args))
    paths = {}
    for how in ("stock", "edgefuse"):
        paths[how] = str(tmp_path / f"{how}.pte")
        open(paths[how], "wb").close()
    llm_check.check_programs(llm_check.CASES[name], paths, config=None)
    assert seen["args"][-1] is (floor if llm_check.CASES[name].quantized else None)


def _eager(tmp_path, name: str, dim: int, layers: int):
    """The eager module export_llm exports for ``name``'s case at ``dim`` and ``layers``, with its case."""
    from edgefuse.llm.eager import config_from_overrides, eager_model, write_small_model

    case = llm_check.sized(llm_check.CASES[name], dim=dim, layers=layers)
    files = write_small_model(str(tmp_path), case.params)
    return case, eager_model(config_from_overrides(llm_check.case_arguments(case, *files)))


def _floor(case, model):
    from edgefuse.llm.eager import eager_step, logits_sequence, prompt_and_steps
    from edgefuse.quant.rounding import rounding_floor

    prompt, steps = prompt_and_steps(case.params["vocab_size"], 8, 4)
    expected = logits_sequence(eager_step(model), prompt, steps)
    floor = rounding_floor(model, lambda: logits_sequence(eager_step(model), prompt, steps), expected)
    again = logits_sequence(eager_step(model), prompt, steps)
    assert all(torch.equal(a, e) for a, e in zip(again, expected))  # eager is as it was after the floor
    bound = [finite_tolerance(torch.float32, e, TOLERANCES["model logits"].ulps) for e in expected]
    return floor, bound


def test_the_rounding_floor_of_a_float_model_is_within_the_float_bound(tmp_path):
    """In float32 the floor is the norms' means rounded another way: the logits move within the dtype's
    bound (a floor that computed another norm would move them further)."""
    floor, bound = _floor(*_eager(tmp_path, "qwen3-fp32", 1024, 4))
    assert all(f <= b for f, b in zip(floor, bound)), floor


def test_the_rounding_floor_of_an_8da4w_model_is_what_its_quantized_activations_make_of_it(tmp_path):
    """With activations quantized at each linear, the same roundings move some activation to another int8
    level, and the logits by far more than the float32 bound: at Qwen3's width and 4 layers, at every step
    (a mean summed in float64 alone moves none there: the floor takes the most of three)."""
    floor, bound = _floor(*_eager(tmp_path, "qwen3-8da4w", 1024, 4))
    assert all(b < f < float("inf") for f, b in zip(floor, bound)), floor


def test_check_programs_holds_one_program_at_a_time(tmp_path, monkeypatch):
    """Each program is released before the next one loads: two real-size programs at once do not fit the
    machine's memory (nothing runs: the module and the programs are stand-ins that count who is alive)."""
    import weakref
    from types import SimpleNamespace

    from edgefuse import runtime
    from edgefuse.compare import llm_programs
    from edgefuse.llm import eager

    alive_at_load, loaded = [], []

    class Program:  # no reference cycle: only a reference kept elsewhere holds one alive
        def __init__(self, data):
            alive_at_load.append(sum(ref() is not None for ref in loaded))
            loaded.append(weakref.ref(self))
            self.method = SimpleNamespace(execute=lambda inputs: [torch.zeros(4)])

    monkeypatch.setattr(llm_programs, "load_llm_kernels", lambda: None)
    monkeypatch.setattr(runtime, "LoadedProgram", Program)
    monkeypatch.setattr(eager, "eager_model", lambda config: object())
    monkeypatch.setattr(eager, "eager_step", lambda model: lambda tokens, position: torch.zeros(4))
    monkeypatch.setattr(llm_check, "checked_logits", lambda *args: args)
    paths = {}
    for how in ("stock", "edgefuse"):
        paths[how] = str(tmp_path / f"{how}.pte")
        open(paths[how], "wb").close()
    llm_check.check_programs(llm_check.CASES["qwen3-fp32"], paths, config=None, prefill=2, decode=1)
    assert alive_at_load == [0, 0]
