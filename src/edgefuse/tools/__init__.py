"""The measures that are commands of their own (``python -m edgefuse.tools.NAME``): model tables, the
benchmarks that print ratios against stock, and the pass-time comparison. None runs in the test suite.

``python -m`` imports this package before it looks for the tool, so this is where every tool is set to
say what it is about to do as it first imports torch or ExecuTorch, and where a name that is no tool
exits 2 with the list of those that are.
"""

from __future__ import annotations

import importlib.abc
import sys

#: Every tool: what it says it is about to do before it loads torch and ExecuTorch.
TOOLS = {
    "check_models": "checking the tiny models lowered for XNNPACK stock and with edgefuse",
    "llm_check": "checking export_llm's Llama and Qwen3 exported stock and with edgefuse",
    "llm_latency": "exporting ExecuTorch's Llama stock and with edgefuse, then timing both",
    "llm_qnn_check": "checking export_llm's QNN programs on the HTP emulator",
    "pass_time": "timing edgefuse's recomposition beside ExecuTorch's QNN passes",
    "pt2_ops": "listing the operators a .pt2 may call, from this torch's schemas",
    "qnn_check": "lowering the QNN model table stock and with edgefuse",
    "qnn_sweep": "measuring QNN's RmsNorm over a plan of shapes on the HTP emulator",
    "quant": "measuring the quantized flows' tables",
    "scale": "exporting real-size model shapes stock and with edgefuse, each export in a child process",
    "xnnpack_bench": "timing stock against edgefuse XNNPACK programs on mean and RMSNorm workloads",
}

#: The exit code of a name that is no tool: bad usage, as for every command.
USAGE = 2


class ToolFinder(importlib.abc.MetaPathFinder):
    """Consulted for the module ``python -m`` is looking for in this package: sets a tool to announce
    itself, and ends the process with the list of tools for any other name."""

    def find_spec(self, fullname: str, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or fullname.removesuffix(".__main__") not in sys.orig_argv:
            return None  # a module imported on the way, not the one named on the command line
        sys.meta_path.remove(self)
        if name not in TOOLS:
            known = ", ".join(sorted(TOOLS))
            given = f"no tool {name!r}" if name != "__main__" else "give a tool"
            print(f"python -m {__name__}.NAME: {given}; the tools are: {known}", file=sys.stderr)
            raise SystemExit(USAGE)
        announce(name, sys.argv[1:])
        return None


def announce(name: str, argv: list[str]) -> None:
    """Have tool ``name`` say what it is about to do as it first imports torch or ExecuTorch, unless
    ``argv`` asks for help (a tool's module may import them to print its help)."""
    from edgefuse.console.progress import FirstHeavyImport, Progress, asks_for_help
    from edgefuse.runtime.quiet import quiet_libraries

    if asks_for_help(argv):
        return
    quiet_libraries()  # before the libraries load: their import-time warnings say nothing to a user
    FirstHeavyImport(Progress(), f"python -m {__name__}.{name}: {TOOLS[name]}").install()


if sys.argv[:1] == ["-m"]:  # ``python -m`` is looking for a module: this package's, if it asks for one
    sys.meta_path.insert(0, ToolFinder())
