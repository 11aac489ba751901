"""Real-size shapes through ExecuTorch's ``export_llm`` (or optimum-executorch where it has no such model),
stock and with edgefuse: what each program holds, its logits against eager, what each export costs, prefill
and decode latency; one decoder layer of each through QNN.

``python -m edgefuse.tools.scale [--models qwen3-0.6b,llama-3.2-1b,gemma3-1b] [--dtypes 8da4w,fp16,bf16]
[--threads 1,2] [--layers N] [--dim N] [--prefill 128] [--decode 16] [--rounds 10] [--warmup 2] [--no-latency]
[--no-qnn] [--norms-removed] [--profile-rounds 5] [--out DIR] [--max-bytes N]``

For each model (:data:`SHAPES`: the public config numbers of Qwen3-0.6B, Llama-3.2-1B and Gemma3-1B, written
here with their source; nothing is downloaded) it writes an ``export_llm`` params file and a random-weight
checkpoint (embeddings tied where the model ties them), then for each dtype exports it with ``export_llm``
stock and with edgefuse's lowering from the same overrides as ``llm_check``'s cases (KV cache, custom SDPA,
XNNPACK with extended ops; ``8da4w`` group size 32, ``fp16``, ``bf16``). Gemma3-1B, which ``export_llm``
cannot export, is a random-weight transformers model saved with ``save_pretrained`` and exported with
optimum-executorch's ``xnnpack`` recipe and edgefuse's ``edgefuse-xnnpack`` (``edgefuse export-hf``'s flow:
custom SDPA; ``--qlinear 8da4w``, ``--dtype float16``, ``--dtype bfloat16``). Each export runs alone in a
child process forked from this one, which holds torch and ExecuTorch and no model: its wall time is the
export's (the child's imports excluded; optimum's ``main_export``, which loads the model, for Gemma3-1B) and
its peak RSS is the child's own (``getrusage``, with glibc's allocator thresholds held at their start:
:mod:`edgefuse.runtime.allocator`); the order of stock and edgefuse alternates from one dtype to the next. Then,
per model and dtype, it prints:

- the norms the architecture holds, and the means and casts (float and integer) each program runs outside
  its delegates, its delegates and kernels outside (read from the ``.pte``);
- each program's logits against the eager module exported, over a prompt and decode steps, by
  ``llm_check``'s rule (``TOLERANCES["model logits"]`` units of the dtype; an 8da4w program within stock's
  error, edgefuse's plus that bound and the step's rounding floor, measured on the eager model, ExecuTorch's
  norms or transformers', with each mean rounded another way);
- export seconds and peak memory of both, and edgefuse's over stock's;
- unless ``--no-latency``, the prefill (``--prefill`` tokens; one call a token for programs that take one
  token a call, as optimum's Gemma 3) and decode medians of both at each thread count, timed as
  ``llm_latency`` times them (``edgefuse.runtime.timer``: alternating rounds, two runs with each program
  loaded first once, the ratio the geometric mean of the runs'), with the conditions line (threads, the
  CPU's float16, bfloat16 and int8 features, MKL's threads) and the machine's load average;
- with ``--norms-removed`` (``export_llm``'s models), what the norms still cost in edgefuse's program: the
  same export with every norm reduced to its weight's multiply (:func:`edgefuse.llm.eager.norms_removed`),
  timed against edgefuse's program as a pair at each thread count, and where each spends a prefill and a
  decode step (``llm_latency``'s ETDump profile, side by side);
- unless ``--no-qnn``, a QNN row per model: one decoder layer at the real widths (ExecuTorch's
  ``Transformer`` with one layer and a vocabulary of :data:`QNN_VOCAB`; for Gemma3-1B that Transformer's
  layer, not Gemma 3's) lowered by ``edgefuse.qnn.lower`` at fp16 and 16a8w and run on the x86 HTP
  emulator: norms found and rebuilt, ``RmsNorm`` ops QNN compiled, error against eager (fp16) or the
  fake-quantized module (16a8w). Without QNN's libraries the row says how to set them up.

``--layers N`` cuts the depth and ``--dim N`` makes a toy width (heads of 16, feed-forward twice the width,
vocabulary 256) for a quick run; each dtype is exported with the same overrides as at full size. A cut
Gemma3-1B keeps its attention pattern (every sixth layer global, the others sliding-window) over the layers
kept and, under six layers, makes its last layer global: ``--layers 2`` holds one layer of each kind
(``--layers 1`` a global one alone).
A measure, not a test: run it on an otherwise idle machine for the times.
Exit status: 0 every check passed, 1 a program missed its bound or edgefuse left a mean or a cast outside
(through optimum, a float cast), 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if __name__ == "__main__":
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()

from edgefuse.console.command import run_command
from edgefuse.inputs.errors import CHECK_FAILED, OK, UsageError
from edgefuse.runtime.allocator import hold_malloc_thresholds
from edgefuse.tools.llm_latency import LABELS

if TYPE_CHECKING:
    import torch

PROG = "python -m edgefuse.tools.scale"


@dataclass(frozen=True)
class Shape:
    """A real model's shape as ``export_llm`` takes it: ``base.model_class``, the params file's fields
    (ExecuTorch's ``ModelArgs``), whether the output projection is the token embedding, where the numbers
    come from. A shape ``export_llm`` cannot export (``unsupported`` says why) is exported through Hugging
    Face's exporter instead: a transformers model of ``hf_model_type`` with the params' widths and
    ``hf_fields`` besides (:func:`hf_config`)."""

    name: str
    model_class: str
    params: dict
    tied: bool
    source: str
    unsupported: str = ""
    hf_model_type: str = ""
    hf_fields: dict = field(default_factory=dict)

    @property
    def through_hf(self) -> bool:
        """Whether it is exported with optimum-executorch (``edgefuse export-hf``'s flow), not ``export_llm``."""
        return bool(self.hf_model_type)


#: transformers' model type of Gemma 3's text model: pre- and post-norms around attention and feed-forward.
GEMMA3 = "gemma3_text"
#: Gemma 3's attention pattern: every sixth layer attends globally, the others within the sliding window.
GEMMA3_GLOBAL_EVERY = 6


def gemma3_layer_types(n_layers: int) -> list[str]:
    """Gemma 3's attention kind of each of ``n_layers`` layers (transformers' ``layer_types``): its own pattern
    (:data:`GEMMA3_GLOBAL_EVERY`); under six layers the last is global, so that a cut of two or more layers
    keeps both kinds (one layer is global alone)."""
    full = {i for i in range(n_layers) if (i + 1) % GEMMA3_GLOBAL_EVERY == 0} or {n_layers - 1}
    return ["full_attention" if i in full else "sliding_attention" for i in range(n_layers)]


def norm_count(params: dict, shape: Shape | None = None) -> int:
    """The RMSNorms of ExecuTorch's Llama with ``params``: two a layer, two more with QK norms, the final one;
    of transformers' Gemma 3 (``shape``'s ``hf_model_type``) two more a layer, its post-norms."""
    post_norms = shape is not None and shape.hf_model_type == GEMMA3
    per_layer = 2 + (2 if params.get("use_qk_norm") else 0) + (2 if post_norms else 0)
    return params["n_layers"] * per_layer + 1


SHAPES = {
    shape.name: shape
    for shape in (
        Shape(
            "qwen3-0.6b", "qwen3_0_6b",
            {"dim": 1024, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8, "head_dim": 128, "hidden_dim": 3072,
             "vocab_size": 151936, "norm_eps": 1e-6, "rope_theta": 1000000.0, "use_qk_norm": True,
             "qk_norm_before_rope": True, "use_hf_rope": True},
            True,
            "huggingface.co/Qwen/Qwen3-0.6B config.json: hidden_size 1024, num_hidden_layers 28, "
            "num_attention_heads 16, num_key_value_heads 8, head_dim 128, intermediate_size 3072, vocab_size "
            "151936, rms_norm_eps 1e-6, rope_theta 1000000, tie_word_embeddings true; QK norm before RoPE and "
            "Hugging Face RoPE as ExecuTorch's examples/models/qwen3 config sets them",
        ),
        Shape(
            "llama-3.2-1b", "llama3_2",
            {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "hidden_dim": 8192, "vocab_size": 128256,
             "norm_eps": 1e-5, "rope_theta": 500000.0, "use_scaled_rope": True, "rope_scale_factor": 32},
            True,
            "huggingface.co/meta-llama/Llama-3.2-1B config.json: hidden_size 2048, num_hidden_layers 16, "
            "num_attention_heads 32, num_key_value_heads 8, intermediate_size 8192, vocab_size 128256, "
            "rms_norm_eps 1e-5, rope_theta 500000, rope_scaling llama3 factor 32, tie_word_embeddings true",
        ),
        Shape(
            "gemma3-1b", "",
            {"dim": 1152, "n_layers": 26, "n_heads": 4, "n_kv_heads": 1, "head_dim": 256, "hidden_dim": 6912,
             "vocab_size": 262144, "norm_eps": 1e-6, "rope_theta": 1000000.0, "use_qk_norm": True,
             "rms_norm_add_unit_offset": True, "act_fn": "gelu_approx"},
            True,
            "huggingface.co/google/gemma-3-1b-pt config.json: hidden_size 1152, num_hidden_layers 26, "
            "num_attention_heads 4, num_key_value_heads 1, head_dim 256, intermediate_size 6912, vocab_size "
            "262144, rms_norm_eps 1e-6, rope_theta 1000000 (local 10000), sliding_window 512, "
            "gelu_pytorch_tanh, pre- and post-norms around attention and feed-forward",
            "ExecuTorch 1.5.1's export_llm has no Gemma 3 model class (base.model_class offers none), and the "
            "Llama Transformer a params file describes ignores what makes Gemma 3: ModelArgs holds "
            "post_attention_norm, post_ffn_norm, embedding_scale_factor, act_fn and sliding_window, but "
            "llama_transformer.py builds no post-attention norm, does not scale the embedding and builds its "
            "feed-forward with SiLU, so a program it wrote would not be Gemma 3",
            GEMMA3,
            {"max_position_embeddings": 32768, "final_logit_softcapping": None, "attn_logit_softcapping": None, "sliding_window": 512, "hidden_activation": "gelu_pytorch_tanh",
             "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}},
        ),
    )
}

#: The precisions, each exported with ``llm_check``'s overrides for it (:func:`dtype_case`).
DTYPES = ("8da4w", "fp16", "bf16")
LOWERINGS = ("stock", "edgefuse")
#: The prompt and decode steps of the logits check (the latency's prompt is ``--prefill``).
CHECK_PREFILL, CHECK_DECODE = 8, 4
#: The vocabulary of the QNN row's one-layer model: the layer is the real one, the embedding and output
#: are not the point and would dominate the emulator's time.
QNN_VOCAB = 1024
QNN_PRECISIONS = ("fp16", "16a8w")
QNN_SOC = "SM8650"
QNN_TOKENS = 16
#: The bound on a ``.pte`` the timing loads (its bytes and planned memory): Llama-3.2-1B in fp16 with its
#: KV cache is about 2.5 GB.
MAX_BYTES = 8 * 1024**3


def sized_params(shape: Shape, layers: int | None, dim: int | None) -> dict:
    """``shape``'s params with ``layers`` decoder layers and, with ``dim``, a toy width: heads of 16, half as
    many KV heads, feed-forward twice the width, vocabulary 256."""
    params = dict(shape.params)
    if layers is not None:
        params["n_layers"] = layers
    if dim is not None:
        params.update(dim=dim, n_heads=dim // 16, n_kv_heads=max(1, dim // 32), head_dim=16, hidden_dim=2 * dim,
                      vocab_size=256)
    return params


def parameter_count(params: dict, tied: bool, shape: Shape | None = None) -> int:
    """The parameters of ExecuTorch's Llama ``Transformer`` with ``params`` (built on the meta device: no
    memory), the output projection counted once with ``tied``; of the transformers model of a ``shape``
    exported through Hugging Face's flow (:func:`hf_config`) for such a shape."""
    import torch

    if shape is not None and shape.through_hf:
        def step(note):  # in a child: transformers stays out of this process and the exports forked from it
            from transformers import AutoConfig, AutoModelForCausalLM

            fields = dict(hf_config(shape, params))
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
            return sum(p.numel() for p in model.parameters())  # a tied weight is one parameter

        return in_child(step)
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    with torch.device("meta"):
        model = construct_transformer(ModelArgs(**params))
    count = sum(p.numel() for p in model.parameters())
    return count - model.output.weight.numel() if tied else count


def dtype_case(shape: Shape, dtype: str, params: dict):
    """``llm_check``'s case of ``shape`` at ``dtype`` with ``params`` (its logits' dtype by name)."""
    from edgefuse.tools.llm_check import BF16, FP16, Q8DA4W, Case

    overrides, logits = {"8da4w": (Q8DA4W, "float32"), "fp16": (FP16, "float16"), "bf16": (BF16, "bfloat16")}[dtype]
    return Case(f"{shape.name}-{dtype}", params, shape.model_class, overrides, logits)


def context_overrides(prefill: int, decode: int) -> tuple[str, ...]:
    """The context every program is exported with, timed or not: ``llm_latency``'s for the prefill and decode."""
    from edgefuse.tools.llm_latency import context_for

    seq, context = context_for(prefill, decode)
    return f"export.max_seq_length={seq}", f"export.max_context_length={context}"


# -- steps, each in a child process -----------------------------------------------------------------------


def in_child(step):
    """What ``step(note)`` returns, run in a child forked from this process (:func:`edgefuse.runtime.contained`):
    what the child allocates is its own, and this process stays as small as it was for the next one (it
    holds torch and ExecuTorch, imported once, and no model: each child starts from its 0.4 GB, and pins
    torch to one thread)."""
    from edgefuse.runtime.contained import contained

    return contained(step)


def write_model(shape: Shape, params: dict, folder: str) -> list[str]:
    """Write ``params`` and a random checkpoint of ``shape`` in ``folder`` (in a child); their paths."""

    def step(note):
        from edgefuse.llm.eager import write_small_model

        return list(write_small_model(folder, params, tied=shape.tied))

    return in_child(step)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux's ``ru_maxrss`` is in KiB). An export's child holds
    glibc's allocator thresholds at their start first (:func:`edgefuse.runtime.allocator.hold_malloc_thresholds`),
    so the peak does not depend on what the forked process had freed before."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def export_one(shape: Shape, dtype: str, params: dict, how: str, model_files: list[str], folder: str,
               extra: tuple[str, ...], removed: bool = False) -> dict:
    """Export ``shape`` at ``dtype`` with ``how``'s lowering in a child: the ``.pte``, the export's seconds
    (the child's imports not counted), the child's peak RSS, what edgefuse's lowering substituted and
    restored; ``rejected`` with export_llm's message when it refused the config. With ``removed``, every
    norm of the model is reduced to its weight's multiply (:func:`edgefuse.llm.eager.norms_removed`)."""

    def step(note):
        from edgefuse.llm.eager import norms_removed
        from edgefuse.llm.export import ConfigRejected
        from edgefuse.runtime.quiet import quiet_root_logger
        from edgefuse.tools.llm_check import export_programs

        held = hold_malloc_thresholds()  # the peak is what the export holds, not what this process freed before

        case = dtype_case(shape, dtype, params)
        start = time.monotonic()
        try:
            with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr), \
                    (norms_removed() if removed else contextlib.nullcontext()):
                export = export_programs(case, tuple(model_files), folder, (how,), extra=extra)[how]
        except ConfigRejected as error:
            return {"rejected": str(error)}
        lowerings = export.swap.lowerings
        return {"path": export.path, "seconds": time.monotonic() - start, "peak_bytes": peak_rss_bytes(), "held": held,
                "substituted": sum(l.substituted for l in lowerings), "restored": sum(l.restored for l in lowerings)}

    return in_child(step)


def check_both(shape: Shape, dtype: str, params: dict, paths: dict, model_files: list[str],
               extra: tuple[str, ...]) -> dict:
    """Both programs against the eager module (``llm_check.check_programs``, in a child): by lowering, the
    delegates, kernels, means and casts outside, the worst step's error, what it allows and the rounding
    floor in that (:func:`edgefuse.quant.rounding.rounding_floor`; 0 but for edgefuse's quantized program),
    whether it passed."""

    def step(note):
        from edgefuse.llm.eager import config_from_overrides
        from edgefuse.runtime.quiet import quiet_root_logger
        from edgefuse.tools.llm_check import case_arguments, check_programs

        case = dtype_case(shape, dtype, params)
        config = config_from_overrides([*case_arguments(case, *model_files), *extra])
        with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):
            checks = check_programs(case, paths, config, CHECK_PREFILL, CHECK_DECODE)
        return {how: program_result(check) for how, check in checks.items()}

    return in_child(step)


