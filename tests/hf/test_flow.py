"""What an export does with the folders and files around optimum-executorch's: the program written as a new
file, without a hard link; no code from the model folder run."""

from __future__ import annotations

import errno
import json
import os

import pytest

from edgefuse.hf.flow import ModelRejected, export
from edgefuse.hf.options import HfInputError
from tests.optional import require_optimum


def _optimum_writes(monkeypatch, program: bytes, before=lambda: None):
    """optimum's ``main_export`` as far as the flow sees it: ``program`` written as ``model.pte`` in its output
    folder (``before`` runs first)."""
    import optimum.exporters.executorch as optimum

    def main_export(model, task, recipe, output_dir, recipe_kwargs, **options):
        before()
        os.makedirs(output_dir)
        with open(os.path.join(output_dir, "model.pte"), "wb") as file:
            file.write(program)

    monkeypatch.setattr(optimum, "main_export", main_export)


def test_the_program_is_written_where_no_hard_link_can_be_made(model_dir, tmp_path, monkeypatch):
    """On a filesystem without hard links (os.link fails), the program is still written, as a new file."""
    require_optimum()

    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    _optimum_writes(monkeypatch, b"program")
    monkeypatch.setattr(os, "link", no_links)
    done = export(model_dir, tmp_path / "out", "xnnpack")
    assert (tmp_path / "out" / "model.pte").read_bytes() == b"program" and done.path == str(tmp_path / "out" / "model.pte")
    assert os.listdir(tmp_path / "out") == ["model.pte"]  # optimum's folder is gone


def test_a_program_that_appeared_during_the_export_is_left_as_it_is(model_dir, tmp_path, monkeypatch):
    require_optimum()
    out = tmp_path / "out"
    _optimum_writes(monkeypatch, b"ours", before=lambda: (out / "model.pte").write_bytes(b"theirs"))
    with pytest.raises(HfInputError, match="appeared while the model was exported"):
        export(model_dir, out, "xnnpack")
    assert (out / "model.pte").read_bytes() == b"theirs"


def test_code_in_the_model_folder_is_not_run(model_dir, tmp_path):
    """A config.json whose ``auto_map`` names a modeling file of the folder: edgefuse takes no
    ``trust_remote_code`` and optimum's text-generation task passes none to transformers (whose default is
    False), so the file is never imported (the load fails on the missing weights)."""
    require_optimum()
    with pytest.raises(HfInputError, match="unknown option 'trust_remote_code'"):
        export(model_dir, tmp_path / "out", "xnnpack", trust_remote_code=True)
    ran = tmp_path / "ran"
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64,
        "auto_map": {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"},
    }))
    (model_dir / "modeling_evil.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    with pytest.raises(ModelRejected):
        export(model_dir, tmp_path / "out", "xnnpack")
    assert not ran.exists()
