"""What the commands write: JSON that validates against the schema, on the stdout of a real process, a
``.pte`` that loads and a delegate map that names the delegates (the demo's tables:
tests/cli/test_private_paths.py)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

import jsonschema

from edgefuse import cli  # noqa: E402
from edgefuse.inputs.errors import OK  # noqa: E402
from edgefuse.inputs.modelspec import resolve  # noqa: E402
from edgefuse.compare.report import build_report, schema  # noqa: E402
from tests.cli.command_runs import SVG, run  # noqa: E402

pytestmark = pytest.mark.slow


# --- the machine form -----------------------------------------------------------------------------------

def test_report_json_of_a_real_model_validates_against_the_schema(workdir):
    done = run("report", "tiny-qwen3", "--json", "--stage", "capture", "--dtype", "float16", cwd=workdir)
    assert done.returncode == OK, done.stderr
    data = json.loads(done.stdout)
    jsonschema.validate(data, schema(), cls=jsonschema.Draft202012Validator)
    assert data["model"] == {"name": "tiny-qwen3", "kind": "builtin", "dtype": "float16"}
    assert data["summary"]["norms"] == len(data["norms"]) == 9  # 2 layers x (2 + q, k) + the final norm
    assert data["summary"]["ok"] is True
    paths = {n["module_path"] for n in data["norms"]}
    assert "model.model.layers.1.self_attn.q_norm" in paths and "model.model.norm" in paths
    assert all(n["max_error"] is not None for n in data["norms"])
    assert data["quantization"] is None and all(n["quantized"] is None for n in data["norms"])


def test_report_quantize_qnn_says_how_each_norm_was_quantized(workdir, capfd, monkeypatch):
    # The released QnnQuantizer, built without the SDK (a QNN_SDK_ROOT an earlier test of this process set
    # is taken away): the rebuilt norm is annotated as one op, so it costs one quantize/dequantize pair in,
    # one out and one for its weight, read from the converted graph. In this process, with what reaches the
    # process's stdout and stderr descriptors captured (capfd), so a library writing to them is seen.
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    code = cli.main(["report", f"{workdir / 'models.py'}:block", "--quantize", "qnn", "--json"])
    out, err = capfd.readouterr()
    assert code == OK, err
    data = json.loads(out)
    jsonschema.validate(data, schema(), cls=jsonschema.Draft202012Validator)
    assert data["stage"] == "capture" and data["quantization"] == "qnn"
    [norm] = data["norms"]
    assert norm["module_path"] == "norm" and norm["rebuilt"] is True
    assert norm["quantized"] == {
        "how": "one op", "ops": ["rms_norm"], "pairs_in": 1, "pairs_inside": 0, "pairs_out": 1, "pairs_constant": 1,
    }


# --- lowering and the delegate map (subprocess) ---------------------------------------------------------

def test_lower_writes_a_pte_and_a_delegate_map_that_names_the_delegates(workdir):
    done = run("lower", "models.py:block", "-o", "block.pte", cwd=workdir)
    assert done.returncode == OK, done.stderr
    assert "cpuinfo_utils" not in done.stderr, done.stderr  # the threadpool's set-up lines are held back
    out = done.stdout
    assert "before (stock) and after (edgefuse)" in out
    stock = next(line for line in out.splitlines() if line.strip().startswith("stock:"))
    ours = next(line for line in out.splitlines() if line.strip().startswith("edgefuse:"))
    assert "stock: 2 delegates, 1 op outside (1 mean.dim); max error against eager" in stock and "within" in stock
    assert "edgefuse: 1 delegate, 0 ops outside; max error against eager" in ours and "within" in ours

    pte = (workdir / "block.pte").read_bytes()
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method("forward")
    assert method is not None

    # the default map: next to the .pte, a new file (one edgefuse never writes through a link or over a file
    # it did not write: tests/cli/test_private_paths.py)
    svg = workdir / "block.delegates.svg"
    assert svg.read_text().startswith("<svg")
    root = ET.parse(svg).getroot()
    assert root.tag == f"{SVG}svg"
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    boxes = [g for g in root.iter(f"{SVG}g") if g.get("class") == "delegate"]
    assert boxes and all(g.find(f"{SVG}text").text.startswith("XnnpackBackend #") for g in boxes)
    headers = [t.text for t in root.iter(f"{SVG}text") if t.text and t.text.startswith(("stock:", "edgefuse:"))]
    assert [h.split(":")[0] for h in headers] == ["stock", "edgefuse"]
    assert headers[0].split(",")[0] in stock  # "stock: N delegates" agrees with the printed summary


@pytest.fixture(scope="module")
def fresh_delegates(workdir) -> dict[str, int]:
    """The delegates of a fresh export of the block lowered stock and with edgefuse, by lowering: what the map
    of an export the report left unchanged shows, whichever stage the report read."""
    from edgefuse.compare.pte_checks import lower_to_pte

    return {how: lower_to_pte(resolve(f"{workdir / 'models.py'}:block", torch.float32).export(), how,
                              serialize=False).summary.delegates for how in ("stock", "edgefuse")}


@pytest.mark.parametrize("stage", ["edge", "capture"])
def test_report_map_lowers_the_export_the_report_read_and_leaves_it_unchanged(
    workdir, stage, fresh_delegates, monkeypatch, capsys
):
    """``report --map`` exports once: the report's recomposition leaves the exported program as it was,
    so the map drawn from it equals the map of a fresh export."""
    from edgefuse.inputs.modelspec import ModelSpec

    exports = []
    real_export = ModelSpec.export
    monkeypatch.setattr(ModelSpec, "export", lambda self: exports.append(self.name) or real_export(self))
    spec = resolve(f"{workdir / 'models.py'}:block", torch.float32)
    program = spec.export()
    before = (program.graph_module.code, str(program.graph_signature), dict(program.constants),
              {k: v.clone() for k, v in program.state_dict.items()})
    build_report(spec, stage=stage, program=program)
    assert (program.graph_module.code, str(program.graph_signature), dict(program.constants)) == before[:3]
    assert program.state_dict.keys() == before[3].keys()
    assert all(torch.equal(program.state_dict[k], v) for k, v in before[3].items())
    # a folded weight stays in the edge program, a constant a delegate takes stays in this one: tests/core/test_programs.py

    exports.clear()
    path = workdir / f"report-{stage}.svg"
    assert cli.main(["report", f"{workdir / 'models.py'}:block", "--stage", stage, "--map", str(path)]) == OK
    assert len(exports) == 1, capsys.readouterr().out
    assert capsys.readouterr().err.count("] exporting ") == 1  # its progress line, once
    root = ET.parse(path).getroot()
    headers = [t.text for t in root.iter(f"{SVG}text") if t.text and t.text.startswith(("stock:", "edgefuse:"))]
    assert [h.split(",")[0] for h in headers] == [
        f"{how}: {count} delegate" + ("s" if count != 1 else "") for how, count in fresh_delegates.items()], headers
