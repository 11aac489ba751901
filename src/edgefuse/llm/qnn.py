"""ExecuTorch's ``export_llm`` lowering for QNN, with edgefuse's QNN passes in place of the stock ones.

For a config with ``backend.qnn.enabled=True``, ExecuTorch 1.5.1's ``export_llama`` runs its QNN path in
``export_llama_lib._to_edge_and_lower_llama``: ``QnnQuantizer`` (``quantization.pt2e_quantize=qnn_8a8w``,
``qnn_16a16w`` or ``qnn_16a4w``; its annotation pipeline runs ``RecomposeRmsNorm`` and
``RemoveRedundancy``), the export to edge, the HTP pass manager's ``transform_for_to_edge_pipeline`` with a
``passes_job`` it builds from ``get_capture_program_passes()`` (the same two passes, handed the edge
program), and ``to_backend`` with the ``QnnPartitioner`` of ``get_qnn_partitioner``. Every pass list is
built inside that call, so :func:`edgefuse.qnn.patched` around it puts edgefuse's passes in all of them;
export_llm's export to edge keeps the norms they rebuild whole (:func:`rms_norm_kept_at_edge`).

:func:`qnn_lowering` does that for the length of a ``with`` block (or, with ``recompose="stock"``, leaves
the released passes), loads the QNN libraries first, records every graph QNN compiles, keeps the lowered
builder, and writes the ``.pte`` atomically as the XNNPACK swap does.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from edgefuse.llm.lowering import WRITERS, Swap, _swapped, write_atomically

#: The function of ``export_llama_lib`` whose call holds the whole QNN lowering (quantization included).
QNN_LOWERING = ("executorch.examples.models.llama.export_llama_lib", "_to_edge_and_lower_llama")
#: Whose passes run in QNN's pipelines: edgefuse's, or the released ones.
RECOMPOSE = ("edgefuse", "stock")


@dataclass
class QnnRecord:
    """What a :func:`qnn_lowering` block saw: the passes' runs (None for stock), the graphs QNN compiled,
    and the lowered ``LLMEdgeManager`` (None until the QNN lowering returned)."""

    recompose: str
    patch: Any = None  # edgefuse.qnn.QnnPatch
    compiled: Any = None  # the recording of edgefuse.qnn.graphs
    builder: Any = None
    graphs: Any = None  # edgefuse.qnn.graphs.QnnGraphs of the lowered program
    quantized: bool = False

    @property
    def decisions(self) -> list:
        """The norm decisions of every run of edgefuse's recomposition (empty for stock)."""
        return list(self.patch.decisions) if self.patch is not None else []

    @property
    def rms_norms(self) -> int:
        """How many QNN ``RmsNorm`` ops the compiled graphs of the program hold."""
        return self.graphs.rms_norms if self.graphs is not None else 0

    @property
    def reference(self):
        """What the program computes in eager: the converted (fake-quantized) module for a quantized
        config, None for a float one (its reference is the eager model of the config)."""
        return self.builder.pre_autograd_graph_module if self.quantized and self.builder is not None else None


def _capture(original: Callable, swap: Swap) -> Callable:
    """``_to_edge_and_lower_llama`` that loads the QNN libraries, marks the lowering started, keeps the
    lowered builder and reads what QNN built for it."""
    from edgefuse.qnn.graphs import qnn_graphs
    from edgefuse.qnn.sdk import ensure_in_process

    signature = inspect.signature(original)

    def to_edge_and_lower_llama(*args, **kwargs):
        ensure_in_process()  # here, after export_llm has checked the config and exported the model
        swap.lowering_started = True
        record: QnnRecord = swap.qnn
        record.quantized = bool(signature.bind(*args, **kwargs).arguments.get("pt2e_quantize"))
        builder = original(*args, **kwargs)
        record.builder = builder
        nearest = record.patch.nearest if record.patch is not None else ()
        record.graphs = qnn_graphs(builder.edge_manager, record.compiled, record.decisions, nearest)
        return builder

    to_edge_and_lower_llama.__doc__ = original.__doc__
    to_edge_and_lower_llama.__wrapped__ = original
    return to_edge_and_lower_llama


#: Where export_llm builds the ``EdgeCompileConfig`` of its export to edge.
EDGE_CONFIG = ("executorch.extension.llm.export.builder", "LLMEdgeManager", "_get_edge_config")


