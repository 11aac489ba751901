"""GELU: the delegate computes only the erf form, so the tanh form stays on the portable kernel.

The released XNNPACK visitor serializes every ``gelu`` as ``XNNGelu`` and drops ``approximate``; a model
using ``gelu_pytorch_tanh`` (Gemma) lowered stock computes a different function. The inputs here sit
where the two forms differ most (around ``x = -2.7``, 4.7e-4 apart), so stock's error is far above the
float32 tolerance the edgefuse program is held to.
"""

from __future__ import annotations

import pytest
import torch

from tests.xnnpack.xnn_helpers import assert_matches, lower_and_run

pytestmark = pytest.mark.slow


class Gelu(torch.nn.Module):
    def __init__(self, approximate: str):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return torch.nn.functional.gelu(x * 2.0, approximate=self.approximate) + 1.0


def inputs() -> tuple[torch.Tensor]:
    return (torch.linspace(-1.6, -1.1, 64).reshape(4, 16),)


def test_a_tanh_gelu_stays_on_the_portable_kernel_where_it_is_computed_right():
    ours = lower_and_run(Gelu("tanh"), inputs())
    assert_matches(ours)
    assert ours.outside == ["aten.gelu.default"], ours.outside
    assert all("XNNGelu" not in types for types in ours.types)

    stock = lower_and_run(Gelu("tanh"), inputs(), stock=True)
    assert any("XNNGelu" in types for types in stock.types)
    stock_error = float((stock.outputs[0][0] - stock.expected[0][0]).abs().max())
    assert stock_error > 1e-4, f"stock's erf GELU should differ from the tanh form here, by {stock_error:.3g}"


def test_an_erf_gelu_is_still_delegated():
    ours = lower_and_run(Gelu("none"), inputs())
    assert_matches(ours)
    assert not ours.outside, ours.outside
    assert sum(types.count("XNNGelu") for types in ours.types) == 1


def test_a_config_list_without_gelu_keeps_gelu_out_as_stock_does():
    """edgefuse's GELU config amends the stock one: given configs without it, GELU is not delegated."""
    from executorch.backends.xnnpack.partition.config.generic_node_configs import AddConfig, MulConfig

    ours = lower_and_run(Gelu("none"), inputs(), configs=[AddConfig, MulConfig])
    assert ours.outside == ["aten.gelu.default"], ours.outside
    assert_matches(ours)
