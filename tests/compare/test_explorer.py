"""The Model Explorer overlay: what it says of each instruction, its node ids against the PTE adapter's, its
claims against edgefuse's report, and the page Model Explorer draws with it in a real browser."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edgefuse.compare import explorer
from edgefuse.compare.explorer import HOLDS_NORMS, NORM_OUTSIDE, OUTSIDE, claim, node_data

from tests.optional import INSTALL_CHROMIUM, INSTALL_EXPLORER, installed, require

NORMS = {"layers.0.norm": "left outside (edgefuse: rebuilt for qnn)"}


def test_a_kernel_of_a_norm_is_a_norm_op_outside_with_the_reason():
    said = claim("kernel", "aten::mean.out", frozenset({"", "layers.0", "layers.0.norm"}), NORMS)
    assert said.color == NORM_OUTSIDE
    assert said.value == "norm op outside: aten::mean.out of layers.0.norm: left outside (edgefuse: rebuilt for qnn)"


def test_a_kernel_of_no_norm_is_outside_and_names_its_op():
    assert claim("kernel", "aten::add.out", frozenset({"", "layers.0"}), NORMS) == explorer.Claim(
        "outside: aten::add.out", OUTSIDE)


def test_a_delegate_names_the_norms_whose_ops_it_holds():
    said = claim("delegate", "XnnpackBackend", frozenset({"layers.0.norm", "layers.0.linear"}), NORMS)
    assert (said.value, said.color) == ("delegated (XnnpackBackend): holds ops of layers.0.norm", HOLDS_NORMS)
    assert claim("delegate", "XnnpackBackend", frozenset({"layers.0.linear"}), NORMS).color == explorer.DELEGATED


def test_a_kernel_is_marked_for_the_innermost_norm_it_computes():
    norms = {"block": "outer", "block.norm": "inner"}
    assert claim("kernel", "aten::mean.out", frozenset({"block", "block.norm"}), norms).value.endswith("block.norm: inner")


def test_an_instruction_that_computes_nothing_is_not_claimed():
    assert claim("FreeCall", "", frozenset(), NORMS) is None


def test_node_ids_are_the_adapters_method_chain_and_instruction():
    labels = {"forward": [[("kernel", "aten::mean.out"), ("MoveCall", ""), ("delegate", "XnnpackBackend")],
                          [("kernel", "aten::add.out")]]}
    modules = {"forward": {0: frozenset({"layers.0.norm"}), 2: frozenset({"layers.0.norm"})}}
    data = node_data(labels, modules, NORMS)
    results = data["forward"]["results"]
    assert data["forward"]["name"] == explorer.NAME
    assert sorted(results) == ["forward_0_0", "forward_0_2", "forward_1_0"]
    assert results["forward_0_0"]["bgColor"] == NORM_OUTSIDE
    assert results["forward_0_2"]["bgColor"] == HOLDS_NORMS
    # the emitter's map indexes the first chain: another chain's instruction 0 is not the first chain's
    assert results["forward_1_0"] == {"value": "outside: aten::add.out", "bgColor": OUTSIDE}


def test_the_overlay_goes_beside_the_pte_and_the_command_opens_both():
    assert explorer.overlay_path("out/model.pte") == "out/model.nodedata.json"
    assert explorer.open_command("out/model.pte") == (
        "model-explorer out/model.pte --extensions executorch_extension_model_explorer "
        "--node_data_paths out/model.nodedata.json")
    assert explorer.open_command("my models/a.pte").startswith("model-explorer 'my models/a.pte' --extensions")
    assert explorer.open_command("my models/a.pte").endswith("--node_data_paths 'my models/a.nodedata.json'")


def executorch_call_delegate(lowered, x):
    """A stand-in for ExecuTorch's delegate call: the name is what tells a delegate call apart."""
    return (x,)


def mean_out(x):
    return x


