"""What an export through optimum-executorch may ask for, checked before anything slow runs: the recipe, the
options and their choices (optimum's own), the model folder, the output; optimum-executorch installed."""

from __future__ import annotations

import inspect
import json
import os
import sys

import pytest

from edgefuse.hf.flow import OptimumUnavailable, check_export, check_installed, export
from edgefuse.hf.options import OPTIONS, HfInputError, check_model_folder, check_options, check_recipe
from tests.optional import require_optimum


def test_the_recipes_are_edgefuses_and_stocks():
    assert check_recipe("edgefuse-xnnpack") == "edgefuse-xnnpack"
    assert check_recipe("xnnpack") == "xnnpack"
    with pytest.raises(HfInputError, match="unknown recipe 'coreml': choose edgefuse-xnnpack or xnnpack"):
        check_recipe("coreml")


def test_an_option_optimum_does_not_take_is_refused_by_name():
    with pytest.raises(HfInputError, match="unknown option 'qlinear_group_size': the export takes use_custom_sdpa"):
        check_options({"qlinear_group_size": 64})


@pytest.mark.parametrize("name, value, message", [
    ("qlinear", "8da3w", "qlinear '8da3w' is not one of its choices: 8da4w, 4w, 8w, 8da8w, 8da4w,8da8w"),
    ("qembedding", "2w", "qembedding '2w' is not one of its choices: 4w, 8w"),
    ("dtype", "float64", "dtype 'float64' is not one of its choices: float32, float16, bfloat16"),
    ("max_seq_len", "64", "max_seq_len is a positive whole number, got '64'"),
    ("max_seq_len", 0, "max_seq_len is a positive whole number, got 0"),
    ("max_seq_len", True, "max_seq_len is a positive whole number, got True"),
    ("use_custom_sdpa", "yes", "use_custom_sdpa is True or False, got 'yes'"),
])
def test_a_value_outside_an_options_kind_or_choices_is_refused(name, value, message):
    with pytest.raises(HfInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_options({name: value})


def test_flags_that_are_off_and_options_not_given_are_dropped_as_optimums_command_line_drops_them():
    given = {"use_custom_sdpa": True, "use_custom_kv_cache": False, "qlinear": None, "max_seq_len": 64}
    assert check_options(given) == {"use_custom_sdpa": True, "max_seq_len": 64}


def test_the_options_are_optimums_own_and_its_text_generation_task_reads_each():
    """Each option of :data:`OPTIONS` is one of ``optimum-cli export executorch``'s, of the same kind, with
    choices among optimum's; and optimum-executorch's text-generation task reads it (the group sizes, which
    it does not pass on, are not offered)."""
    require_optimum()
    import argparse

    from optimum.commands.export.executorch import parse_args_executorch
    from optimum.exporters.executorch.tasks.causal_lm import load_causal_lm_model

    parser = argparse.ArgumentParser()
    parse_args_executorch(parser)
    theirs = {action.dest: action for action in parser._actions}
    task = inspect.getsource(load_causal_lm_model)
    for name, option in OPTIONS.items():
        action = theirs[name]
        if option.kind is bool:
            assert isinstance(action, argparse._StoreTrueAction), name
        else:
            assert action.type is option.kind, name
        assert set(option.choices) <= set(action.choices or ()), name
        assert f'"{name}"' in task, f"optimum's text-generation task does not read {name}"
    assert '"qlinear_group_size"' not in task  # so it is not offered


def test_a_model_folder_is_a_folder_with_a_config_json_naming_its_model_type(tmp_path, model_dir):
    assert check_model_folder(model_dir) == "llama"
    with pytest.raises(HfInputError, match="is not a folder: give the folder a model was saved in"):
        check_model_folder(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(HfInputError, match="has no config.json: give the folder a model was saved in with save_pretrained"):
        check_model_folder(empty)
    (empty / "config.json").mkdir()
    with pytest.raises(HfInputError, match="is a folder, not a regular file"):
        check_model_folder(empty)
    (empty / "config.json").rmdir()
    (empty / "config.json").write_text("{not json")
    with pytest.raises(HfInputError, match="is not JSON"):
        check_model_folder(empty)
    (empty / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(HfInputError, match="names no model_type"):
        check_model_folder(empty)


def test_a_config_json_past_its_bound_is_refused_before_it_is_parsed(model_dir):
    """config.json is read within :data:`edgefuse.hf.options.CONFIG_LIMIT` (1 MiB), as a regular file."""
    from edgefuse.hf.options import CONFIG_LIMIT

    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "pad": " " * CONFIG_LIMIT}))
    with pytest.raises(HfInputError, match="config.json"):
        check_model_folder(model_dir)


def test_a_program_already_at_the_output_is_refused_before_the_export(tmp_path, model_dir):
    out = tmp_path / "out"
    assert check_export(model_dir, out) == ("llama", {})
    out.mkdir()
    (out / "model.pte").write_bytes(b"theirs")
    with pytest.raises(HfInputError, match="model.pte is already there: the export writes a new file only"):
        check_export(model_dir, out)
    os.symlink(tmp_path / "elsewhere", out / "model.stock.pte")  # a dangling link is there too
    with pytest.raises(HfInputError, match="already there"):
        check_export(model_dir, out, "xnnpack", "model.stock.pte")
    with pytest.raises(HfInputError, match="a file name ending in .pte, without a folder"):
        check_export(model_dir, out, name="../model.pte")


def test_without_optimum_executorch_the_export_says_how_to_install_it(monkeypatch):
    for name in ("optimum", "optimum.exporters", "optimum.exporters.executorch"):  # as if never installed
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(OptimumUnavailable, match="optimum-executorch is not installed: pip install optimum-executorch"):
        check_installed({})


def test_the_custom_kv_cache_is_refused_where_transformers_has_no_hybrid_cache():
    """optimum-executorch 1.1.0's custom KV cache imports transformers' HybridCache (5.0.0rc1 has it; 5.0.0
    and later do not): refused up front where it would fail after the model is loaded."""
    require_optimum()
    import transformers.cache_utils

    if hasattr(transformers.cache_utils, "HybridCache"):
        check_installed({"use_custom_kv_cache": True})
    else:
        with pytest.raises(HfInputError, match="use_custom_kv_cache: optimum-executorch's custom KV cache imports "
                                               "transformers' HybridCache"):
            check_installed({"use_custom_kv_cache": True})
    check_installed({"use_custom_sdpa": True})


@pytest.mark.parametrize("recipe, options, message", [
    ("coreml", {}, "unknown recipe"),
    ("edgefuse-xnnpack", {"qembedding_group_size": 32}, "unknown option"),
    ("edgefuse-xnnpack", {"qlinear": "8da3w"}, "not one of its choices"),
])
def test_the_python_api_refuses_bad_requests_at_once(model_dir, tmp_path, recipe, options, message):
    with pytest.raises(HfInputError, match=message):
        export(model_dir, tmp_path / "out", recipe, **options)
    assert not (tmp_path / "out").exists()


def test_register_puts_edgefuses_recipe_in_optimums_registry():
    require_optimum()
    from optimum.exporters.executorch.recipe_registry import recipe_registry

    from edgefuse.hf.recipe import export_with_edgefuse_xnnpack, register

    register()
    assert recipe_registry["edgefuse-xnnpack"] is export_with_edgefuse_xnnpack
