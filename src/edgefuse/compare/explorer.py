"""A Model Explorer node-data overlay for a ``.pte``: per instruction, delegated or left outside, and where
the model's norms went.

Model Explorer opens a ``.pte`` with ExecuTorch's PTE adapter (``pip install 'edgefuse[explorer]'``): one
graph per method, one node per instruction with the id ``"{method}_{chain}_{instruction}"``, and each
XNNPACK delegate as a subgraph. A node-data file is JSON that gives nodes a value and a colour, keyed by
graph id and node id. :func:`node_data` makes one with the ids computed from the ``.pte`` as the adapter
computes them (:func:`edgefuse.llm.pte.instruction_labels` walks the same chains and instructions):

- a delegate call: ``delegated``; when it holds ops of norms, which norms (:data:`HOLDS_NORMS`);
- a kernel call that computes part of a norm: ``norm op outside``, the op, the norm and the reason it
  was left outside (:data:`NORM_OUTSIDE`);
- any other kernel call: ``outside`` and the op (:data:`OUTSIDE`).

Which norm an instruction's ops belong to is not in the file: :func:`instruction_modules` reads it from
the program as ExecuTorch emitted it (the emitter maps each instruction to the debug handles of the edge
program's nodes, and those nodes carry the module they came from). A norm is marked on the delegate call
that holds its ops, not on a node inside the delegate's subgraph: the adapter numbers those nodes by their
place in the XNNPACK payload, which the emitter's map does not reach.
"""

from __future__ import annotations

import json
import operator
import os
import shlex
from dataclasses import dataclass
from typing import Mapping

from edgefuse.llm.pte import instruction_labels, method_names
from edgefuse.runtime.files import write_new

#: The node-data set's name, shown in Model Explorer's side panel.
NAME = "edgefuse"

#: Colours of the three kinds of claim, and of a delegate that holds no norm.
DELEGATED = "#b7e1a1"
HOLDS_NORMS = "#8ecae6"
NORM_OUTSIDE = "#f4a3a3"
OUTSIDE = "#dddddd"


@dataclass(frozen=True)
class Claim:
    """What the overlay says of one node: its value (shown beside the node) and its colour."""

    value: str
    color: str

    def to_json(self) -> dict:
        return {"value": self.value, "bgColor": self.color}


def overlay_path(pte_path: str | os.PathLike) -> str:
    """Where the overlay of ``pte_path`` goes: ``model.nodedata.json`` beside ``model.pte``."""
    root, _ = os.path.splitext(os.fspath(pte_path))
    return f"{root}.nodedata.json"


def open_command(pte_path: str | os.PathLike) -> str:
    """The command that opens ``pte_path`` in Model Explorer with its overlay, each path quoted for a shell."""
    return (f"model-explorer {shlex.quote(os.fspath(pte_path))} --extensions executorch_extension_model_explorer "
            f"--node_data_paths {shlex.quote(overlay_path(pte_path))}")


def handle_modules(edge_manager) -> dict[str, dict[int, frozenset[str]]]:
    """For each method of a lowered ``EdgeProgramManager``, each node's debug handle to the module paths of
    the node. Read before ``to_executorch``: its emitter writes each node's instruction index over the
    handle, in the nodes the two programs share."""
    from edgefuse.core._fx import module_paths, top_graph

    return {
        method: {
            n.meta["debug_handle"]: frozenset(module_paths(n))
            for n in top_graph(edge_manager.exported_program(method)).graph.nodes
            if n.op == "call_function" and isinstance(n.meta.get("debug_handle"), int)
        }
        for method in edge_manager.methods
    }


def instruction_modules(executorch_manager, handles: Mapping[str, Mapping[int, frozenset[str]]]):
    """For each method of an ``ExecutorchProgramManager`` whose ``buffer`` was read (the emitter fills its
    debug handle map as it writes the program) and each instruction index of its first chain, the
    module paths of the edge program's nodes the instruction runs (``handles``: :func:`handle_modules` of
    the edge program it was made from).

    A delegate call runs the nodes its lowered module took in; a kernel call runs the edge node whose debug
    handle the emitter recorded for it, and the emitter leaves the instruction's index as the debug handle
    of the node it emitted. A getitem emits no instruction: its handle is the one it had, which may be
    another instruction's index.
    """
    from edgefuse.core._fx import module_paths

    found: dict[str, dict[int, frozenset[str]]] = {}
    for method, by_instruction in executorch_manager.debug_handle_map.items():
        graph = executorch_manager.exported_program(method).graph_module
        modules: dict[int, frozenset[str]] = {}
        for node in graph.graph.nodes:
            index = node.meta.get("debug_handle")
            if node.op != "call_function" or node.target is operator.getitem or not isinstance(index, int):
                continue
            if "executorch_call_delegate" in str(node.target):
                lowered = getattr(graph, node.args[0].target)
                modules[index] = frozenset().union(*(module_paths(n) for n in lowered.original_module.graph.nodes))
            else:
                sources = by_instruction.get(index)
                sources = sources if isinstance(sources, list) else [sources]
                known = handles.get(method, {})
                modules[index] = frozenset().union(*(known[h] for h in sources if h in known))
        found[method] = modules
    return found