# -- a shape export_llm cannot export: Hugging Face's exporter -------------------------------------------

#: optimum-executorch's options for each dtype (``edgefuse export-hf``'s), besides its custom SDPA and the
#: KV cache's length: 8da4w quantizes the linear layers of a float32 model, as ``export_llm``'s case does.
HF_OPTIONS = {"8da4w": {"qlinear": "8da4w"}, "fp16": {"dtype": "float16"}, "bf16": {"dtype": "bfloat16"}}
HF_DTYPES = {"8da4w": "float32", "fp16": "float16", "bf16": "bfloat16"}


def hf_config(shape: Shape, params: dict) -> dict:
    """The transformers config of ``shape`` with ``params``' widths (:func:`sized_params`), its model type and
    ``hf_fields``: Gemma 3 scales its queries by its head dim (``query_pre_attn_scalar``, 256 in Gemma3-1B), and
    its layers attend as :func:`gemma3_layer_types` says, so that a depth cut still holds a global layer."""
    head_dim = params.get("head_dim", params["dim"] // params["n_heads"])
    config = {"model_type": shape.hf_model_type, "hidden_size": params["dim"], "num_hidden_layers": params["n_layers"],
              "num_attention_heads": params["n_heads"], "num_key_value_heads": params["n_kv_heads"],
              "head_dim": head_dim, "query_pre_attn_scalar": head_dim, "intermediate_size": params["hidden_dim"],
              "vocab_size": params["vocab_size"], "rms_norm_eps": params["norm_eps"], "tie_word_embeddings": shape.tied,
              **copy.deepcopy(shape.hf_fields)}
    if shape.hf_model_type == GEMMA3:
        config["layer_types"] = gemma3_layer_types(params["n_layers"])
    return config


def write_hf_model(shape: Shape, params: dict, folder: str) -> str:
    """Save a random-weight transformers model of ``shape`` (:func:`hf_config`) with ``save_pretrained`` in
    ``folder/hf`` (in a child); the folder. Its norms scale by about ``1 + 0.1 N(0, 1)`` as the checkpoints
    ``export_llm`` is given do (``edgefuse.llm.eager``): transformers starts Gemma's norm weights at 0 (it
    scales by ``1 + w``), with which a lowering that dropped or misplaced a norm's weight would match."""
    path = os.path.join(folder, "hf")

    def step(note):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from edgefuse.runtime.quiet import quiet_root_logger

        fields = dict(hf_config(shape, params))
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        torch.manual_seed(0)
        with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):
            model = AutoModelForCausalLM.from_config(config)
            offset = params.get("rms_norm_add_unit_offset", False)
            with torch.no_grad():
                for name, weight in model.named_parameters():
                    if name.endswith("norm.weight"):
                        weight.normal_(0.0 if offset else 1.0, 0.1)
            model.save_pretrained(path)
        return path

    return in_child(step)


