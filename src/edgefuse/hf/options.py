"""What an export through optimum-executorch may ask for, as data: the recipes, the options and their values,
and the model folder, each checked before anything slow is imported or loaded.

optimum-executorch 1.1.0 hands every option of ``optimum-cli export executorch`` to its task (loading,
quantizing and wrapping the model), not to the recipe, so ``edgefuse-xnnpack`` takes exactly the options its
``xnnpack`` recipe takes. :data:`OPTIONS` holds those its ``text-generation`` task reads, with optimum's own
spelling and choices; ``qlinear_group_size`` and ``qembedding_group_size`` are left out, as that task does not
pass them on (the default group sizes apply), and so are ``fpa4w`` (Apple's MPS device) and the options of
encoders, CUDA and other devices.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

#: edgefuse's recipe, and the stock one of optimum-executorch it is compared with.
EDGEFUSE_RECIPE = "edgefuse-xnnpack"
STOCK_RECIPE = "xnnpack"
RECIPES = (EDGEFUSE_RECIPE, STOCK_RECIPE)

#: The one task both recipes export for: a decoder-only language model with its KV cache.
TASK = "text-generation"

#: The name optimum gives the program it writes in its output folder.
PROGRAM_NAME = "model.pte"

#: The most bytes a model folder's config.json may hold (real ones hold a few kilobytes).
CONFIG_LIMIT = 1 << 20


@dataclass(frozen=True)
class Option:
    """One option of optimum's export: a flag (``kind`` bool), a number (int) or one of ``choices`` (str)."""

    name: str
    kind: type
    help: str
    choices: tuple[str, ...] = ()


#: The options of optimum-executorch 1.1.0's ``text-generation`` task, by optimum's name.
OPTIONS: dict[str, Option] = {
    option.name: option
    for option in (
        Option("use_custom_sdpa", bool, "ExecuTorch's custom SDPA op with a static KV cache"),
        Option("use_custom_kv_cache", bool, "ExecuTorch's custom KV cache update op (needs transformers 5.0.0rc1: "
                                            "optimum-executorch 1.1.0 imports its HybridCache)"),
        Option("disable_dynamic_shapes", bool, "export with a static sequence length"),
        Option("qlinear", str, "quantize the linear layers: 8da4w (8-bit dynamic activations, 4-bit weights), "
                               "8da8w, 8da4w,8da8w, 4w or 8w (weights only)",
               ("8da4w", "4w", "8w", "8da8w", "8da4w,8da8w")),
        Option("qembedding", str, "quantize the embedding: 4w or 8w (weights only)", ("4w", "8w")),
        Option("max_seq_len", int, "the KV cache's length (default: the model's max_position_embeddings)"),
        Option("dtype", str, "the model's dtype (default float32); bfloat16 runs XNNPACK's bfloat16 kernels",
               ("float32", "float16", "bfloat16")),
    )
}


class HfInputError(ValueError):
    """An export asked for something it cannot do: no model folder or config.json, an unknown recipe, an
    option optimum does not take or a value outside its choices, an output that is already there."""


def check_recipe(recipe: str) -> str:
    """``recipe`` if it is one of :data:`RECIPES`, else :class:`HfInputError` naming them."""
    if recipe not in RECIPES:
        raise HfInputError(f"unknown recipe {recipe!r}: choose {' or '.join(RECIPES)}")
    return recipe


def check_options(options: dict[str, object]) -> dict[str, object]:
    """``options`` checked against :data:`OPTIONS`: known names, values of the option's kind and choices; the
    flags that are off and the values that are None dropped, as optimum's command line drops them."""
    checked: dict[str, object] = {}
    for name, value in options.items():
        option = OPTIONS.get(name)
        if option is None:
            raise HfInputError(f"unknown option {name!r}: the export takes {', '.join(OPTIONS)}")
        if value is None or value is False:
            continue
        if option.kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise HfInputError(f"{name} is a positive whole number, got {value!r}")
        if option.kind is bool and value is not True:
            raise HfInputError(f"{name} is True or False, got {value!r}")
        if option.choices and value not in option.choices:
            raise HfInputError(f"{name} {value!r} is not one of its choices: {', '.join(option.choices)}")
        checked[name] = value
    return checked


def check_model_folder(model_dir: str | os.PathLike) -> str:
    """The ``model_type`` of the Hugging Face model saved in ``model_dir`` (``save_pretrained``'s folder),
    read from its config.json; :class:`HfInputError` for a path that is no folder, a folder without a
    config.json, or a config.json that is not a JSON object with a ``model_type``."""
    from edgefuse.runtime.files import NotARegularFile, TooLarge, read_regular

    folder = os.fspath(model_dir)
    if not os.path.isdir(folder):
        raise HfInputError(f"{folder} is not a folder: give the folder a model was saved in with save_pretrained")
    path = os.path.join(folder, "config.json")
    if not os.path.lexists(path):
        raise HfInputError(f"{folder} has no config.json: give the folder a model was saved in with save_pretrained")
    try:
        config = json.loads(read_regular(path, CONFIG_LIMIT, "a model's config.json"))
    except (NotARegularFile, TooLarge) as error:
        raise HfInputError(str(error)) from error
    except OSError as error:
        raise HfInputError(f"cannot read {path}: {error.strerror or error}") from error
    except ValueError as error:
        raise HfInputError(f"{path} is not JSON: {error}") from error
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise HfInputError(f"{path} names no model_type: it is not a config.json save_pretrained wrote")
    return model_type