def claim(kind: str, name: str, modules: frozenset[str], norms: Mapping[str, str]) -> Claim | None:
    """What the overlay says of one instruction (None: an instruction that computes nothing, a move or a
    free). ``norms`` maps each norm's module path to why the program leaves an op of it outside."""
    held = sorted(path for path in norms if path in modules)
    if kind == "delegate":
        if held:
            return Claim(f"delegated ({name}): holds ops of {', '.join(held)}", HOLDS_NORMS)
        return Claim(f"delegated ({name})", DELEGATED)
    if kind != "kernel":
        return None
    if held:
        norm = held[-1]  # the innermost: a norm module inside another norm's module is the one it computes
        return Claim(f"norm op outside: {name} of {norm}: {norms[norm]}", NORM_OUTSIDE)
    return Claim(f"outside: {name}", OUTSIDE)


def node_data(
    labels: Mapping[str, list[list[tuple[str, str]]]],
    modules: Mapping[str, Mapping[int, frozenset[str]]],
    norms: Mapping[str, str],
) -> dict:
    """The node-data JSON of a program whose methods have the instruction ``labels`` (per method, each
    chain's ``(kind, name)``, :func:`edgefuse.llm.pte.instruction_labels`) and run ``modules`` (per method,
    instruction index of the first chain to module paths, :func:`instruction_modules`)."""
    data = {}
    for method, chains in labels.items():
        results = {}
        for chain_index, chain in enumerate(chains):
            for index, (kind, name) in enumerate(chain):
                ran = modules.get(method, {}).get(index, frozenset()) if chain_index == 0 else frozenset()
                said = claim(kind, name, ran, norms)
                if said is not None:
                    results[f"{method}_{chain_index}_{index}"] = said.to_json()
        data[method] = {"name": NAME, "results": results}
    return data


def left_by(how: str, norms: Mapping[str, str]) -> dict[str, str]:
    """Why the program lowered ``how`` (``"stock"`` or ``"edgefuse"``) leaves an op of a norm outside, for
    each of ``norms`` (module path to what edgefuse decided for that norm)."""
    from edgefuse.compare.stock_and_edgefuse import STOCK

    who = "ExecuTorch's XnnpackPartitioner" if how == STOCK else "edgefuse's XNNPACK lowering"
    return {path: f"{who} left it outside (edgefuse: {decided})" for path, decided in norms.items()}


def placement_norms(program, manager) -> dict[str, str]:
    """Each module of ``program`` that computes a mean, to where edgefuse's XNNPACK lowering (``manager``)
    put that mean: kept in a delegate, or the reason it was left (:func:`edgefuse.xnnpack.quantizer.
    mean_placements`)."""
    from edgefuse.xnnpack.quantizer import mean_placements

    return {
        p.module_path: "its mean kept in a delegate" if p.delegated else f"its mean left: {p.reason}"
        for p in mean_placements(program, manager) if p.module_path
    }


def report_norms(rows, backend: str) -> dict[str, str]:
    """Each norm of a report's ``rows`` (:class:`edgefuse.compare.report.NormRow`) to what edgefuse decided
    for ``backend``: rebuilt, or left and why."""
    return {
        row.decision.module_path: f"rebuilt for {backend}" if row.decision.rebuilt
        else f"left for {backend}: {row.decision.reason}"
        for row in rows if row.decision.module_path
    }


def write_overlay(
    pte_path: str | os.PathLike, pte: bytes, modules: Mapping[str, Mapping[int, frozenset[str]]],
    norms: Mapping[str, str],
) -> str:
    """Write the overlay of the program ``pte`` (its bytes), written at ``pte_path``, beside it
    (:func:`overlay_path`) as a new file (:func:`edgefuse.runtime.files.write_new`); returns its path."""
    labels = {method: instruction_labels(pte, method) for method in method_names(pte)}
    path = overlay_path(pte_path)
    write_new(path, json.dumps(node_data(labels, modules, norms), indent=1) + "\n")
    return path
