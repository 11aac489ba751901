"""Read back what a lowered program holds, and run it in the released ExecuTorch runtime.

Used by the tests, the benchmark and the acceptance check: how many delegates (which edge ops run
outside them is :func:`edgefuse.core._fx.ops_outside`, shared with the other backends), which XNNPACK node types each delegate serialized (decoded from the delegate's own
flatbuffer with the installed schema, so a claim about a node type is checked on the bytes the runtime
loads), and the outputs of the ``.pte`` in ``executorch.runtime.Runtime``.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import tempfile
from collections import Counter
from typing import Sequence

import torch
from torch.fx import Node

from executorch.backends.xnnpack import serialization as _xnn_serialization
from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader
from executorch.exir import EdgeProgramManager
from executorch.exir._serialize._flatbuffer import _flatc_decompile
from executorch.exir.lowered_backend_module import LoweredBackendModule

from edgefuse.core._fx import top_graph


def lowered_modules(program) -> list[LoweredBackendModule]:
    """The delegates of a lowered program, in graph order."""
    gm = top_graph(program)
    return [m for _, m in gm.named_children() if isinstance(m, LoweredBackendModule)]


def xnn_graph(blob: bytes) -> dict:
    """The XNNGraph of one XNNPACK delegate blob, as the JSON ``flatc`` decodes with the installed schema."""
    header = XNNHeader.from_bytes(blob[: XNNHeader.EXPECTED_LENGTH])
    if not header.is_valid():
        raise ValueError("not an XNNPACK delegate blob: invalid header")
    payload = blob[header.flatbuffer_offset : header.flatbuffer_offset + header.flatbuffer_size]
    schema = importlib.resources.files(_xnn_serialization).joinpath("schema.fbs").read_bytes()
    with tempfile.TemporaryDirectory() as directory:
        schema_path = os.path.join(directory, "schema.fbs")
        bin_path = os.path.join(directory, "graph.bin")
        with open(schema_path, "wb") as f:
            f.write(schema)
        with open(bin_path, "wb") as f:
            f.write(payload)
        _flatc_decompile(directory, schema_path, bin_path)
        with open(os.path.join(directory, "graph.json"), "rb") as f:
            return json.loads(f.read())


def node_types(program) -> list[list[str]]:
    """For each delegate, the XNNPACK node types it serialized, in order (``XNNFullyConnected``, ...)."""
    result = []
    for module in lowered_modules(program):
        graph = xnn_graph(module.processed_bytes)
        result.append([node["xnode_union_type"] for node in graph.get("xnodes", [])])
    return result


def node_type_counts(program) -> Counter:
    """How many nodes of each XNNPACK type all delegates of the program hold together."""
    return Counter(t for types in node_types(program) for t in types)


def to_pte(program: EdgeProgramManager) -> bytes:
    """The ``.pte`` bytes of a lowered program."""
    return program.to_executorch().buffer


def run_pte(pte: bytes, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run a ``.pte`` once in the released runtime and return its tensor outputs (a failure says why)."""
    from edgefuse.runtime import LoadedProgram

    return LoadedProgram(pte).run(list(inputs))