@contextlib.contextmanager
def rms_norm_kept_at_edge(when: Callable[[], bool]) -> Iterator[None]:
    """Within the block, export_llm's export to edge keeps ``aten.rms_norm`` whole (``preserve_ops``)
    whenever ``when()`` says so at the time (for a quantized config).

    A quantized config's norms are rebuilt in the annotation pipeline and quantized as one op; export_llm's
    ``to_edge`` (unlike ``to_edge_transform_and_lower_to_qnn``, whose partitioner names ``rms_norm`` among
    the ops not to decompose) would decompose each into float ops between the norm's quantize and
    dequantize, which QNN then fails to compile ("Could not prepare op"). A float config rebuilds its
    norms after ``to_edge``, where a norm the model wrote as ``F.rms_norm`` must still be decomposed as
    the released flow does (QNN's limits are checked on norms edgefuse rebuilds, and a norm QNN does not
    take has no portable kernel), so it is left alone. Put back on exit."""
    import importlib

    module, owner_name, name = EDGE_CONFIG
    owner = getattr(importlib.import_module(module), owner_name)
    released = owner.__dict__[name]

    def _get_edge_config(self):
        import torch

        config = released(self)
        if when():
            config.preserve_ops = [*config.preserve_ops, torch.ops.aten.rms_norm.default]
        return config

    with _replaced(owner, name, _get_edge_config):
        yield


@contextlib.contextmanager
def _replaced(owner: Any, name: str, replacement: Callable) -> Iterator[None]:
    """``owner.name`` is ``replacement`` (its ``__wrapped__`` the released one) within the block, put back
    on exit."""
    released = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    replacement.__wrapped__ = released
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, released)


#: Where export_llm's QNN path puts its causal mask in place of the model's boolean one.
CAUSAL_MASK = ("executorch.examples.models.llama.export_llama_lib", "replace_causal_mask")


@contextlib.contextmanager
def qnn_causal_mask(masked: float) -> Iterator[None]:
    """Within the block, export_llm's QNN path adds ``masked`` where a token may not look, in place of the
    -inf of its ``replace_causal_mask`` (0 where it may look, as there); put back on exit.

    Quantized at 16 bits, a -inf mask (which QNN clips to -65535) sets the attention scores' step at
    1.0; ExecuTorch's own QNN Llama example masks with -255
    (:data:`edgefuse.inputs.qnn_models.QNN_LLAMA_MASKED`), which softmax gives nothing too. The eager model
    of the config, built inside the block, gets the same mask."""
    import importlib

    import torch

    module_name, name = CAUSAL_MASK
    module = importlib.import_module(module_name)

    def replace_causal_mask(model: torch.nn.Module) -> torch.nn.Module:
        for owner in model.modules():
            mask = owner._buffers.get("mask")
            if mask is not None:
                size = mask.shape[-1]
                owner.register_buffer("mask", torch.triu(torch.full((size, size), float(masked)), diagonal=1))
        return model

    with _replaced(module, name, replace_causal_mask):
        yield


@contextlib.contextmanager
def qnn_lowering(recompose: str = "edgefuse") -> Iterator[Swap]:
    """Within the block, ``export_llama`` lowers a QNN config with edgefuse's QNN passes (``"edgefuse"``)
    or the released ones (``"stock"``), records what QNN compiled (``swap.qnn``) and writes its ``.pte``
    atomically; everything swapped is back when the block exits, also when it raises.

    The QNN libraries are loaded when the QNN lowering starts, after export_llm has checked the config
    and exported the model (a config it rejects is rejected with or without them); where they are not
    set up, the export raises :class:`edgefuse.qnn.QnnSdkUnavailable`, whose message names
    ``edgefuse qnn setup``.
    """
    from edgefuse.qnn.graphs import recording_compiled_graphs
    from edgefuse.qnn.passes import patched

    if recompose not in RECOMPOSE:
        raise ValueError(f"recompose is one of {', '.join(RECOMPOSE)}, got {recompose!r}")
    swap = Swap()
    swap.qnn = QnnRecord(recompose)
    targets = [(m, n, write_atomically) for m, n in WRITERS] + [(*QNN_LOWERING, _capture)]
    edgefuse = recompose == "edgefuse"
    passes = patched() if edgefuse else contextlib.nullcontext(None)
    kept = rms_norm_kept_at_edge(lambda: swap.qnn.quantized) if edgefuse else contextlib.nullcontext()
    with _swapped(swap, targets), passes as patch, kept, recording_compiled_graphs() as compiled:
        swap.qnn.patch, swap.qnn.compiled = patch, compiled
        yield swap