def export_hf_one(dtype: str, how: str, model_dir: str, folder: str, seq_len: int) -> dict:
    """Export the model saved in ``model_dir`` at ``dtype`` with ``how``'s recipe of optimum-executorch
    (``edgefuse export-hf``'s flow, :func:`edgefuse.hf.export`) to ``folder/HOW.pte`` in a child: the record
    :func:`export_one` gives (``rejected`` with the reason when optimum refused the model or the options);
    the seconds are optimum's ``main_export``'s, which loads the model and imports what it lazily needs."""
    from edgefuse.hf.options import EDGEFUSE_RECIPE, STOCK_RECIPE

    def step(note):
        from edgefuse.hf import export
        from edgefuse.runtime.quiet import quiet_root_logger

        from edgefuse.hf import HfInputError, ModelRejected, OptimumUnavailable

        held = hold_malloc_thresholds()  # as in export_one
        recipe = EDGEFUSE_RECIPE if how == "edgefuse" else STOCK_RECIPE
        try:
            with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):
                done = export(model_dir, folder, recipe, name=f"{how}.pte", use_custom_sdpa=True,
                              max_seq_len=seq_len, **HF_OPTIONS[dtype])
        except (HfInputError, ModelRejected, OptimumUnavailable) as error:
            return {"rejected": str(error)}
        record = done.record
        return {"path": done.path, "seconds": done.seconds, "peak_bytes": peak_rss_bytes(), "held": held,
                "substituted": record.substituted if record else 0, "restored": record.restored if record else 0}

    return in_child(step)


