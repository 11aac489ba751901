"""Resolve the MODEL argument of the command line into a module and inputs, or a saved program.

MODEL is one of:

- a built-in name from :data:`edgefuse.inputs.models.MODEL_NAMES` (``tiny-qwen3``, ...), built from a config
  embedded in edgefuse with random weights: nothing is downloaded; or from
  :data:`edgefuse.inputs.qnn_models.QNN_MODEL_NAMES` (ExecuTorch's own Llama, one decoder layer of a tiny
  model: what QNN's flow lowers whole);
- ``path/to/file.py:function``: the function is called with no arguments and returns
  ``(module, example_inputs)``; the module is put in eval mode;
- ``path/to/program.pt2``: a program saved with ``torch.export.save``, run on the example inputs saved
  with it. It is read without running code from it (:mod:`edgefuse.inputs.pt2`): an archive with pickled
  entries, anything else ``torch.export.load`` would execute, or a program calling an operator edgefuse
  does not run from a file (:mod:`edgefuse.inputs.pt2_ops`) is refused unless ``trust_pt2`` says the user
  trusts the file; and it is read, sized and first run within bounds (:mod:`edgefuse.inputs.pt2_bounds`).

Every way this can go wrong raises :class:`~edgefuse.inputs.errors.UsageError` with a message that says what to
fix, so the command line exits 2 instead of printing a traceback.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import logging
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from edgefuse.inputs.errors import UsageError
from edgefuse.runtime.quiet import quiet_torch_logs
from edgefuse.inputs.pt2_bounds import Limits

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ModelSpec:
    """A resolved MODEL: an eager module with inputs, or a saved program (then ``module`` is None)."""

    text: str
    kind: str  # "builtin", "file" or "program"
    inputs: tuple
    module: torch.nn.Module | None = None
    program: ExportedProgram | None = None
    source: str | None = None  # the .py file a file model comes from, to point errors at its lines

    @property
    def name(self) -> str:
        return self.text

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype of the model's first floating-point parameter or buffer, if it has one."""
        tensors: list[torch.Tensor] = []
        if self.module is not None:
            tensors = [*self.module.parameters(), *self.module.buffers()]
        elif self.program is not None:
            tensors = [*self.program.state_dict.values(), *self.program.constants.values()]
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                return t.dtype
        return None

    def export(self) -> ExportedProgram:
        """The model as a ``torch.export`` program: exported here, or the saved one."""
        if self.program is not None:
            return self.program
        captured = io.StringIO()
        try:
            # torch prints the partial graph of a failed export to stderr; the error below says why
            with contextlib.redirect_stderr(captured), quiet_torch_logs():
                program = torch.export.export(self.module, self.inputs)
            if captured.getvalue().strip():  # what torch printed while it exported (its warnings), passed on
                logging.getLogger(__name__).warning("%s", captured.getvalue().rstrip())
            return program
        except Exception as error:
            raise UsageError(
                f"{self.text} does not export with torch.export: {error_summary(error, self.source)}"
            ) from error

    def eager(self, inputs: tuple | None = None) -> Any:
        """The outputs of the eager module (or, for a saved program, of that program) on the inputs, run on
        copies of them with its state put back after, so a model that writes either stays as it was."""
        from edgefuse.core.fresh import fresh, kept_state

        runner = self.module if self.module is not None else self.program.module()
        with torch.no_grad(), kept_state(runner):
            return fresh(runner(*fresh(self.inputs if inputs is None else inputs)))


def dtype_named(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    try:
        return DTYPES[name]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}") from None


def resolve(text: str, dtype: torch.dtype | None = None, seq_len: int = 8, trust_pt2: bool = False,
            limits: Limits = Limits()) -> ModelSpec:
    """The model MODEL names, converted to ``dtype`` when one is given (built-in and file models only);
    ``trust_pt2`` lets a ``.pt2`` run the code it carries (pickled entries), as ``torch.export.load`` would;
    a ``.pt2`` is read and first run within ``limits`` (:mod:`edgefuse.inputs.pt2_bounds`)."""
    if text.endswith(".pt2"):
        if dtype is not None:
            raise UsageError(
                f"{text} is a saved program, whose dtype was fixed when it was exported; drop --dtype, or "
                "export the model again in the dtype you want"
            )
        return _load_program(text, trust_pt2, limits)
    path, function = _split_file_spec(text)
    if path is not None:
        return _call_file(text, path, function, dtype)
    return _builtin(text, dtype, seq_len)


def model_file(text: str) -> str | None:
    """The file MODEL reads (a ``.pt2`` or the ``.py`` of ``file.py:function``), or None for a built-in."""
    if text.endswith(".pt2"):
        return text
    path, sep, _ = text.rpartition(":")
    return path if sep and path.endswith(".py") else None


