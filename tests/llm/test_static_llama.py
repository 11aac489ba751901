"""Why a method of the static-Llama script's program is not run: a declaration other than its module's
levels, and a buffer overrun only where a declaration is the smaller."""

from __future__ import annotations

import torch

from edgefuse.llm.static_llama import not_run
from edgefuse.runtime import TensorMeta
from tests.qnn.test_quantized_io import _io


def test_a_method_declaring_its_levels_types_is_run():
    uint16 = TensorMeta((1, 16, 64), torch.uint16, 2048)
    assert not_run(_io(), (uint16,), (uint16,)) is None


def test_a_narrower_declaration_is_written_past_its_buffer():
    uint16, uint8 = TensorMeta((1, 16, 64), torch.uint16, 2048), TensorMeta((1, 16, 64), torch.uint8, 1024)
    assert not_run(_io(), (uint16,), (uint8,)) == (
        "not run: the program's output 0 is declared uint8 [1, 16, 64] (1024 bytes) where its module's levels "
        "are uint16 (2048 bytes); QNN reads and writes the levels it was compiled with, past the buffers the "
        "runtime sizes by the declared types"
    )


def test_a_wider_declaration_is_not_run_but_stays_inside_its_buffer():
    uint16, int32 = TensorMeta((1, 16, 64), torch.uint16, 2048), TensorMeta((1, 16, 64), torch.int32, 4096)
    assert not_run(_io(), (uint16,), (int32,)) == (
        "not run: the program's output 0 is declared int32 [1, 16, 64] (4096 bytes) where its module's levels "
        "are uint16 (2048 bytes); QNN reads and writes the levels it was compiled with"
    )
