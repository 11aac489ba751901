"""Each norm's mean rounded another way, and the rounding floor that measures what it does to a model's outputs
(edgefuse.quant.rounding): ExecuTorch's norms and transformers'."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode

from edgefuse.llm.small import SMALL_QWEN3
from edgefuse.quant import rounding
from edgefuse.quant.rounding import MEAN_ROUNDINGS, means_rounded


def _small_qwen3(layers: int = 1):
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    from edgefuse.llm.eager import random_state

    params = dict(SMALL_QWEN3, n_layers=layers, dim=1024, hidden_dim=64, n_heads=8, n_kv_heads=4, head_dim=128)
    model = construct_transformer(ModelArgs(**params))
    model.load_state_dict(random_state(model))
    return model.eval()


def _norm(kind: str, dim: int = 64) -> torch.nn.Module:
    """One norm of each class :data:`rounding.NORMS` knows, with random weights (Gemma's about 0: it scales by
    ``1 + w``)."""
    from executorch.examples.models.llama.norm import RMSNorm
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3RMSNorm

    norm = {"executorch": lambda: RMSNorm(dim, eps=1e-6), "executorch-offset": lambda: RMSNorm(dim, 1e-6, True),
            "gemma3": lambda: Gemma3RMSNorm(dim), "qwen3": lambda: Qwen3RMSNorm(dim), "llama": lambda: LlamaRMSNorm(dim),
            "smollm3": lambda: SmolLM3RMSNorm(dim)}[kind]()
    with torch.no_grad():
        norm.weight.normal_(0.0 if kind in ("gemma3", "executorch-offset") else 1.0, 0.1,
                            generator=torch.Generator().manual_seed(1))
    return norm.eval()


NORM_KINDS = ("executorch", "executorch-offset", "gemma3", "qwen3", "llama", "smollm3")


class _Recorded(TorchFunctionMode):
    """Records what each ``Tensor.mean`` returns and what each ``torch.rsqrt`` is given."""

    def __init__(self):
        super().__init__()
        self.means, self.rsqrt = [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.mean:
            self.means.append(out)
        elif func is torch.rsqrt:
            self.rsqrt.append(args[0])
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", NORM_KINDS)
def test_with_a_mean_that_rounds_as_the_norms_own_the_norm_is_the_same_bit_for_bit(kind, dtype):
    """On inputs whose mean of squares is exact (halves up to 2, rows scaled by powers of two: every sum is
    exact in float32), the float64 rounding gives the norm's own mean, and the norm's output is its own bit for
    bit: the casts, the eps, the weight's multiply (``1 + w`` for Gemma and an offset ExecuTorch norm) and their
    order are the class's own."""
    norm = _norm(kind).to(dtype)
    generator = torch.Generator().manual_seed(0)
    halves = torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0])
    x = halves[torch.randint(0, 8, (3, 16, 64), generator=generator)] * 2.0 ** torch.arange(-8, 8).reshape(1, 16, 1)
    x = x.to(dtype)
    with torch.no_grad():
        own = norm(x)
        with means_rounded(norm, "float64") as count:
            assert count == 1
            assert torch.equal(norm(x), own)


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("kind", NORM_KINDS)
def test_one_unit_up_or_down_gives_rsqrt_the_norms_own_mean_moved_one_unit(kind, direction):
    """What the norm hands ``rsqrt`` is its own mean moved one float32 unit in the last place, plus its eps: the
    mean is the class's own (same squares, same dim), moved by the rounding alone, and the output moves."""
    norm = _norm(kind)
    x = torch.randn(4, 7, 64, generator=torch.Generator().manual_seed(0))
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    with torch.no_grad():
        own, moved = _Recorded(), _Recorded()
        with own:
            before = norm(x)
        with means_rounded(norm, direction), moved:
            after = norm(x)
    (mean,), (given,) = own.means, moved.rsqrt
    assert mean.dtype == torch.float32 and mean.shape == (4, 7, 1)
    assert torch.equal(own.rsqrt[0], mean + eps)
    towards = torch.full_like(mean, float("inf") if direction == "up" else float("-inf"))
    assert torch.equal(given, torch.nextafter(mean, towards) + eps)
    assert not torch.equal(after, before)


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "llama", "smollm3"])
def test_every_norm_of_the_hugging_face_routes_models_is_one_means_rounded_changes(name):
    """The models Hugging Face's exporter takes (tests/hf's four, built from their configs): every module of
    theirs whose class is an RMSNorm is one ``means_rounded`` reaches (Gemma 3's four a layer and QK norms,
    Qwen3's QK norms), and each is the model's own again on leaving."""
    from transformers import AutoModelForCausalLM

    from tests.hf.hf_models import config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(name)).eval()
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert {"gemma3": 13, "qwen3": 5, "llama": 3, "smollm3": 3}[name] == len(norms)
    with means_rounded(model, "up") as count:
        assert count == len(norms)
        assert all(vars(m).keys() & {"_norm", "forward"} for m in norms)
    assert not any(vars(m).keys() & {"_norm", "forward"} for m in norms)