class HfReference(NamedTuple):
    """What a Hugging Face export's programs are checked against: the tokens (the prompt, then one a decode
    step), eager's logits at each step and, for 8da4w, each step's rounding floor (None in float)."""

    sequence: torch.Tensor
    expected: list
    floor: list[float] | None


def hf_reference(dtype: str, model_dir: str) -> HfReference:
    """The eager side of :func:`check_hf_both`: the model saved in ``model_dir`` at ``dtype`` (8da4w: quantized as
    optimum quantizes it), its logits over a prompt of :data:`CHECK_PREFILL` tokens and :data:`CHECK_DECODE`
    decode steps and, quantized, the rounding floor measured on it as ``llm_check`` measures export_llm's
    (:func:`edgefuse.quant.rounding.rounding_floor`). The model is released before this returns, so that the
    programs load without it."""
    import gc

    import torch

    from edgefuse.hf import logits
    from edgefuse.quant.rounding import rounding_floor

    model = logits.eager_model(model_dir, getattr(torch, HF_DTYPES[dtype]), HF_OPTIONS[dtype].get("qlinear"))
    sequence = torch.randint(0, model.config.vocab_size, (1, CHECK_PREFILL + CHECK_DECODE),
                             generator=torch.Generator().manual_seed(0))
    expected = logits.eager_logits(model, sequence, CHECK_PREFILL)
    floor = None
    if dtype == "8da4w":
        floor = rounding_floor(model, lambda: logits.eager_logits(model, sequence, CHECK_PREFILL), expected)
    del model
    gc.collect()
    return HfReference(sequence, expected, floor)


def hf_results(dtype: str, reference: HfReference, got: dict, paths: dict) -> dict:
    """:func:`check_both`'s record of the programs at ``paths`` (by lowering) from their logits ``got``, held to
    ``reference`` by ``llm_check``'s rule (:func:`edgefuse.tools.llm_check.checked_logits`, with its floor)."""
    import torch

    from edgefuse.tools.llm_check import checked_logits

    checks = checked_logits(reference.expected, got, paths, getattr(torch, HF_DTYPES[dtype]), dtype == "8da4w",
                            reference.floor)
    return {how: program_result(check) for how, check in checks.items()}


def check_hf_both(dtype: str, model_dir: str, paths: dict) -> dict:
    """Both programs of a Hugging Face export against the eager model they were exported from
    (:func:`hf_reference`), by ``llm_check``'s rule (in a child): :func:`check_both`'s record. The eager model
    is released before the programs load, and each program before the next."""

    def step(note):
        from edgefuse.compare.llm_programs import load_llm_kernels
        from edgefuse.hf import logits
        from edgefuse.runtime.quiet import quiet_root_logger

        with quiet_root_logger(), contextlib.redirect_stdout(sys.stderr):
            reference = hf_reference(dtype, model_dir)
            load_llm_kernels()
            got = {how: logits.program_logits(path, reference.sequence, CHECK_PREFILL) for how, path in paths.items()}
        return hf_results(dtype, reference, got, paths)

    return in_child(step)