class _Emitted:
    """What :func:`explorer.instruction_modules` reads of an ``ExecutorchProgramManager``: its emitted graph
    and the emitter's map from instruction index to the edge program's debug handles."""

    def __init__(self, graph_module, debug_handle_map):
        self.graph_module, self.debug_handle_map = graph_module, debug_handle_map

    def exported_program(self, method):
        return self

    @staticmethod
    def build():
        """Instruction 0 a delegate holding ``first``'s op, then a getitem whose stale handle is 0 too (the
        emitter leaves a getitem's handle as it was), then instruction 1 a kernel of the edge node with
        debug handle 7."""
        import operator

        import torch.fx

        inner = torch.fx.Graph()
        square = inner.call_function(mean_out, (inner.placeholder("x"),))
        square.meta["nn_module_stack"] = {"L__self__.first": ("L__self__.first", "Norm")}
        inner.output(square)
        lowered = torch.nn.Module()
        lowered.original_module = torch.fx.GraphModule(torch.nn.Module(), inner)

        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        root = torch.nn.Module()
        root.lowered_module_0 = lowered
        call = graph.call_function(executorch_call_delegate, (graph.get_attr("lowered_module_0"), x))
        call.meta["debug_handle"] = 0
        item = graph.call_function(operator.getitem, (call, 0))
        item.meta["debug_handle"] = 0
        kernel = graph.call_function(mean_out, (item,))
        kernel.meta["debug_handle"] = 1
        graph.output(kernel)
        return _Emitted(torch.fx.GraphModule(root, graph), {"forward": {0: [3, 4], 1: 7}})


def test_instruction_modules_reads_delegates_and_kernels_and_skips_getitems():
    modules = explorer.instruction_modules(_Emitted.build(), {"forward": {7: frozenset({"second"})}})
    assert modules == {"forward": {0: frozenset({"first"}), 1: frozenset({"second"})}}


# --- real programs (slow) -----------------------------------------------------------------------------

MODEL_PY = textwrap.dedent(
    '''
    import torch
    from torch import nn


    class Norm(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


    class TwoNorms(nn.Module):
        def __init__(self, width=32):
            super().__init__()
            self.first = Norm(width)
            self.linear = nn.Linear(width, width, bias=False)
            self.second = Norm(width)

        def forward(self, x):
            return self.second(self.linear(self.first(x)))


    def build():
        torch.manual_seed(0)
        return TwoNorms(), (torch.randn(1, 8, 32),)
    '''
)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """``edgefuse report MODEL --json --explorer OUT.pte`` run once: the folder, the report's JSON (stdout,
    alone) and what the command told on stderr."""
    from edgefuse import cli

    folder = tmp_path_factory.mktemp("explorer")
    (folder / "models.py").write_text(MODEL_PY)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["-q", "report", f"{folder / 'models.py'}:build", "--backend", "aten", "--json",
                         "--explorer", str(folder / "two.pte")])
    assert code == 0
    return folder, json.loads(out.getvalue()), err.getvalue()


def _overlay(path: Path) -> dict:
    return json.loads(path.read_text())["forward"]["results"]


@pytest.mark.slow
def test_report_writes_both_programs_and_overlays_and_says_how_to_open_them(reported):
    folder, _, printed = reported
    for name in ("two.pte", "two.stock.pte", "two.nodedata.json", "two.stock.nodedata.json"):
        assert (folder / name).is_file(), name
    assert explorer.open_command(str(folder / "two.pte")) in printed
    assert explorer.open_command(str(folder / "two.stock.pte")) in printed


@pytest.mark.slow
def test_the_overlays_claims_match_the_report(reported):
    """Every mean stock leaves outside is marked as a norm op outside, naming a norm of the report; edgefuse's
    program has none, and each norm of the report is held by a delegate of it."""
    from edgefuse.llm.pte import read_pte

    folder, report, _ = reported
    norms = {row["module_path"] for row in report["norms"]}
    assert norms == {"first", "second"}
    stock = _overlay(folder / "two.stock.nodedata.json")
    marked = [r["value"] for r in stock.values() if r["bgColor"] == NORM_OUTSIDE and "aten::mean" in r["value"]]
    assert len(marked) == read_pte(str(folder / "two.stock.pte")).means == 2
    assert {value.split(" of ")[1].split(":")[0] for value in marked} == norms
    ours = _overlay(folder / "two.nodedata.json")
    assert read_pte(str(folder / "two.pte")).means == 0
    assert not [r for r in ours.values() if r["bgColor"] == NORM_OUTSIDE]
    held = " ".join(r["value"] for r in ours.values() if r["bgColor"] == HOLDS_NORMS)
    assert all(norm in held for norm in norms)