def _builtin(name: str, dtype: torch.dtype | None, seq_len: int) -> ModelSpec:
    from edgefuse.inputs.models import MODEL_NAMES, build_model
    from edgefuse.inputs.qnn_models import QNN_MODEL_NAMES, build_qnn_model

    if name in QNN_MODEL_NAMES:  # ExecuTorch's Llama, and single decoder layers: models QNN's flow lowers whole
        module, inputs = build_qnn_model(name, dtype=dtype or torch.float32)
        return ModelSpec(name, "builtin", tuple(inputs), module=module)
    if name not in MODEL_NAMES:
        hint = ""
        if os.path.isdir(name):
            hint = f" ({name} is a directory)"
        elif os.path.exists(name):
            hint = f" ({name} is a file: name a function in it as {name}:function, or save a program as .pt2)"
        raise UsageError(
            f"unknown model {name!r}{hint}. MODEL is a built-in name ({', '.join(MODEL_NAMES + QNN_MODEL_NAMES)}), "
            "path/to/file.py:function returning (module, example_inputs), or a program saved with "
            "torch.export.save (.pt2)"
        )
    try:
        module, inputs = build_model(name, dtype=dtype or torch.float32, seq_len=seq_len)
    except ImportError as error:
        raise UsageError(
            f"the built-in models need transformers: pip install 'edgefuse[models]' ({error})"
        ) from error
    return ModelSpec(name, "builtin", tuple(inputs), module=module)


def _split_file_spec(text: str) -> tuple[str | None, str | None]:
    """``("dir/f.py", "build")`` for ``dir/f.py:build``; ``(None, None)`` when ``text`` names no file."""
    path, sep, function = text.rpartition(":")
    if sep and path.endswith(".py"):
        if not function.isidentifier():
            raise UsageError(f"{text!r}: after the ':' comes the name of a function in {path}, got {function!r}")
        return path, function
    if text.endswith(".py"):
        raise UsageError(
            f"{text!r} names a file but no function: write {text}:function, where function() returns "
            "(module, example_inputs)"
        )
    return None, None


def _call_file(text: str, path: str, function: str, dtype: torch.dtype | None) -> ModelSpec:
    if not os.path.isfile(path):
        raise UsageError(f"{text}: no such file {path!r}")
    module_name = "_edgefuse_model_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    spec = importlib.util.spec_from_file_location(module_name, path)
    loaded = importlib.util.module_from_spec(spec)
    directory = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, directory)  # let the file import its neighbours
    sys.modules[module_name] = loaded  # export re-imports the module of code it traces (torch.cond)
    try:
        spec.loader.exec_module(loaded)
    except (Exception, SystemExit) as error:  # a model file's sys.exit must not set edgefuse's exit status
        sys.modules.pop(module_name, None)
        raise UsageError(f"{text}: importing {path} raised {error_summary(error, path)}") from error
    finally:
        if sys.path and sys.path[0] == directory:
            sys.path.pop(0)
    factory = getattr(loaded, function, None)
    if not callable(factory):
        functions = sorted(
            n for n, v in vars(loaded).items()
            if inspect.isfunction(v) and v.__module__ == module_name and not n.startswith("_")
        )
        known = f"; functions defined there: {', '.join(functions)}" if functions else ""
        raise UsageError(f"{text}: {path} has no function {function!r}{known}")
    try:
        result = factory()
    except (Exception, SystemExit) as error:
        raise UsageError(f"{text}: calling {function}() raised {error_summary(error, path)}") from error
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise UsageError(
            f"{text}: {function}() must return (module, example_inputs) with module a torch.nn.Module, "
            f"got {_describe(result)}"
        )
    module, inputs = result
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise UsageError(f"{text}: example_inputs must be a tensor or a tuple of inputs, got {_describe(inputs)}")
    inputs = tuple(inputs)
    off_cpu = _off_cpu([*module.named_parameters(), *module.named_buffers()], inputs)
    if off_cpu:
        raise UsageError(
            f"{text}: {off_cpu}; edgefuse runs models on the CPU, with values: build the module and its "
            "inputs on the CPU (a meta-device module has no values to run or compare)"
        )
    module = module.eval()
    if dtype is not None:
        module = module.to(dtype)
        inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    return ModelSpec(text, "file", inputs, module=module, source=path)