@pytest.mark.parametrize("rounding", MEAN_ROUNDINGS)
def test_means_rounded_changes_each_norms_mean_by_a_rounding_alone_and_puts_it_back(rounding):
    """Every RMSNorm of ExecuTorch's Qwen3 (its QK norms too) takes its mean of squares rounded another way: its
    output moves by the mean's rounding alone (at most 4 float32 units of each value, the weight's
    multiply rounding too; an eps left out or a mean over another dim moves it by far more), it does move
    (another rounding, not the same one), and on leaving the block the norm is eager's again, bit for bit."""
    from executorch.examples.models.llama.norm import RMSNorm

    model = _small_qwen3()
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) == 5  # two a layer, two QK norms, the final one
    generator = torch.Generator().manual_seed(0)
    # small values, where the norm's eps is a large part of the mean: an eps left out moves them far
    inputs = {1024: torch.randn(64, 1024, generator=generator) * 1e-3, 128: torch.randn(64, 4, 128, generator=generator)}
    with torch.no_grad():
        before = {id(m): m(inputs[m.dim]) for m in norms}
        moved = 0
        with means_rounded(model, rounding) as count:
            assert count == 5
            for m in norms:
                out, eager = m(inputs[m.dim]), before[id(m)]
                assert torch.all((out - eager).abs() <= 4 * torch.finfo(torch.float32).eps * eager.abs()), m
                moved += int((out != eager).any(-1).sum())
        assert moved > 0
        assert all(torch.equal(m(inputs[m.dim]), before[id(m)]) for m in norms)


def test_means_rounded_refuses_a_rounding_it_does_not_know():
    with pytest.raises(ValueError, match="rounding 'nearest': one of float64, up, down"):
        with means_rounded(_small_qwen3(), "nearest"):
            pass


def test_a_model_without_a_norm_it_knows_is_refused():
    """A module whose norms ``means_rounded`` cannot reach (``torch.nn.RMSNorm``) would get a floor of 0 at
    every step: refused, naming the norms it knows."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.RMSNorm(8))
    with pytest.raises(ValueError, match=r"holds no norm means_rounded knows \(RMSNorm, Gemma3RMSNorm, .*SmolLM3RMSNorm\)"):
        with means_rounded(model, "up"):
            pass
    assert "forward" not in vars(model[1]) and "_norm" not in vars(model[1])


def test_means_rounded_puts_the_norms_back_when_the_block_raises():
    model = _small_qwen3()
    with pytest.raises(RuntimeError, match="inside"):
        with means_rounded(model, "up"):
            raise RuntimeError("inside")
    assert not any("_norm" in vars(m) for m in model.modules())


def test_means_rounded_within_another_block_puts_the_outer_rounding_back():
    model = _small_qwen3()
    x = torch.randn(3, 1024) * 1e-3
    norm = model.norm
    with torch.no_grad():
        eager = norm(x)
        with means_rounded(model, "up"):
            up = norm(x)
            with means_rounded(model, "down"):
                assert not torch.equal(norm(x), up)
            assert torch.equal(norm(x), up)
        assert torch.equal(norm(x), eager)


def test_the_rounding_floor_is_at_each_step_the_most_of_every_rounding_and_0_where_none_moves(monkeypatch):
    """Each way of rounding the means is run once, and the floor at a step is the largest move of any (here
    each rounding moves one step the most); a step no rounding moves has a floor of 0."""
    expected = [torch.zeros(4) for _ in range(4)]
    moves = {"float64": [0.3, 0.0, 0.1, 0.0], "up": [0.1, 0.2, 0.0, 0.0], "down": [0.0, 0.1, 0.4, 0.0]}
    assert set(moves) == set(MEAN_ROUNDINGS)
    ran = []

    @contextlib.contextmanager
    def means_rounded(model, way):
        ran.append(way)
        yield 1

    monkeypatch.setattr(rounding, "means_rounded", means_rounded)
    floor = rounding.rounding_floor(object(), lambda: [torch.full((4,), m) for m in moves[ran[-1]]], expected)
    assert sorted(ran) == sorted(MEAN_ROUNDINGS)
    assert floor == pytest.approx([0.3, 0.2, 0.4, 0.0])