def _adapter():
    """ExecuTorch's PTE adapter for Model Explorer, or a skip that names the install."""
    require("pte_adapter_model_explorer", INSTALL_EXPLORER, "Model Explorer's PTE adapter")
    from pte_adapter_model_explorer.main import PTEAdapter

    return PTEAdapter()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["two.pte", "two.stock.pte"])
def test_the_overlays_node_ids_are_the_adapters(reported, name):
    """Each node the overlay names is a node the adapter draws for that instruction (its label, an op or a
    delegate id, is the one the overlay names), and each op or delegate node the adapter draws has a claim."""
    adapter = _adapter()
    folder, _, _ = reported
    graphs = adapter.convert(str(folder / name), {})["graphCollections"][0].graphs
    labels = {node.id: node.label for graph in graphs if graph.id == "forward" for node in graph.nodes}
    overlay = _overlay(folder / name.replace(".pte", ".nodedata.json"))
    for node_id, result in overlay.items():
        assert node_id in labels, node_id
        assert labels[node_id] in result["value"], (node_id, labels[node_id], result["value"])
    drawn = {i for i, label in labels.items() if "::" in label or label == "XnnpackBackend"}
    assert drawn == set(overlay)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_model_explorer_draws_the_stock_program_with_the_overlay(reported, tmp_path):
    """A real browser opens the stock program with its overlay: the page lists the node data by name and a
    claim, and the graph shows the overlay's colour of a norm op outside."""
    _adapter()
    server = Path(sys.executable).parent / "model-explorer"
    if not installed("playwright") or not server.exists():
        pytest.skip(f"Model Explorer or Playwright is not installed: {INSTALL_EXPLORER}")
    if shutil.which("chromium") is None:
        pytest.skip(f"no Chromium to draw the page in: {INSTALL_CHROMIUM}")
    from playwright.sync_api import sync_playwright

    folder, _, _ = reported
    port = _free_port()
    process = subprocess.Popen(
        [str(server), str(folder / "two.stock.pte"), "--extensions", "executorch_extension_model_explorer",
         "--node_data_paths", str(folder / "two.stock.nodedata.json"), "--host", "127.0.0.1", "--port", str(port),
         "--no_open_in_browser"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = _served_url(process, port)
        shot = tmp_path / "stock.png"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=[
                "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.goto(url, timeout=120_000)
                page.get_by_text("norm op outside", exact=False).first.wait_for(state="attached", timeout=120_000)
                page.wait_for_timeout(3_000)  # the graph's canvas draws after the panel
                page.screenshot(path=str(shot))
                text = page.inner_text("body")
                colours = page.evaluate(_BACKGROUNDS)
                canvas = page.evaluate(_LARGEST_CANVAS)
            finally:
                browser.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, 9)
            process.wait()
    assert explorer.NAME in text
    assert "norm op outside: aten::mean.out of first" in text
    assert _rgb(NORM_OUTSIDE) in colours  # the node data table shows each claim in its colour
    assert canvas >= 200 * 200  # the graph is drawn (on a WebGL canvas)
    assert shot.stat().st_size > 0


def _served_url(process: subprocess.Popen, port: int) -> str:
    """The URL Model Explorer prints once it serves (it carries the model and the overlay in ``?data=``)."""
    deadline = time.monotonic() + 180
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if f"http://127.0.0.1:{port}" in line:
            return line[line.index("http://"):].split()[0]
    raise AssertionError("Model Explorer did not serve:\n" + "".join(seen[-20:]))


#: The background colours of every element of the page, as ``rgb(r, g, b)``.
_BACKGROUNDS = "() => [...new Set([...document.querySelectorAll('*')].map(e => getComputedStyle(e).backgroundColor))]"
#: The area in pixels of the page's largest canvas.
_LARGEST_CANVAS = "() => Math.max(0, ...[...document.querySelectorAll('canvas')].map(c => c.width * c.height))"


def _rgb(colour: str) -> str:
    """``#f4a3a3`` as the browser writes a computed colour: ``rgb(244, 163, 163)``."""
    return "rgb({}, {}, {})".format(*(int(colour[i:i + 2], 16) for i in (1, 3, 5)))