def _off_cpu(named: list[tuple[str, object]], inputs: tuple) -> str | None:
    """Where the first of the named tensors or of the inputs that is not on the CPU lives, or None."""
    leaves, _ = pytree.tree_flatten_with_path(inputs)
    named = [*named, *((f"example input {pytree.keystr(path)}", leaf) for path, leaf in leaves)]
    for name, tensor in named:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
            return f"{name} is on device {tensor.device}"
    return None


def _load_program(path: str, trust: bool = False, limits: Limits = Limits()) -> ModelSpec:
    """The program saved at ``path``: read once (a regular file within ``--max-bytes``), checked and loaded
    (:mod:`edgefuse.inputs.pt2`), then sized and run once on its sample inputs in a child process, all
    within ``--max-seconds``; every refusal a :class:`UsageError` that says why."""
    from edgefuse.inputs.pt2_bounds import ChildFailed, Deadline, OutOfTime, in_child
    from edgefuse.runtime.files import NotARegularFile, TooLarge, read_regular

    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory, not a program saved with torch.export.save")
    if not os.path.exists(path):
        raise UsageError(f"no such file {path!r}: save a program with torch.export.save(program, {path!r})")
    deadline = Deadline(limits.max_seconds)
    try:
        data = read_regular(path, limits.max_bytes, "a saved program", "--max-bytes")
    except (NotARegularFile, TooLarge) as error:
        raise UsageError(f"{path} was not loaded: {error}") from None
    except OSError as error:
        raise UsageError(f"{path} cannot be read: {error.strerror or error}") from None
    from edgefuse.inputs.pt2 import ArchiveError, CodeInArchive, load  # torch's serializer: seconds to import

    try:
        with quiet_torch_logs():
            with deadline.alarm(f"loading {path}"):
                program = load(data, trust_code=trust, limits=limits)
                spec = ModelSpec(path, "program", _sample_inputs(path, program), program=program)
            # once here, in a child killed at the deadline: a program that does not run, or runs past a
            # bound, fails as bad input before any work
            in_child(lambda: _first_run(spec, limits), deadline, f"running {path} on its sample inputs")
    except CodeInArchive as refused:
        loading = "; ".join(str(entry) for entry in refused.entries if not entry.running)
        running = "; ".join(str(entry) for entry in refused.entries if entry.running)
        why = "; and ".join(filter(None, (
            loading and f"torch.export.load would run code it carries: {loading}",
            running and f"running its program would call what edgefuse does not run from a file: {running}")))
        raise UsageError(
            f"{path} was not loaded: {why}. Load it only if you trust where it came from, with --trust-pickled-pt2"
        ) from None
    except ArchiveError as error:
        raise UsageError(f"{path} is not a program saved with torch.export.save: {error}") from None
    except (TooLarge, OutOfTime) as error:
        raise UsageError(f"{path} was not loaded: {error}") from None
    except ChildFailed as failure:
        if failure.kind == "error":
            raise UsageError(f"{path}: the saved program does not run on the inputs saved with it: {failure}") from None
        raise UsageError(f"{path} was not loaded: {failure}") from None
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(f"{path} is not a program saved with torch.export.save: {error_summary(error)}") from error
    return spec


def _sample_inputs(path: str, program: ExportedProgram) -> tuple:
    """The positional sample inputs saved with ``program``, on the CPU with its weights."""
    example = program.example_inputs
    if example is None:
        raise UsageError(
            f"{path} holds no example inputs to run it on; export it with torch.export.export(module, inputs) "
            "and save that program"
        )
    args, kwargs = example
    if kwargs:
        raise UsageError(f"{path}: programs with keyword inputs are not supported; export with positional inputs")
    off_cpu = _off_cpu([*program.state_dict.items(), *program.constants.items()], tuple(args))
    if off_cpu:
        raise UsageError(
            f"{path}: {off_cpu}; edgefuse runs programs on the CPU, with values: export the model with its "
            "parameters and inputs on the CPU (a program saved from meta tensors has no values to run)"
        )
    return tuple(args)


def _first_run(spec: ModelSpec, limits: Limits) -> None:
    """Bound what the saved program makes on its sample inputs (fake tensors: no memory), then run it."""
    from edgefuse.inputs.pt2_bounds import check_sizes

    check_sizes(spec.program, limits)
    spec.eager()


def error_summary(error: BaseException, path: str | None = None) -> str:
    """``Type: message`` of an error, with the line of ``path`` it was raised at when there is one."""
    message = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {message[0] if message else ''}".rstrip(": ")
    if len(message) > 1:
        text += " [...]"
    if path is not None:
        here = os.path.abspath(path)
        frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename) == here]
        if frames:
            text += f" (at {path}:{frames[-1].lineno})"
    return text


def _describe(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value[:4])})"
    return f"a {type(value).__name__}"
