"""The ``edgefuse`` command line, driven as a user drives it.

Subprocess runs (``python -m edgefuse ...``) cover what only a real process shows: bad input ends
with exit 2 and a message instead of a traceback, the JSON on stdout validates against the documented
schema, ``lower`` writes a ``.pte`` that loads and a delegate map that is a valid SVG naming the
delegates. Each such run pays torch's and ExecuTorch's import (seconds), so
the rest runs in-process through ``edgefuse.cli.main``: every built-in model reports every norm, the
benchmark, the fuzz hand-off and the parts behind them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest
import torch

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("transformers")

from edgefuse import cli  # noqa: E402
from edgefuse.cli.errors import CHECK_FAILED, OK, UNAVAILABLE, USAGE, Unavailable  # noqa: E402
from edgefuse.cli.stock_and_edgefuse import DelegateSummary, Segment  # noqa: E402
from edgefuse.cli.models import MODEL_NAMES  # noqa: E402
from edgefuse.cli.modelspec import resolve  # noqa: E402
from edgefuse.cli.report import build_report, layer_of, schema, summary_line, to_json  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"

MODELS_PY = textwrap.dedent(
    '''
    import torch
    from torch import nn


    class Norm(nn.Module):
        """Hugging Face Llama's RMSNorm."""

        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))

        def forward(self, x):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * h.to(x.dtype)


    class Block(nn.Module):
        def __init__(self, width=32):
            super().__init__()
            self.norm = Norm(width)
            self.linear = nn.Linear(width, width, bias=False)

        def forward(self, x):
            return x + self.linear(self.norm(x))


    def block():
        torch.manual_seed(0)
        return Block(), (torch.randn(1, 8, 32),)


    def raises():
        raise RuntimeError("the checkpoint is not here")


    def data_dependent():
        class M(nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    return x
                return -x

        return M(), (torch.randn(3),)


    def wrong_inputs():
        torch.manual_seed(0)
        return Block(), (torch.randn(1, 8, 16),)


    class WithIndex(nn.Module):
        """A norm and an integer output: which feature of each row is largest."""

        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x), x.argmax(-1)


    def integer_output():
        torch.manual_seed(0)
        return WithIndex(), (torch.randn(1, 8, 32),)


    class Inverse(nn.Module):
        """A norm, then a matrix inverse: torch.export takes it, ExecuTorch's core ATen opset does not."""

        def __init__(self):
            super().__init__()
            self.norm = Norm(4)

        def forward(self, x):
            return torch.linalg.inv(self.norm(x))


    def not_in_edge():
        torch.manual_seed(0)
        return Inverse(), (torch.randn(4, 4),)


    class Branches(nn.Module):
        """A norm in a branch of torch.cond, which export traces by re-importing this file's module."""

        def __init__(self):
            super().__init__()
            self.norm = Norm(32)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: self.norm(x), lambda x: x * 2, (x,))


    def with_cond():
        torch.manual_seed(0)
        return Branches(), (torch.randn(1, 8, 32),)


    class WritesItsInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            x.mul_(2.0)
            return self.block(x) + x


    class CountsCalls(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.register_buffer("calls", torch.zeros(32))

        def forward(self, x):
            self.calls.add_(1.0)
            return self.block(x + self.calls)


    def stateful():
        torch.manual_seed(0)
        return WritesItsInput(), (torch.randn(1, 8, 32),)


    def counter():
        torch.manual_seed(0)
        return CountsCalls(), (torch.randn(1, 8, 32),)


    class ReturnsItsBuffer(CountsCalls):
        def forward(self, x):
            return super().forward(x), self.calls


    class WritesAWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            y = self.block(x)
            with torch.no_grad():
                self.block.linear.weight.mul_(0.5)
            return y


    def returns_buffer():
        torch.manual_seed(0)
        return ReturnsItsBuffer(), (torch.randn(1, 8, 32),)


    def writes_weight():
        torch.manual_seed(0)
        return WritesAWeight(), (torch.randn(1, 8, 32),)


    class MaskedLogits(nn.Module):
        """A norm, then logits with the positions past each row's length masked to -inf."""

        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            keep = torch.arange(x.shape[1]).unsqueeze(-1) < 5
            return self.block(x).masked_fill(~keep, float("-inf"))


    def masked():
        torch.manual_seed(0)
        return MaskedLogits(), (torch.randn(1, 8, 32),)


    class Rank7Norm(nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


    def rank7():
        return Rank7Norm(), (torch.randn(1, 2, 1, 2, 1, 2, 16),)


    class NormThenLogsumexp(nn.Module):
        """A float16 norm, then logsumexp, which to_edge decomposes into float16 steps that round."""

        def __init__(self):
            super().__init__()
            self.norm = Norm(64)

        def forward(self, x):
            return torch.logsumexp(self.norm(x) * 3, -1)


    def logsumexp():
        torch.manual_seed(0)
        return NormThenLogsumexp().half(), (torch.randn(4, 8, 64, dtype=torch.float16) * 3,)


    def torch_norm():
        torch.manual_seed(0)
        return nn.Sequential(nn.RMSNorm(32, eps=1e-6), nn.Linear(32, 32)), (torch.randn(1, 8, 32),)


    class TorchNormInCond(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.inner = nn.RMSNorm(32, eps=1e-6), nn.RMSNorm(32, eps=1e-6)

        def forward(self, x):
            y = self.first(x)
            return torch.cond(y.sum() > 0, lambda y: self.inner(y), lambda y: y * 2, (y,))


    def torch_norm_in_cond():
        torch.manual_seed(0)
        return TorchNormInCond(), (torch.randn(1, 8, 32),)


    def on_meta():
        with torch.device("meta"):
            return Block(), (torch.randn(1, 8, 32),)
    '''
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with models.py (the file models above) and block.pt2 (a saved float16 program)."""
    path = tmp_path_factory.mktemp("cli")
    (path / "models.py").write_text(MODELS_PY)
    spec = resolve(f"{path / 'models.py'}:block", torch.float16)
    torch.export.save(spec.export(), str(path / "block.pt2"))
    return path


def run(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m edgefuse -q ARGS`` in ``cwd``; stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "edgefuse", "-q", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )


#: Runs ``edgefuse.cli.main`` on each argv in the JSON list ``sys.argv[1]`` in this one process (torch and
#: ExecuTorch are imported once, by the first command), with file descriptors 1 and 2 sent to a file per
#: command, so what torch's loggers and native code print is caught with the rest; writes
#: ``[{code, stdout, stderr}]`` to ``sys.argv[2]``.
COMMANDS = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from edgefuse import cli

    results = []
    for argv in json.loads(sys.argv[1]):
        files = {fd: tempfile.TemporaryFile("w+") for fd in (1, 2)}
        sys.stdout.flush(), sys.stderr.flush()
        saved = {fd: os.dup(fd) for fd in files}
        for fd, f in files.items():
            os.dup2(f.fileno(), fd)
        try:
            code = cli.main(["-q", *argv])
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
        text = {}
        for fd, f in files.items():
            f.seek(0)
            text[fd] = f.read()
        results.append({"code": code, "stdout": text[1], "stderr": text[2]})
    with open(sys.argv[2], "w") as out:
        json.dump(results, out)
    """
)


def run_commands(*argvs: list[str], cwd) -> list[dict]:
    """Each ``edgefuse -q ARGV`` of ``argvs`` in one new process (see COMMANDS): exit code, stdout, stderr."""
    results = cwd / "results.json"
    done = subprocess.run(
        [sys.executable, "-c", COMMANDS, json.dumps(argvs), str(results)],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(results.read_text())


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- bad input, as a user meets it (subprocess) ---------------------------------------------------------

def test_unknown_model_exits_2_and_lists_every_known_name(workdir):
    done = run("report", "tiny-nope", cwd=workdir)
    assert done.returncode == USAGE, done.stderr
    message = last_line(done.stderr)
    assert "unknown model 'tiny-nope'" in message
    for name in MODEL_NAMES:
        assert name in message
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_file_function_that_raises_exits_2_and_says_where(workdir):
    done = run("report", "models.py:raises", cwd=workdir)
    assert done.returncode == USAGE, done.stderr
    message = last_line(done.stderr)
    assert "raises() raised RuntimeError: the checkpoint is not here" in message
    assert "models.py:" in message  # the line it was raised at
    assert "Traceback" not in done.stderr


def test_a_missing_pt2_exits_2(workdir):
    done = run("lower", "missing.pt2", "-o", "out.pte", cwd=workdir)
    assert done.returncode == USAGE, done.stderr
    assert "no such file 'missing.pt2'" in last_line(done.stderr)
    assert not (workdir / "out.pte").exists()


#: Bad input, each with the message its last line on stderr must hold: all exit 2.
BAD_INPUT = {
    "corrupt .pt2": (["report", "corrupt.pt2"], "corrupt.pt2 is not a program saved with torch.export.save"),
    "syntax error": (["report", "syntax.py:build"], "importing syntax.py raised SyntaxError"),
    "-o a directory": (["lower", "models.py:block", "-o", "a_directory.pte"],
                       "cannot write the .pte to a_directory.pte: it is a directory"),
    "--map a directory": (["report", "models.py:block", "--map", "."],
                          "cannot write the delegate map to .: it is a directory"),
    "data-dependent": (["report", "models.py:data_dependent"], "does not export with torch.export"),
    "wrong inputs": (["report", "models.py:wrong_inputs"], "does not export with torch.export"),
    "not in the edge opset": (["report", "models.py:not_in_edge"], "ExecuTorch's to_edge rejects models.py:not_in_edge"),
    "stock does not lower": (["lower", "models.py:not_in_edge", "-o", "inv.pte"],
                             "ExecuTorch's XNNPACK lowering (to_edge_transform_and_lower) rejects this program"),
    "--map over -o": (["lower", "models.py:block", "-o", "same.pte", "--map", "same.pte"],
                      "the delegate map would be written to same.pte, which is also the .pte"),
    "--map over MODEL": (["lower", "block.pt2", "-o", "b.pte", "--map", "block.pt2"],
                         "the delegate map would be written to block.pt2, which is also the MODEL block.pt2"),
    "report --map over MODEL": (["report", "models.py:block", "--map", "models.py"],
                                "which is also the MODEL models.py:block"),
    "--map a hard link to MODEL": (["report", "models.py:block", "--map", "models_link.svg"],
                                   "which is also the MODEL models.py:block"),
    "sys.exit in the function": (["report", "exits.py:leave"], "calling leave() raised SystemExit: 0"),
    "sys.exit on import": (["report", "exits_on_import.py:leave"], "importing exits_on_import.py raised SystemExit: 5"),
    "a directory": (["report", "a_directory.pte"], "unknown model 'a_directory.pte' (a_directory.pte is a directory)"),
    "a .pt2 directory": (["report", "a_directory.pt2"], "a_directory.pt2 is a directory, not a program"),
    "-o .pte": (["lower", "models.py:block", "-o", ".pte"], "name the program before its .pte"),
    "a meta-device model": (["report", "models.py:on_meta"], "norm.weight is on device meta; edgefuse runs models on the CPU"),
    "stock .pte does not load": (["lower", "models.py:rank7", "-o", "rank7.pte"],
                                 "XNNPACK lowering (to_executorch) writes a program the runtime cannot load: "
                                 "RuntimeError: Failed to load method forward, error: 0x:1 (the runtime logged: "
                                 "Failed to define tensor 0 with code: xnn_status_unsupported_parameter;"),
    "bench: stock .pte does not load": (["bench", "models.py:rank7", "--runs", "10"], "the runtime cannot load"),
    "a program saved on the meta device": (["report", "meta.pt2"], "meta.pt2: weight is on device meta"),
    "lower a meta-device model": (["lower", "models.py:on_meta", "-o", "meta.pte"], "is on device meta"),
}
#: A model whose correct output holds -inf: matched infinities are no error, for every command.
MASKED = {
    "masked report": ["report", "models.py:masked"],
    "masked lower": ["lower", "models.py:masked", "-o", "masked.pte"],
    "masked bench": ["bench", "models.py:masked", "--runs", "10", "--warmup", "1"],
}
#: A model with an integer output, at both stages: it must match exactly, and does.
INTEGER_OUTPUT = {
    "edge": ["report", "models.py:integer_output"],
    "capture": ["report", "models.py:integer_output", "--stage", "capture"],
}


@pytest.fixture(scope="module")
def command_results(workdir) -> dict[str, dict]:
    """BAD_INPUT and INTEGER_OUTPUT, run in one process (run_commands), by case name."""
    (workdir / "corrupt.pt2").write_bytes(b"not a zip archive")
    (workdir / "syntax.py").write_text("def build(:\n")
    (workdir / "a_directory.pte").mkdir(exist_ok=True)
    (workdir / "a_directory.pt2").mkdir(exist_ok=True)
    (workdir / "exits.py").write_text("import sys\n\n\ndef leave():\n    sys.exit(0)\n")
    (workdir / "exits_on_import.py").write_text("import sys\n\nsys.exit(5)\n")
    with torch.device("meta"):
        meta, meta_input = torch.nn.Linear(4, 4), torch.randn(1, 4)
    torch.export.save(torch.export.export(meta, (meta_input,)), str(workdir / "meta.pt2"))
    if not (workdir / "models_link.svg").exists():
        os.link(workdir / "models.py", workdir / "models_link.svg")
    cases = {**{name: argv for name, (argv, _) in BAD_INPUT.items()}, **INTEGER_OUTPUT, **MASKED}
    return dict(zip(cases, run_commands(*cases.values(), cwd=workdir)))


def test_bad_input_exits_2_with_a_message_and_no_traceback(workdir, command_results):
    for case, (_, message) in BAD_INPUT.items():
        done = command_results[case]
        assert done["code"] == USAGE, (case, done)
        assert message in last_line(done["stderr"]), (case, done["stderr"])
        assert "Traceback" not in done["stderr"], (case, done["stderr"])
        assert done["stdout"] == "", (case, done["stdout"])
    assert not (workdir / "same.pte").exists() and not (workdir / "b.pte").exists()
    assert (workdir / "block.pt2").read_bytes()[:2] == b"PK" and (workdir / "models.py").read_text() == MODELS_PY
    assert "data-dependent" in command_results["data-dependent"]["stderr"]
    assert "symbolic_shapes" not in command_results["data-dependent"]["stderr"]  # torch's warnings about symbols
    assert "def forward" not in command_results["data-dependent"]["stderr"]  # torch's partial graph dump
    assert "SyntaxError: invalid syntax (syntax.py, line 1)" in command_results["syntax error"]["stderr"]
    assert "linalg_inv" in command_results["not in the edge opset"]["stderr"]
    for case in ("stock .pte does not load", "bench: stock .pte does not load"):  # the runtime's log: in the message
        stderr = command_results[case]["stderr"]
        assert "XNNCompiler" not in stderr.replace(last_line(stderr), ""), stderr
    assert "try --stage capture" in command_results["not in the edge opset"]["stderr"]
    assert not (workdir / "inv.pte").exists()


def test_an_integer_output_must_match_exactly(command_results):
    for case in INTEGER_OUTPUT:
        done = command_results[case]
        assert done["code"] == OK, (case, done)
        assert "Traceback" not in done["stderr"], (case, done["stderr"])
        assert "1 of 1 norms rebuilt" in done["stdout"] and ", within the allowed" in done["stdout"]


def test_an_output_masked_to_minus_infinity_matches_where_eager_has_it(command_results):
    for case in MASKED:
        done = command_results[case]
        assert done["code"] == OK, (case, done["stdout"], done["stderr"])
        assert "nan" not in done["stdout"] and "OUTSIDE" not in done["stdout"], (case, done["stdout"])


# --- the machine form (subprocess) ----------------------------------------------------------------------

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


def test_report_quantize_qnn_says_how_each_norm_was_quantized(workdir):
    # The released QnnQuantizer, built without the SDK: the rebuilt norm is annotated as one op, so it
    # costs one quantize/dequantize pair in, one out and one for its weight, read from the converted graph.
    done = run("report", "models.py:block", "--quantize", "qnn", "--json", cwd=workdir)
    assert done.returncode == OK, done.stderr
    data = json.loads(done.stdout)
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

    svg = workdir / "block.delegates.svg"  # the default: next to the .pte
    root = ET.parse(svg).getroot()
    assert root.tag == f"{SVG}svg"
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    boxes = [g for g in root.iter(f"{SVG}g") if g.get("class") == "delegate"]
    assert boxes and all(g.find(f"{SVG}text").text.startswith("XnnpackBackend #") for g in boxes)
    headers = [t.text for t in root.iter(f"{SVG}text") if t.text and t.text.startswith(("stock:", "edgefuse:"))]
    assert [h.split(":")[0] for h in headers] == ["stock", "edgefuse"]
    assert headers[0].split(",")[0] in stock  # "stock: N delegates" agrees with the printed summary


@pytest.mark.parametrize("stage", ["edge", "capture"])
def test_report_map_lowers_the_export_the_report_read_and_leaves_it_unchanged(workdir, stage, monkeypatch, capsys):
    """``report --map`` exports once: the report's recomposition leaves the exported program as it was,
    so the map drawn from it equals the map of a fresh export."""
    from edgefuse.cli.pte_checks import lower_to_pte

    from edgefuse.cli.modelspec import ModelSpec

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
    # a folded weight stays in the edge program, a constant a delegate takes stays in this one: tests/cli/test_programs.py

    exports.clear()
    path = workdir / f"report-{stage}.svg"
    assert cli.main(["report", f"{workdir / 'models.py'}:block", "--stage", stage, "--map", str(path)]) == OK
    assert len(exports) == 1, capsys.readouterr().out
    assert capsys.readouterr().err.count("] exporting ") == 1  # its progress line, once
    root = ET.parse(path).getroot()
    headers = [t.text for t in root.iter(f"{SVG}text") if t.text and t.text.startswith(("stock:", "edgefuse:"))]
    fresh = [lower_to_pte(resolve(f"{workdir / 'models.py'}:block", torch.float32).export(), how, serialize=False)
             for how in ("stock", "edgefuse")]
    assert [h.split(",")[0] for h in headers] == [
        f"{how}: {lowered.summary.delegates} delegate" + ("s" if lowered.summary.delegates != 1 else "")
        for how, lowered in zip(("stock", "edgefuse"), fresh)], headers


def test_demo_prints_both_tables_fewer_delegates_and_a_map(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "edgefuse", "-q", "demo"], cwd=tmp_path, capture_output=True, text=True,
        timeout=600, env={**os.environ, "TMPDIR": str(tmp_path)},  # the demo writes its map under TMPDIR
    )
    assert done.returncode == OK, done.stderr
    out = done.stdout
    for dtype in ("float32", "float16"):
        assert f"tiny-qwen3 ({dtype}), capture stage, backend qnn: 5 norms" in out
    summaries = [line for line in out.splitlines() if " norms rebuilt, " in line]
    assert len(summaries) == 2 and all(", within the allowed" in line for line in summaries), summaries
    assert out.count("model.model.layers.0.self_attn.q_norm") == 2  # a row in each table
    [counts] = re.findall(r"delegates: (\d+) stock -> (\d+) edgefuse", out)
    assert int(counts[1]) < int(counts[0]), counts
    [path] = re.findall(r"delegate map \(open it in a browser\): (\S+)", out)
    assert path.startswith(str(tmp_path)) and path.endswith(".svg")
    assert ET.parse(path).getroot().tag == f"{SVG}svg"


# --- what a command imports (subprocess: a fresh sys.modules) ---------------------------------------------

def fresh_python(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON object, returned here."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_edgefuse_does_not_import_executorch_and_its_names_still_work():
    data = fresh_python(
        """
        import json, sys
        import edgefuse
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("executorch", "torch"))
        from edgefuse import edge_compile_config, recompose_rms_norm
        names = {name: getattr(edgefuse, name) is not None for name in edgefuse.__all__}
        print(json.dumps({"loaded": loaded, "names": names, "public": recompose_rms_norm.__module__,
                          "config": type(edge_compile_config()).__name__}))
        """
    )
    assert not [m for m in data["loaded"] if m.partition(".")[0] == "executorch"], data["loaded"][:5]
    assert set(data["names"]) >= {"recompose_rms_norm", "edge_compile_config", "Decision", "PROFILES"}
    assert all(data["names"].values())
    assert data["public"] == "edgefuse.recompose" and data["config"] == "EdgeCompileConfig"


def test_import_edgefuse_xnnpack_does_not_import_executorch_and_its_names_still_work():
    """``python -m edgefuse.xnnpack.bench`` imports the package before the command can silence torchao."""
    data = fresh_python(
        """
        import json, sys
        import edgefuse.xnnpack as xnnpack
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("executorch", "torch"))
        import edgefuse.xnnpack.lowering, edgefuse.xnnpack.partitioner  # the submodules, then the names
        from edgefuse.xnnpack import lower
        names = {name: type(getattr(xnnpack, name)).__name__ for name in xnnpack.__all__}
        print(json.dumps({"loaded": loaded, "names": names, "lower": lower.__module__}))
        """
    )
    assert not [m for m in data["loaded"] if m.partition(".")[0] == "executorch"], data["loaded"][:5]
    assert data["names"]["lower"] == "function" and data["lower"] == "edgefuse.xnnpack.lowering"
    assert "module" not in data["names"].values(), data["names"]
    assert set(data["names"]) >= {"EdgefuseXnnpackPartitioner", "SubstituteForXnnpack", "DEFAULT_SINGLE_ROW_POLICY"}


@pytest.mark.parametrize("package", ["edgefuse", "edgefuse.xnnpack", "edgefuse.fuzz"])
def test_no_name_a_package_imports_on_first_use_is_also_its_submodule(package):
    """Importing a submodule binds its name in the package, hiding a public name it shares."""
    import importlib
    import pkgutil

    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert submodules and not set(module._PUBLIC) & submodules


@pytest.mark.parametrize("command", ["edgefuse.xnnpack.bench", "edgefuse.xnnpack.check_models", "edgefuse.fuzz"])
def test_the_module_commands_say_nothing_on_stderr_as_they_import(command):
    """torchao logs two "Failed to load" lines and torch's pytree a deprecation as they are imported;
    a command run with ``python -m`` silences them before its package or its own imports load them."""
    done = subprocess.run([sys.executable, "-m", command, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("usage:"), done.stderr
    assert done.stderr == "", done.stderr


def test_help_and_usage_errors_do_not_import_torch():
    data = fresh_python(
        """
        import contextlib, io, json, sys
        from edgefuse import cli
        codes = []
        for argv in (["--help"], ["demo", "--help"], ["report"], ["lower", "m.py:f", "-o", "out.bin"],
                     ["bench", "m.py:f", "--runs", "3"]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    codes.append(cli.main(argv))
                except SystemExit as exit_:
                    codes.append(exit_.code)
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("executorch", "torch"))
        print(json.dumps({"codes": codes, "loaded": loaded}))
        """
    )
    assert data["codes"] == [OK, OK, USAGE, USAGE, USAGE]
    assert data["loaded"] == []


def test_the_console_script_is_edgefuse_cli_main():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("edgefuse") == "edgefuse.cli:main"
    assert "edgefuse-demo" not in scripts


# --- in-process: every built-in model, the benchmark, the fuzz hand-off ---------------------------------

#: The classes of the norm modules of the built-in models: Hugging Face's ``<Model>RMSNorm``, Mamba2's
#: gated ``MambaRMSNormGated`` and T5's ``T5LayerNorm`` (an RMSNorm by another name).
NORM_CLASSES = ("RMSNorm", "RMSNormGated", "T5LayerNorm")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_built_in_model_reports_every_norm_module_in_float16(name):
    # float16 at the capture stage: the norms round where they compute, which may be a finer or coarser
    # dtype than the outputs' (Mamba2's outputs are float32), so the check's tolerances are exercised.
    spec = resolve(name, torch.float16)
    norms = {path for path, module in spec.module.named_modules() if type(module).__name__.endswith(NORM_CLASSES)}
    assert norms, "the model has no norm module"
    report = build_report(spec, backend="qnn", stage="capture")
    rows = {row.decision.module_path: row for row in report.rows}
    assert not norms - set(rows), f"norm modules without a row: {sorted(norms - set(rows))}"
    for row in report.rows:
        decision = row.decision
        assert decision.rebuilt or (decision.reason and decision.reason != "rebuilt"), decision
        assert decision.module_path, decision  # where the norm is, for every norm of a real model
    assert report.ok, summary_line(report)
    data = to_json(report)
    jsonschema.validate(data, schema(), cls=jsonschema.Draft202012Validator)
    assert data["summary"]["rebuilt"] + data["summary"]["left"] == data["summary"]["norms"]


class TwoInlineNorms(torch.nn.Module):
    """One module that computes two norm-like chains in its own forward (no norm submodules); the second
    averages cubes, so it stays decomposed."""

    def forward(self, x):
        a = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        b = x * torch.rsqrt(x.pow(3).abs().mean(-1, keepdim=True) + 1e-5)
        return a + 2 * b


def test_two_norms_of_one_module_get_rows_and_quantization_facts_of_their_own():
    """They share a module path, so each row names its mean too, says its error is the module's, and is
    matched to its own norm's quantization facts."""
    from edgefuse.cli.modelspec import ModelSpec
    from edgefuse.quant.qnn import quantization_by_norm
    from edgefuse.cli.report import add_quantization, format_report

    module = torch.nn.Sequential(TwoInlineNorms())
    spec = ModelSpec("two-norms", "file", (torch.randn(2, 3, 16),), module=module)
    report = build_report(spec, backend="qnn", stage="capture")
    assert [r.decision.module_path for r in report.rows] == ["0", "0"] and all(r.shared for r in report.rows)
    assert [r.decision.rebuilt for r in report.rows] == [True, False]
    add_quantization(report, "qnn", quantization_by_norm(module, spec.inputs))
    assert [r.quantized.how for r in report.rows] == ["one op", "pieces"], [r.quantized for r in report.rows]
    table = format_report(report)
    for row in report.rows:
        assert f"0 ({row.decision.mean})" in table, table
    assert table.count(" (module)") == 2, table
    assert report.ok, summary_line(report)


def test_report_of_a_saved_program_compares_with_that_program(workdir, capsys):
    assert cli.main(["-q", "report", str(workdir / "block.pt2")]) == OK
    out = capsys.readouterr().out
    assert "block.pt2 (float16), edge stage, backend qnn: 1 norm\n" in out
    assert "1 of 1 norms rebuilt" in out and "max error against program" in out
    # The reference is the saved program, so what to_edge alone changes shows as for the eager model.
    spec = resolve(f"{workdir / 'models.py'}:logsumexp")
    torch.export.save(spec.export(), str(workdir / "logsumexp.pt2"))
    errors = {}
    for model in (f"{workdir / 'models.py'}:logsumexp", str(workdir / "logsumexp.pt2")):
        assert cli.main(["-q", "report", model, "--json"]) == OK
        errors[model] = json.loads(capsys.readouterr().out)["summary"]["unrewritten_max_error"]
    assert len(set(errors.values())) == 1 and next(iter(errors.values())) > 0, errors


def test_lower_and_bench_of_a_saved_program_name_that_program_as_the_reference(workdir, capsys):
    assert cli.main(["-q", "lower", str(workdir / "block.pt2"), "-o", str(workdir / "saved.pte")]) == OK
    out = capsys.readouterr().out
    assert out.count("max error against program") == 2 and "eager" not in out, out
    assert cli.main(["-q", "bench", str(workdir / "block.pt2"), "--runs", "10", "--warmup", "1"]) == OK
    out = capsys.readouterr().out
    assert "err vs program" in out and "eager" not in out, out


def test_a_norm_the_graph_already_holds_as_one_op_is_counted_not_hidden(workdir, capsys):
    # torch.nn.RMSNorm is one aten.rms_norm in the captured graph and decomposed by to_edge.
    model = f"{workdir / 'models.py'}:torch_norm"
    counts = {}
    for stage in ("capture", "edge"):
        assert cli.main(["-q", "report", model, "--stage", stage, "--json"]) == OK
        data = json.loads(capsys.readouterr().out)
        jsonschema.validate(data, schema(), cls=jsonschema.Draft202012Validator)
        counts[stage] = (data["summary"]["norms"], data["summary"]["rebuilt"], data["summary"]["already_one_op"])
    assert counts == {"capture": (0, 0, 1), "edge": (1, 1, 0)}
    assert cli.main(["-q", "report", model, "--stage", "capture"]) == OK
    assert "0 of 0 norms rebuilt, 0 left decomposed, 1 already one rms_norm op;" in capsys.readouterr().out
    assert cli.main(["-q", "report", f"{model}_in_cond", "--stage", "capture"]) == OK  # one inside a branch
    assert "0 of 0 norms rebuilt, 0 left decomposed, 2 already rms_norm ops;" in capsys.readouterr().out


def test_report_says_a_model_without_float_weights_has_none(workdir, capsys):
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:rank7"]) == OK
    assert "models.py:rank7 (no float weights), edge stage, backend qnn: 1 norm\n" in capsys.readouterr().out


def test_bench_alternates_and_prints_ratios(workdir, capsys):
    code = cli.main(["-q", "bench", f"{workdir / 'models.py'}:block", "--runs", "10", "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == OK, out
    assert "10 runs each alternating after 1 warm-up" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("stock ", "edgefuse "))}
    assert set(rows) == {"stock", "edgefuse"}
    assert rows["stock"][-3] == rows["edgefuse"][-3] == "yes"
    # the ratio is edgefuse's median over stock's: printed to 0.1 us and 0.01, so equal within that rounding
    stock, ours, ratio = float(rows["stock"][-2]), float(rows["edgefuse"][-2]), float(rows["edgefuse"][-1])
    assert stock > 0 and ours > 0 and ratio > 0
    assert (ours - 0.05) / (stock + 0.05) - 0.005 <= ratio <= (ours + 0.05) / (stock - 0.05) + 0.005, rows


def test_lower_exits_1_and_says_so_when_the_stock_program_fails_its_check(workdir, monkeypatch, capsys):
    import edgefuse.cli.pte_checks as flows

    real = flows.run_and_check

    def stock_off(lowered, inputs, expected, stock=None, reference="eager"):
        checked = real(lowered, inputs, expected, stock, reference)
        if lowered.how == "stock":
            checked.errors = [e + 1.0 for e in checked.errors]
        return checked

    monkeypatch.setattr(flows, "run_and_check", stock_off)
    code = cli.main(["-q", "lower", f"{workdir / 'models.py'}:block", "-o", str(workdir / "stock_off.pte")])
    out = capsys.readouterr().out
    assert code == CHECK_FAILED, out
    assert out.strip().splitlines()[-1] == "check failed: the stock program differs from eager by more than allowed"


def test_fuzz_hands_its_arguments_over(monkeypatch, capsys):
    seen = []
    module = type(sys)("edgefuse.fuzz")
    module.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "edgefuse.fuzz", module)
    assert cli.main(["fuzz", "--cases", "3", "--help"]) == OK
    assert cli.main(["-q", "fuzz", "--cases", "3"]) == OK
    assert seen == [["--cases", "3", "--help"], ["--quiet", "--cases", "3"]]


def test_fuzz_says_so_when_the_fuzzer_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "edgefuse.fuzz", None)  # import edgefuse.fuzz now raises ImportError
    assert cli.main(["fuzz"]) == UNAVAILABLE
    assert "edgefuse fuzz is unavailable" in capsys.readouterr().err


def test_edgefuse_lowering_missing_is_unavailable_not_a_crash(monkeypatch):
    from edgefuse.cli.stock_and_edgefuse import edgefuse_lower

    monkeypatch.setitem(sys.modules, "edgefuse.xnnpack", None)
    with pytest.raises(Unavailable, match="edgefuse's XNNPACK lowering is unavailable"):
        edgefuse_lower(object())


def test_bad_usage_in_process(workdir, capsys):
    assert cli.main(["report", str(workdir / "models.py")]) == USAGE
    assert "names a file but no function" in capsys.readouterr().err
    assert cli.main(["report", f"{workdir / 'models.py'}:nothere"]) == USAGE
    functions = ("block, counter, data_dependent, integer_output, logsumexp, masked, not_in_edge, on_meta, raises, rank7, "
                 "returns_buffer, stateful, torch_norm, torch_norm_in_cond, with_cond, writes_weight, wrong_inputs")
    assert f"functions defined there: {functions}" in capsys.readouterr().err
    assert cli.main(["report", f"{workdir / 'models.py'}:block", "--backend", "npu9"]) == USAGE
    assert "unknown backend 'npu9'" in capsys.readouterr().err
    assert cli.main(["report", str(workdir / "block.pt2"), "--dtype", "float32"]) == USAGE
    assert "saved program" in capsys.readouterr().err
    assert cli.main(["lower", f"{workdir / 'models.py'}:block", "-o", "out.bin"]) == USAGE
    assert "must end in .pte" in capsys.readouterr().err
    block = f"{workdir / 'models.py'}:block"
    assert cli.main(["bench", block, "--warmup", "-5"]) == USAGE
    assert "--warmup must be 0 or more" in capsys.readouterr().err
    assert cli.main(["bench", block, "--threads", "100000"]) == USAGE  # the runtime would crash on it
    assert f"--threads must be at most {4 * (os.cpu_count() or 1)}" in capsys.readouterr().err
    assert cli.main(["report", block, "--quantize", "qnn", "--stage", "edge"]) == USAGE
    assert "quantizes the captured graph: use --stage capture" in capsys.readouterr().err
    assert cli.main(["report", block, "--quantize", "qnn", "--backend", "aten"]) == USAGE
    assert "rebuilds the norms for the qnn backend" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["report"])  # argparse: MODEL is required
    assert exit_.value.code == USAGE


def test_a_model_that_writes_its_input_or_a_buffer_is_compared_on_fresh_copies(workdir, capsys):
    # every run (eager, both programs, the .pte) sees the inputs and state the first one saw; the input
    # the .pte writes, which the runtime returns before the model's output, is not taken for an output
    for model in ("stateful", "counter", "returns_buffer", "writes_weight"):
        for stage in ("edge", "capture"):
            assert cli.main(["-q", "report", f"{workdir / 'models.py'}:{model}", "--stage", stage]) == OK
            assert "1 of 1 norms rebuilt" in capsys.readouterr().out
        if model == "writes_weight":
            continue  # ExecuTorch's XNNPACK lowering rejects a program that writes a weight it delegates
        assert cli.main(["-q", "lower", f"{workdir / 'models.py'}:{model}", "-o", str(workdir / f"{model}.pte")]) == OK
        assert "wrote" in capsys.readouterr().out


def test_the_demo_refuses_a_map_folder_it_cannot_make_before_any_work(tmp_path, monkeypatch, capsys):
    import tempfile

    (tmp_path / "not-a-folder").write_text("a file where the temporary directory should be")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "not-a-folder"))
    assert cli.main(["-q", "demo"]) == USAGE
    out, err = capsys.readouterr()
    assert "cannot be made" in err and "TMPDIR" in err and "Traceback" not in err
    assert out == ""  # nothing was run


def test_a_model_file_using_torch_cond_exports(workdir, capsys):
    # export re-imports the module of the code it traces: the file's module must be importable by name
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:with_cond"]) == OK
    assert "inside the subgraph" in capsys.readouterr().out


def test_report_quantize_table_has_a_column_for_how_each_norm_was_quantized(workdir, capsys):
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:block", "--quantize", "qnn"]) == OK
    out = capsys.readouterr().out
    assert "quantized for qnn" in out.splitlines()[0]
    assert "quantized as" in out and "one op (rms_norm): 1 pair in, 0 inside, 1 out, 1 constant" in out
    assert out.strip().splitlines()[-1] == (
        "quantized for qnn: 1 of 1 norms as one op; the norms cost 3 quantize/dequantize pairs"
    )


def test_a_mismatch_exits_1(workdir, monkeypatch, capsys):
    import edgefuse.cli.report as report

    real = report.compare

    def off_by_a_lot(reference, actual, ulps=2.0, dtype=None):
        return real(reference, actual + 1.0, ulps, dtype)

    monkeypatch.setattr(report, "compare", off_by_a_lot)
    assert cli.main(["-q", "report", f"{workdir / 'models.py'}:block", "--stage", "capture"]) == CHECK_FAILED
    assert "OUTSIDE the allowed" in capsys.readouterr().out


# --- the parts ------------------------------------------------------------------------------------------

def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(schema())


def test_layers_are_read_from_module_paths():
    assert layer_of("model.model.layers.1.self_attn.q_norm") == "layers.1"
    assert layer_of("model.encoder.block.0.layer.1.layer_norm") == "encoder.block.0"
    assert layer_of("model.model.norm") is None
    assert layer_of("norms.0") is None  # a list of norms is not a list of layers
    assert layer_of(None) is None


def test_the_delegate_map_marks_splits_and_escapes_names():
    from edgefuse.cli.delegate_map import render

    stock = DelegateSummary("stock", [
        Segment("delegate", ["linear"], "XnnpackBackend", 0),
        Segment("outside", ["mean.dim", "_to_dim_order_copy"]),
        Segment("delegate", ["mul.Tensor"], "XnnpackBackend", 1),
    ])
    ours = DelegateSummary("edgefuse <&>", [
        Segment("delegate", ["linear", "xnn_mean"], "XnnpackBackend", 0), Segment("outside", ["gelu"]),
    ])
    assert stock.delegates == 2 and stock.splits == 1 and stock.outside == ["mean.dim", "_to_dim_order_copy"]
    root = ET.fromstring(render([stock, ours], "map"))
    assert root.tag == f"{SVG}svg"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert any(t.startswith("split: 2 ops") for t in texts)
    assert "edgefuse <&>: 1 delegate, 1 op outside, 0 splits" in texts
    assert sum("XnnpackBackend #" in t for t in texts) == 3