def program_result(check) -> dict:
    """One program's entry of :func:`check_both` from its ``llm_check.ProgramCheck``: what it holds, and at its
    worst step the error, what that step allows and the rounding floor in that (0 when none was measured)."""
    error, allowed = check.worst
    floor = check.floor[check.worst_step] if check.floor else 0.0
    return {**counts(check.contents), "error": error, "allowed": allowed, "floor": floor, "matches": check.matches}


def counts(c) -> dict:
    """What a program runs, from its ``edgefuse.llm.pte.PteContents``: delegates, kernels outside them, and
    the means and casts among those; ``float_casts`` the casts between float dtypes (a norm's), apart from
    integer ones (optimum's programs turn position ids into floats for RoPE outside XNNPACK, which takes
    no int64)."""
    return {"delegates": c.delegate_count, "kernels": c.kernel_count, "means": c.means, "casts": c.casts,
            "float_casts": c.float_casts}


def time_both(name: str, dtype: str, folder: str, paths: dict, threads: int, args,
              labels: tuple[str, str] = LABELS) -> dict:
    """Both programs timed at ``threads`` as ``llm_latency`` times a pair (in a child): the medians over
    every round, the ratios over the runs (:func:`edgefuse.llm.latency.pooled`), the conditions line, and
    whether the programs took one token a call, as the timing read it; ``labels`` name the two in the progress."""

    def step(note):
        from edgefuse.runtime import set_threads
        from edgefuse.runtime.timer import conditions
        from edgefuse.tools.llm_latency import Pair, time_pair

        used = set_threads(threads)
        pair = Pair(name, dtype, os.path.relpath(paths["stock"], folder), os.path.relpath(paths["edgefuse"], folder))
        rows = time_pair(folder, pair, args, note, labels)
        pooled = rows[-1]
        (sp, sd), (ep, ed) = pooled.medians
        return {"threads": used, "stock": [sp, sd], "edgefuse": [ep, ed], "ratios": list(pooled.ratios),
                "runs": len(rows) - 1, "conditions": conditions(used), "one_token": pooled.inputs.one_token}

    return in_child(step)


#: What the program without norms is called in the tables.
REMOVED = "without norms"


def norm_cost(shape: Shape, dtype: str, params: dict, model_files: list[str], pair_folder: str, edgefuse: str,
              extra: tuple[str, ...], args, say) -> dict:
    """What the norms still cost in edgefuse's program ``edgefuse`` of ``shape`` at ``dtype``: the same
    export with every norm reduced to its weight's multiply (in ``pair_folder``'s ``without-norms``), what
    it holds, both timed as a pair at each of ``args.threads`` (each timing's ``edgefuse`` and
    ``without_norms`` medians; ratio = without norms / edgefuse), and both profiled at the first thread count (:func:`edgefuse.tools.llm_latency.profile_table`)."""
    from edgefuse.llm.pte import read_pte

    folder = os.path.join(pair_folder, "without-norms")
    os.makedirs(folder, exist_ok=True)
    say(f"{shape.name} {dtype}: export_llm with edgefuse's lowering and every norm reduced to its weight's multiply")
    record = export_one(shape, dtype, params, "edgefuse", model_files, folder, extra, removed=True)
    if "rejected" in record:
        raise UsageError(f"export_llm rejected {shape.name} {dtype} without norms:\n{record['rejected']}")
    paths = {"stock": edgefuse, "edgefuse": record["path"]}
    contents = in_child(lambda note: counts(read_pte(record["path"])))
    timings = []
    for threads in args.threads:
        say(f"{shape.name} {dtype}: timing edgefuse's program and the one without norms at {threads} thread(s)")
        timing = time_both(shape.name, dtype, pair_folder, paths, threads, args, labels=("edgefuse", REMOVED))
        # the pair's slots by what they held: results.json must not call edgefuse's program stock's
        timing["edgefuse"], timing["without_norms"] = timing.pop("stock"), timing.pop("edgefuse")
        timing["load"] = os.getloadavg()
        timings.append(timing)
    say(f"{shape.name} {dtype}: profiling edgefuse's program and the one without norms ({args.profile_rounds} rounds "
        f"each, ETDump)")
    used, profile = profile_both(shape.name, dtype, pair_folder, paths, args.threads[0], args)
    return {"export": record, "contents": contents, "timings": timings, "profile": profile, "profile_threads": used}


def profile_both(name: str, dtype: str, folder: str, paths: dict, threads: int, args) -> tuple[int, str]:
    """Where edgefuse's program (``paths["stock"]``, first) and the one without norms spend a prefill and a
    decode step at ``threads``, side by side (in a child): the threads the runtime took, and the table."""

    def step(note):
        from edgefuse.runtime import set_threads
        from edgefuse.tools.llm_latency import Pair, profile_table

        used = set_threads(threads)
        pair = Pair(name, dtype, os.path.relpath(paths["stock"], folder), os.path.relpath(paths["edgefuse"], folder))
        return used, profile_table(folder, pair, args, note, labels=("edgefuse", REMOVED))

    return in_child(step)


def qnn_layer(params: dict) -> dict:
    """One decoder layer of ``params`` (ExecuTorch's ``Transformer``, one layer, :data:`QNN_VOCAB` tokens)
    lowered with edgefuse's passes at each QNN precision and run on the HTP emulator (in a child): each
    program's line, or why QNN could not be used."""
    layer = {**params, "n_layers": 1, "vocab_size": QNN_VOCAB}

    def step(note):
        from edgefuse.compare import qnn_flows
        from edgefuse.inputs.errors import Unavailable
        from edgefuse.inputs.qnn_models import executorch_transformer

        try:
            qnn_flows.require_libraries()
        except Unavailable as error:
            return {"unavailable": str(error)}
        module, inputs = executorch_transformer(layer, seq_len=QNN_TOKENS)
        rows = {}
        for precision in QNN_PRECISIONS:
            note(f"lowering one layer for QNN at {precision}")
            program = qnn_flows.lower_qnn(module, inputs, qnn_flows.EDGEFUSE, soc=QNN_SOC, precision=precision)
            program = qnn_flows.run_and_check(program, module, inputs)
            rows[precision] = {"found": program.found, "rebuilt": program.rebuilt, "rms_norms": program.rms_norms,
                               "ok": program.ok, "line": program.line()}
        return rows

    return in_child(step)


