"""How long edgefuse takes to refuse each hostile input its trust rules name, measured as a user meets it.

``python -m edgefuse.fuzz.refusal_times [--folder F]`` writes a ``.pt2`` that calls an operator outside the
allowlist, one that declares a terabyte of tensors, one whose symbolic sizes would never finish, and
export-llm configs with a hydra callback, a log file handler and a ``_target_``; it runs ``edgefuse`` on
each in a fresh process (cold: torch and ExecuTorch load as they would for a user) and prints the exit
code, the seconds, the files that changed under the folder and whether the payload's marker appeared. It
also times the check of a config at the size bound, in this process. Tests check each refusal (exit 2,
nothing written, nothing run); times are machine facts, so they are measured here and never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgefuse.llm import config_check

#: The first lines of every config here: a checkpoint that does not exist, so an export that did start
#: would fail at once instead of exporting.
_MISSING_CHECKPOINT = "base:\n  checkpoint: {root}/missing.pth\n"


@dataclass(frozen=True)
class Hostile:
    """One hostile input: its file's name and bytes, and the ``edgefuse`` arguments that read it."""

    what: str
    name: str
    data: bytes
    arguments: tuple[str, ...]


def largest_config() -> str:
    """A config at :data:`~edgefuse.llm.config_check.MAX_CONFIG_BYTES` of the values omegaconf's parser is
    slowest on (long resolver arguments, each string distinct): the check must pass it, and its time is the
    slowest a config within the bound can take."""
    values = [f'    - "${{oc.env:{"a," * 1500}b}}{i}"\n' for i in range(config_check.MAX_CONFIG_BYTES // 3030)]
    return "quantization:\n  calibration_tasks:\n" + "".join(values)


def _symbolic_size(program: dict) -> None:
    meta = next(iter(program["graph_module"]["graph"]["tensor_values"].values()))
    meta["sizes"][0] = {"as_expr": {"expr_str": "9**9**9**9", "hint": {"as_int": 2}}}


def hostile_inputs(root: Path, victim: Path, marker: Path) -> list[Hostile]:
    """The inputs issue #25's measure names, aimed at ``victim`` (a file the user owns) and ``marker`` (a
    file a payload that ran would make)."""
    from edgefuse.fuzz import trust

    base = trust.saved_programs()["constant-dynamic"]
    missing = _MISSING_CHECKPOINT.format(root=root)
    output = f"export.output_name={root / 'out' / 'model.pte'}"
    configs = {
        "config with a hydra callback": (
            f"hydra:\n  callbacks:\n    spawn:\n      _target_: distutils.spawn.spawn\n"
            f"      cmd: [sh, -c, \"touch {marker}\"]\n"),
        "config with a log file handler": (
            f"hydra:\n  job_logging:\n    handlers:\n      file:\n        filename: {victim}\n        mode: w\n"),
        "config with a _target_": f"model:\n  _target_: os.system\n  command: touch {marker}\n",
    }
    programs = {
        "op outside the allowlist (aten.from_file)": trust.file_writing_archive(str(victim)),
        "a terabyte of declared tensors": trust.huge_weight_archive(base, 1 << 38),
        "symbolic sizes that never finish": trust.program_edited(base, _symbolic_size),
    }
    found = [Hostile(what, f"program{i}.pt2", data, ("report", str(root / f"program{i}.pt2")))
             for i, (what, data) in enumerate(programs.items())]
    found += [Hostile(what, f"config{i}.yaml", (text + missing).encode(),
                      ("export-llm", "--config", str(root / f"config{i}.yaml"), output))
              for i, (what, text) in enumerate(configs.items())]
    return found


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefuse.fuzz.refusal_times", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", help="where to write the hostile files (default: a new temporary folder)")
    parser.add_argument("--only", default="", metavar="TEXT", help="only the inputs whose description holds TEXT")
    args = parser.parse_args(argv)
    from edgefuse.runtime.quiet import quiet_libraries

    quiet_libraries()  # before building the files imports torch and torchao: their warnings are not a refusal's
    root = Path(args.folder or tempfile.mkdtemp(prefix="edgefuse-refusals-")).resolve()
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    victim, marker = root / "victim.txt", root / "MARKER"
    victim.write_text("the user's own file\n")
    print(f"refusal times: writing the hostile files in {root}", flush=True)
    inputs = [h for h in hostile_inputs(root, victim, marker) if args.only in h.what]
    print(f"{'input':44} {'exit':>4} {'seconds':>8}  changed  code ran  message", flush=True)
    worst = 0
    for hostile in inputs:
        (root / hostile.name).write_bytes(hostile.data)
        before = _snapshot(root)
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "edgefuse", *hostile.arguments], cwd=work,
                             capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        seconds = time.monotonic() - start
        changed = [name for name, digest in _snapshot(root).items() if before.get(name) != digest]
        ok = run.returncode == 2 and not changed and not marker.exists()
        worst = max(worst, 0 if ok else 1)
        print(f"{hostile.what:44} {run.returncode:>4} {seconds:8.1f}  {len(changed):>7}  "
              f"{'yes' if marker.exists() else 'no':>8}  {_last_line(run.stderr)[:110]}", flush=True)
    path = root / "largest.yaml"
    path.write_text(largest_config())
    start = time.monotonic()
    config_check.read_config(str(path))
    print(f"a config at the size bound ({path.stat().st_size:,} bytes) checked in this process in "
          f"{time.monotonic() - start:.1f} s", flush=True)
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average), {os.cpu_count()} CPUs", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())