# -- one model ------------------------------------------------------------------------------------------


@dataclass
class PairResult:
    """One model and dtype: each export's record, the check of both, each thread count's timing."""

    model: str
    dtype: str
    norms: int
    exports: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    timings: list = field(default_factory=list)
    removed: dict = field(default_factory=dict)  # with --norms-removed: :func:`norm_cost`'s record
    through_hf: bool = False  # exported with optimum-executorch

    @property
    def passed(self) -> bool:
        """Both programs within their bounds, and no mean and no cast outside edgefuse's delegates; through
        Hugging Face's flow no float cast (its programs turn integer positions into floats for RoPE outside
        XNNPACK, which takes no int64: casts, but no norm's)."""
        ours = self.checks.get("edgefuse", {})
        casts = ours.get("float_casts") if self.through_hf else ours.get("casts")
        return all(c["matches"] for c in self.checks.values()) and ours.get("means") == 0 and casts == 0


def run_model(shape: Shape, args, say, start_order: int) -> tuple[list[PairResult], dict | None]:
    """Write ``shape``'s model files, export and check each dtype both ways (stock first in every other
    pair, from ``start_order``), time them, and lower one layer through QNN. A shape ``export_llm`` cannot
    export goes through Hugging Face's exporter (:func:`write_hf_model`, :func:`export_hf_one`,
    :func:`check_hf_both`)."""
    params = sized_params(shape, args.layers, args.dim)
    folder = os.path.join(args.out, shape.name)
    os.makedirs(folder, exist_ok=True)
    if shape.through_hf:
        say(f"{shape.name}: saving a random-weight {shape.hf_model_type} model with save_pretrained "
            f"({params['n_layers']} layers, width {params['dim']}); export_llm cannot export it, optimum-executorch does")
        model_dir = write_hf_model(shape, params, folder)
    else:
        say(f"{shape.name}: writing params and a random checkpoint ({params['n_layers']} layers, width {params['dim']})")
        model_files = write_model(shape, params, folder)
    extra = context_overrides(args.prefill, args.decode)
    results = []
    for k, dtype in enumerate(args.dtypes):
        result = PairResult(shape.name, dtype, norm_count(params, shape), through_hf=shape.through_hf)
        pair_folder = os.path.join(folder, dtype)
        os.makedirs(pair_folder, exist_ok=True)
        order = LOWERINGS if (start_order + k) % 2 == 0 else LOWERINGS[::-1]
        for how in order:
            if shape.through_hf:
                say(f"{shape.name} {dtype}: optimum-executorch's export with {how}'s recipe")
                record = export_hf_one(dtype, how, model_dir, pair_folder, hf_cache_length(args.prefill, args.decode))
            else:
                say(f"{shape.name} {dtype}: export_llm with {how}'s lowering")
                record = export_one(shape, dtype, params, how, model_files, pair_folder, extra)
            if "rejected" in record:
                exporter = "optimum-executorch" if shape.through_hf else "export_llm"
                raise UsageError(f"{exporter} rejected {shape.name} {dtype}:\n{record['rejected']}")
            unheld = "" if record["held"] else " (the C library is not glibc: the peak includes what was freed before)"
            say(f"{shape.name} {dtype} {how}: {record['seconds']:.0f}s, peak {record['peak_bytes'] / 2**30:.2f} GiB{unheld}")
            result.exports[how] = record
        paths = {how: result.exports[how]["path"] for how in LOWERINGS}
        say(f"{shape.name} {dtype}: both programs against eager ({CHECK_PREFILL} prompt tokens, "
            f"{CHECK_DECODE} decode steps)")
        if shape.through_hf:
            result.checks = check_hf_both(dtype, model_dir, paths)
        else:
            result.checks = check_both(shape, dtype, params, paths, model_files, extra)
        if not args.no_latency:
            for threads in args.threads:
                say(f"{shape.name} {dtype}: timing both at {threads} thread(s)")
                timing = time_both(shape.name, dtype, pair_folder, paths, threads, args)
                timing["load"] = os.getloadavg()
                result.timings.append(timing)
        if args.norms_removed and shape.through_hf:
            say(f"{shape.name} {dtype}: --norms-removed is for export_llm's programs; not measured for a model "
                "exported through Hugging Face's flow")
        elif args.norms_removed:
            result.removed = norm_cost(shape, dtype, params, model_files, pair_folder, paths["edgefuse"], extra,
                                       args, say)
        results.append(result)
        write_results(args.out, shape.name, results)
    qnn = None
    if not args.no_qnn:
        say(f"{shape.name}: one decoder layer through QNN ({', '.join(QNN_PRECISIONS)}) on the HTP emulator")
        qnn = qnn_layer(params)
    return results, qnn


def hf_cache_length(prefill: int, decode: int) -> int:
    """optimum's ``max_seq_len`` (its KV cache's length) for a prefill and decode steps: the context an
    ``export_llm`` program is exported with (:func:`context_overrides`)."""
    from edgefuse.tools.llm_latency import context_for

    return context_for(prefill, decode)[1]


def write_results(folder: str, name: str, results: list[PairResult]) -> None:
    """Keep what the pairs of model ``name`` measured so far as ``NAME/results.json`` in ``folder``, so a
    long run's figures outlive an interruption."""
    from edgefuse.runtime.files import replace_atomically

    data = json.dumps([vars(r) for r in results], indent=1).encode()
    replace_atomically(os.path.join(folder, name, "results.json"), lambda f: f.write(data))


# -- tables ---------------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def programs_table(results: list[PairResult]) -> str:
    from edgefuse.console.tables import format_table

    header = ("model", "dtype", "lowering", "norms", "delegates", "kernels outside", "means", "float casts",
              "integer casts", "err vs eager", "allowed", "ok", "export s", "peak GiB")
    rows = []
    for r in results:
        for how in LOWERINGS:
            c, e = r.checks[how], r.exports[how]
            rows.append([r.model, r.dtype, how, r.norms, c["delegates"], c["kernels"], c["means"], c["float_casts"],
                         c["casts"] - c["float_casts"],
                         f"{c['error']:.3g}", f"{c['allowed']:.3g}", "yes" if c["matches"] else "NO",
                         f"{e['seconds']:.1f}", _gib(e["peak_bytes"])])
    return format_table(header, rows)


def cost_table(results: list[PairResult]) -> str:
    from edgefuse.console.tables import format_table

    header = ("model", "dtype", "export s stock", "edgefuse", "ratio", "peak GiB stock", "edgefuse", "ratio",
              "substituted", "restored")
    rows = []
    for r in results:
        s, e = r.exports["stock"], r.exports["edgefuse"]
        rows.append([r.model, r.dtype, f"{s['seconds']:.1f}", f"{e['seconds']:.1f}",
                     f"{e['seconds'] / s['seconds']:.3f}",
                     _gib(s["peak_bytes"]), _gib(e["peak_bytes"]), f"{e['peak_bytes'] / s['peak_bytes']:.3f}",
                     e["substituted"], e["restored"]])
    return format_table(header, rows)


def latency_table(results: list[PairResult]) -> str:
    from edgefuse.console.tables import format_table

    header = ("model", "dtype", "threads", "runs", "stock prefill ms", "edgefuse", "ratio", "stock decode ms/token",
              "edgefuse", "ratio", "load (1, 5, 15 min)")
    rows = []
    for r in results:
        for t in r.timings:
            (sp, sd), (ep, ed) = t["stock"], t["edgefuse"]
            rows.append([r.model, r.dtype, t["threads"], t["runs"], f"{sp:.2f}", f"{ep:.2f}", f"{t['ratios'][0]:.3f}",
                         f"{sd:.3f}", f"{ed:.3f}", f"{t['ratios'][1]:.3f}", " ".join(f"{x:.2f}" for x in t["load"])])
    return format_table(header, rows)


def norm_cost_table(results: list[PairResult]) -> str:
    """Edgefuse's program against the one without norms at each thread count, every figure of a row from
    that pair's own timing (what edgefuse gains over stock is the latency table's, timed apart)."""
    from edgefuse.console.tables import format_table

    header = ("model", "dtype", "threads", "runs", "edgefuse prefill ms", REMOVED, "ratio", "edgefuse decode ms/token",
              REMOVED, "ratio", "load (1, 5, 15 min)")
    rows = []
    for r in results:
        for t in r.removed.get("timings", []):
            (ep, ed), (np_, nd) = t["edgefuse"], t["without_norms"]
            rows.append([r.model, r.dtype, t["threads"], t["runs"], f"{ep:.2f}", f"{np_:.2f}", f"{t['ratios'][0]:.3f}",
                         f"{ed:.3f}", f"{nd:.3f}", f"{t['ratios'][1]:.3f}", " ".join(f"{x:.2f}" for x in t["load"])])
    return format_table(header, rows)


def qnn_lines(name: str, qnn: dict) -> list[str]:
    if "unavailable" in qnn:
        return [f"{name} QNN: not run: {qnn['unavailable']} (set QNN's libraries up with `edgefuse qnn setup`)"]
    lines = [f"{name} QNN one layer {precision}: {row['line']}" for precision, row in qnn.items()]
    if SHAPES.get(name) is not None and SHAPES[name].through_hf:
        lines.insert(0, f"{name} QNN: the layer is ExecuTorch's Transformer layer at {name}'s widths, with its QK norms "
                        "and its norms' unit offset; that Transformer builds no post-norms and a SiLU feed-forward, so the "
                        "layer is not Gemma 3's")
    return lines


# -- the command ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {', '.join(DTYPES)}")
    parser.add_argument("--threads", default="1,2", help="thread counts the latency is timed at (default 1,2)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's own)")
    parser.add_argument("--dim", type=int, default=None,
                        help="a toy width for a quick run, a multiple of 32 (heads of 16, vocabulary 256)")
    parser.add_argument("--prefill", type=int, default=128, help="prompt tokens the latency is timed on (default 128)")
    parser.add_argument("--decode", type=int, default=16, help="decode steps timed after the prompt (default 16)")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds of each program a run (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--repeats", type=int, default=0,
                        help="further pairs of runs of a pair whose ratio is 0.99 or above (default 0)")
    parser.add_argument("--no-latency", action="store_true", help="time no prefill or decode (a busy machine)")
    parser.add_argument("--no-qnn", action="store_true", help="lower no decoder layer through QNN")
    parser.add_argument("--norms-removed", action="store_true",
                        help="also export edgefuse's program with every norm reduced to its weight's multiply, time "
                        "it against edgefuse's and profile both: what the norms still cost")
    parser.add_argument("--profile-rounds", type=int, default=5,
                        help="profiled rounds of each program with --norms-removed (default 5)")
    parser.add_argument("--out", default=None,
                        help="where the model files and programs are written (default: a fresh private folder, "
                        "removed afterwards)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, metavar="N",
                        help=f"the most bytes a timed .pte may take to load (default {MAX_BYTES:,})")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _names(value: str, known, what: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise UsageError(f"--{what} names nothing; known: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown {what[:-1]} {unknown[0]!r}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def _thread_counts(value: str) -> list[int]:
    from edgefuse.runtime.threads import threads_problem

    counts = []
    for text in (v.strip() for v in value.split(",")):
        if not text.isdigit():
            raise UsageError(f"--threads {value}: comma-separated thread counts, e.g. 1,2")
        problem = threads_problem(int(text))
        if problem:
            raise UsageError(problem)
        counts.append(int(text))
    return list(dict.fromkeys(counts))


def check_options(args) -> None:
    """Turn the options into what the run uses, or :class:`UsageError` naming the one that cannot be used."""
    from edgefuse.compare.llm_programs import check_bench_numbers

    args.models = _names(args.models, SHAPES, "models")
    args.dtypes = _names(args.dtypes, DTYPES, "dtypes")
    args.threads = _thread_counts(args.threads)
    if args.layers is not None and args.layers < 1:
        raise UsageError("--layers must be at least 1")
    if args.dim is not None and (args.dim < 32 or args.dim % 32):
        raise UsageError("--dim must be a multiple of 32 (8da4w groups of 32, heads of 16)")
    check_bench_numbers(argparse.Namespace(**{**vars(args), "threads": args.threads[0]}),
                        (("--repeats", args.repeats, 0), ("--max-bytes", args.max_bytes, 1),
                         ("--profile-rounds", args.profile_rounds, 1)))
    if args.norms_removed and args.no_latency:
        raise UsageError("--norms-removed times the program without norms against edgefuse's: not with --no-latency")
    if args.prefill + args.decode > 1024:
        raise UsageError("--prefill plus --decode at most 1024 (the context every program is exported with)")
    through_hf = [name for name in args.models if SHAPES[name].through_hf]
    if through_hf:
        _require_hf(through_hf[0])


def _require_hf(name: str) -> None:
    """:class:`UsageError` saying what to install when ``name``, a shape exported through Hugging Face's flow,
    cannot be: transformers (the ``models`` extra) and optimum-executorch are not dependencies of edgefuse."""
    from edgefuse.hf.flow import INSTALL, installed

    for module, install in (("transformers", "pip install 'edgefuse[models]'"),
                            ("optimum.exporters.executorch", INSTALL)):
        if not installed(module):
            raise UsageError(f"{name} is exported with optimum-executorch, which needs {module.split('.')[0]}: "
                             f"{install} (or leave {name} out of --models)")


def run(args, say) -> int:
    check_options(args)
    from edgefuse.runtime.files import UnsafeFolder, fresh_private_folder, own_folder

    shapes = [SHAPES[name] for name in args.models]
    temporary = args.out is None
    try:
        args.out = fresh_private_folder("edgefuse-scale-") if temporary else own_folder(args.out)
    except (UnsafeFolder, OSError) as error:
        raise UsageError(f"--out {args.out}: {error}") from error
    try:
        return _run(shapes, args, say)
    finally:
        if temporary:
            import shutil

            shutil.rmtree(args.out, ignore_errors=True)


def _run(shapes: list[Shape], args, say) -> int:
    counts = {shape.name: parameter_count(sized_params(shape, args.layers, args.dim), shape.tied, shape)
              for shape in shapes}
    results, qnn = [], {}
    for shape in shapes:
        pairs, qnn[shape.name] = run_model(shape, args, say, len(results))
        results += pairs
    for shape in shapes:
        print(f"{shape.name}: {counts[shape.name]:,} parameters ({shape.source})"
              + (f"\n  exported with optimum-executorch (edgefuse export-hf's flow: recipes xnnpack and edgefuse-xnnpack, "
                 f"custom SDPA), not export_llm: {shape.unsupported}" if shape.through_hf else ""))
    if args.layers is not None or args.dim is not None:
        print(f"cut for a quick run: --layers {args.layers} --dim {args.dim}")
    if not results:
        return OK
    print("programs (norms: the architecture's RMSNorms; delegates, kernels, means and casts: what the .pte runs; "
          f"error: against eager, at the step of a {CHECK_PREFILL}-token prompt and {CHECK_DECODE} decode steps nearest its bound or furthest past it)")
    print(programs_table(results))
    print("export cost (each export alone in a child process; ratio = edgefuse / stock; stock and edgefuse "
          "alternate which runs first from one dtype to the next)")
    print(cost_table(results))
    if any(r.timings for r in results):
        print(f"latency: prefill of {args.prefill} tokens, {args.decode} decode steps; {args.rounds} rounds a run "
              f"after {args.warmup} warm-up rounds, two runs (each program loaded first once); medians over every "
              "round; ratio = edgefuse / stock, the geometric mean of each run's ratio of medians")
        for line in dict.fromkeys(t["conditions"] for r in results for t in r.timings):
            print(f"  {line}")
        print(latency_table(results))
        for r in results:
            if any(t.get("one_token") for t in r.timings):
                print(f"  {r.model} {r.dtype}: the programs take one token a call (optimum exports them with static "
                      f"shapes), so a prefill is {args.prefill} calls of one token, as optimum's runner "
                      "(ExecuTorchModelForCausalLM) prefills them")
    if any(r.removed for r in results):
        print(f"what the norms still cost: edgefuse's program against the same export with every norm reduced to its "
              f"weight's multiply ({REMOVED}), timed as the pairs above")
        print(norm_cost_table(results))
        for r in results:
            if r.removed:
                c = r.removed["contents"]
                print(f"{r.model} {r.dtype} {REMOVED}: {c['delegates']} delegates, {c['kernels']} kernels outside, "
                      f"{c['means']} means, {c['casts']} casts; where the time goes at "
                      f"{r.removed['profile_threads']} thread(s), {args.profile_rounds} rounds each with ETDump "
                      "recording (compare the two, not the totals):")
                print(r.removed["profile"])
    for name, row in qnn.items():
        if row is not None:
            for line in qnn_lines(name, row):
                print(line)
    ok = all(r.passed for r in results) and all(
        row.get("ok", True) for q in qnn.values() if q and "unavailable" not in q for row in q.values())
    print("all passed" if ok else "FAILED")
    return OK if ok else CHECK_FAILED


def main(argv: list[str] | None = None) -> int:
    from edgefuse.console.progress import Progress
    from edgefuse.runtime.blas import pin_blas_threads

    args = build_parser().parse_args(argv)
    if not args.no_latency:  # nothing timed: torch keeps its threads
        pin_blas_threads()
    say = Progress(enabled=not args.quiet)
    return run_command(PROG, run, args, say)


if __name__ == "__main__":
    raise SystemExit(main())
