"""A program read from a .pt2 calls only the operators of edgefuse.inputs.pt2_ops, and is read and first run
within the bounds of edgefuse.inputs.pt2_bounds.

Operators: each listed one has a schema that allows it, each exception is refused with its reason, and a
program calling anything else (an operator that maps a file and writes it, an endless while_loop, an
in-place write into a parameter) exits 2 naming the node and its target, before any tensor is made.
Bounds: a file that declares or makes too many bytes, nests too deep, would never finish its sizes or its
run, inflates its sample inputs, or is no regular file exits 2 naming the bound, and no file changes (the
time each refusal takes is measured by ``python -m edgefuse.fuzz.refusal_times``); the programs edgefuse's
tests save still load.
"""

from __future__ import annotations

import faulthandler
import importlib
import io
import json
import os
import signal
import threading
import time

import pytest
import torch

from edgefuse import cli
from edgefuse.inputs import modelspec
from edgefuse.inputs import pt2
from edgefuse.inputs import pt2_ops
from edgefuse.inputs.errors import USAGE
from edgefuse.inputs.modelspec import resolve
from edgefuse.inputs.pt2_bounds import DEFAULT_MAX_BYTES, MAX_DEPTH, MAX_RANK, MAX_SUBGRAPH_DEPTH
from edgefuse.fuzz import trust
from edgefuse.fuzz.trust import program_edited
from edgefuse.runtime.files import TooLarge


@pytest.fixture(scope="module", autouse=True)
def namespaces():
    """Every namespace of the lists registered (ExecuTorch's dim_order_ops once executorch.exir loads)."""
    for module in filter(None, pt2_ops.NAMESPACES.values()):
        importlib.import_module(module)


def _target(namespace: str, overload: str) -> str:
    return f"torch.ops.{namespace}.{overload}"


def _listed(table: dict) -> list[tuple[str, str]]:
    return [(namespace, overload) for namespace, overloads in table.items() for overload in sorted(overloads)]


def test_every_listed_operator_has_a_schema_that_allows_it():
    registered = {namespace: set(pt2_ops.registered(namespace)) for namespace in pt2_ops.NAMESPACES}
    assert len(pt2_ops.FUNCTIONAL["aten"]) > 1000 and pt2_ops.FUNCTIONAL["dim_order_ops"]
    for namespace, overload in _listed(pt2_ops.FUNCTIONAL):
        assert overload in registered[namespace], overload
        schema = pt2_ops.operator_schema(namespace, overload)
        assert pt2_ops.schema_refusal(schema, pt2_ops.operator_tags(namespace, overload)) is None, overload
        assert pt2_ops.exception(namespace, overload) is None, overload
    for namespace, overload in _listed(pt2_ops.IN_PLACE):
        assert overload in registered[namespace], overload
        twin = pt2_ops.in_place_twin(pt2_ops.operator_schema(namespace, overload), pt2_ops.FUNCTIONAL[namespace])
        assert twin is not None and pt2_ops.exception(namespace, overload) is None, overload


def test_the_lists_are_what_this_torch_makes_of_the_rule():
    # A torch with other operators fails here (python -m edgefuse.tools.pt2_ops prints its lists), instead of
    # running what was never looked at.
    functional, in_place = pt2_ops.allowed_by_rule()
    assert {n: frozenset(o) for n, o in functional.items()} == pt2_ops.FUNCTIONAL
    assert {n: frozenset(o) for n, o in in_place.items() if o} == pt2_ops.IN_PLACE


def test_the_rule_refuses_what_writes_draws_or_returns_other_than_values():
    def why(overload):
        return pt2_ops.schema_refusal(pt2_ops.operator_schema("aten", overload), pt2_ops.operator_tags("aten", overload))

    assert why("add.Tensor") is None
    assert why("add_.Tensor") == "writes its argument 'self'"
    assert why("add.out") == "writes its argument 'out'"
    assert why("normal.Tensor_float") == "takes a random number generator ('generator')"
    assert why("rand.default") == "draws from the global random number generator"
    assert why("qscheme.default").startswith("returns a QScheme")


def _overloads_named(key: str) -> list[tuple[str, str]]:
    """The registered overloads an exception's key names (a name: every overload of it)."""
    namespace, name = key.split("::")
    if "." in name:
        return [(namespace, name)]
    return [(namespace, o) for o in pt2_ops.registered(namespace) if o.split(".")[0] == name]


@pytest.mark.parametrize("key", sorted(pt2_ops.EXCEPTIONS))
def test_each_exception_is_refused_with_its_reason(key):
    overloads = _overloads_named(key)
    assert overloads, f"{key} names no operator of this torch"
    for namespace, overload in overloads:
        assert pt2._operator_refusal(_target(namespace, overload)) == pt2_ops.EXCEPTIONS[key], overload


def test_every_gradient_kernel_is_refused_as_such():
    kernels = [o for o in pt2_ops.registered("aten") if "backward" in o.split(".")[0]]
    assert len(kernels) > 100
    for overload in kernels:
        if f"aten::{overload.split('.')[0]}" not in pt2_ops.EXCEPTIONS:
            assert pt2._operator_refusal(_target("aten", overload)) == pt2_ops.KINDS["backward"], overload


def test_higher_order_operators_and_arithmetic_on_sizes_are_torch_s_own():
    from torch._export.serde.serialize import _SYM_OPS, GraphModuleSerializer
    from torch._ops import _higher_order_ops

    assert set(pt2_ops.HIGHER_ORDER) <= set(_higher_order_ops)
    assert pt2_ops.SYMBOLIC == {GraphModuleSerializer(None, None).serialize_operator(op) for op in _SYM_OPS}
    assert pt2._operator_refusal("torch.ops.higher_order.cond") is None
    assert "no bound on how often" in pt2._operator_refusal("torch.ops.higher_order.while_loop")
    assert pt2._operator_refusal("torch.ops.higher_order.nope") == "a higher-order operator edgefuse does not know"
    assert pt2._operator_refusal("_operator.add") is None
    assert pt2._operator_refusal("torch.os.system") == "not an operator of torch.ops"


def _node(target: str, **arguments) -> dict:
    return {"target": target, "name": "n", "outputs": [],
            "inputs": [{"name": name, "arg": arg, "kind": 1} for name, arg in arguments.items()]}


@pytest.mark.parametrize("key", sorted(pt2_ops.WHEN))
def test_an_operator_allowed_only_with_an_argument_runs_only_with_it(key):
    namespace, overload = key.split("::")
    argument, value, reason = pt2_ops.WHEN[key]
    schema = pt2_ops.operator_schema(namespace, overload)
    assert argument in [a.name for a in schema.arguments]
    assert pt2_ops.schema_refusal(schema, pt2_ops.operator_tags(namespace, overload)) in (
        None, "draws from the global random number generator")
    target = _target(namespace, overload)
    literal = {"as_bool": value} if isinstance(value, bool) else {"as_float": value}
    other = {"as_bool": not value} if isinstance(value, bool) else {"as_float": 0.5}
    assert pt2._node_refusal(_node(target, **{argument: literal})) is None
    assert reason in pt2._node_refusal(_node(target, **{argument: other}))
    default = next(a.default_value for a in schema.arguments if a.name == argument)
    assert (pt2._node_refusal(_node(target)) is None) == (default == value)  # left out: the schema's default


def _cli(path: str, capsys, *flags: str) -> tuple[int, str]:
    code = cli.main(["-q", "report", path, "--stage", "capture", *flags])
    out, err = capsys.readouterr()
    assert out == "" or code == 0
    return code, err


def _files(folder) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_program_that_maps_a_file_and_writes_it_is_refused_and_the_file_is_untouched(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_bytes(b"A" * 64)
    path = tmp_path / "writes.pt2"
    path.write_bytes(trust.file_writing_archive(str(victim)))
    before = _files(tmp_path)
    code, err = _cli(str(path), capsys)
    assert code == USAGE, err
    assert "node 'ones' calls 'torch.ops.aten.from_file.default'" in err
    assert pt2_ops.EXCEPTIONS["aten::from_file"] in err and "Traceback" not in err
    assert victim.read_bytes() == b"A" * 64 and _files(tmp_path) == before


def test_the_file_writing_program_writes_the_file_in_torch_itself(tmp_path):
    # Without edgefuse's list the same archive writes the bytes its input holds into the file.
    victim = tmp_path / "victim"
    victim.write_bytes(b"A" * 64)
    program = torch.export.load(io.BytesIO(trust.file_writing_archive(str(victim))))
    program.module()(*program.example_inputs[0])
    assert victim.read_bytes() == torch.full((16,), 7.0).numpy().tobytes()


def test_an_endless_while_loop_is_refused_before_it_runs(tmp_path, capsys):
    path = tmp_path / "loop.pt2"
    path.write_bytes(trust.endless_loop_archive())
    before = _files(tmp_path)
    code, err = _cli(str(path), capsys)
    assert code == USAGE, err
    assert "node 'while_loop' calls 'torch.ops.higher_order.while_loop'" in err
    assert pt2_ops.HIGHER_ORDER["while_loop"] in err and _files(tmp_path) == before


def _saved(workdir, name: str) -> str:
    path = str(workdir / f"{name}.pt2")
    if not os.path.exists(path):
        torch.export.save(resolve(f"{workdir / 'models.py'}:{name}").export(), path)
    return path


def test_an_in_place_write_into_a_parameter_is_refused_naming_the_node(workdir, capsys):
    # torch.export keeps the model's in-place ops; writing a weight under no_grad lands in a subgraph.
    code, err = _cli(_saved(workdir, "writes_weight"), capsys)
    assert code == USAGE, err
    assert ("node 'mul_' calls 'torch.ops.aten.mul_.Tensor', which writes in place into the parameter "
            "'p_block_linear_weight'") in err


@pytest.mark.parametrize("name", ["counter", "stateful", "returns_buffer", "with_cond", "torch_norm_in_cond"])
def test_in_place_writes_into_a_buffer_an_input_or_what_the_program_made_still_load(name, workdir):
    spec = resolve(_saved(workdir, name))
    module, inputs = resolve(f"{workdir / 'models.py'}:{name}").module, spec.inputs
    torch.testing.assert_close(spec.eager(), module(*[x.clone() for x in inputs]), rtol=0, atol=0)


def test_a_view_of_a_parameter_written_in_place_is_refused(saved_constant):
    # alias(weight).add_(1): the write goes through a view the program made of a parameter.
    def edit(program):
        nodes = program["graph_module"]["graph"]["nodes"]
        values = program["graph_module"]["graph"]["tensor_values"]
        values["seen"] = values["view_weight"] = values["p_weight"]
        nodes.insert(0, _node("torch.ops.aten.alias.default", self={"as_tensor": {"name": "p_weight"}})
                     | {"name": "view_weight", "outputs": [{"as_tensor": {"name": "view_weight"}}]})
        nodes.insert(1, _node("torch.ops.aten.add_.Scalar", self={"as_tensor": {"name": "view_weight"}},
                              other={"as_int": 1}) | {"name": "write", "outputs": [{"as_tensor": {"name": "seen"}}]})

    entries = trust.records(saved_constant)
    name = next(n for n in entries if n.endswith("models/model.json"))
    program = json.loads(entries[name])
    edit(program)
    entries[name] = json.dumps(program).encode()
    found = pt2.check(trust.zipped(entries))
    assert [str(e) for e in found] == [f"{name.split('/', 1)[1]}: node 'write' calls 'torch.ops.aten.add_.Scalar', "
                                       "which writes in place into the parameter 'p_weight': a program read from "
                                       "a file may write only tensors it made, its buffers and its inputs"]


@pytest.fixture(scope="module")
def saved() -> dict[str, bytes]:
    """The trust measure's small saved programs, exported once for the file."""
    return trust.saved_programs()


@pytest.fixture(scope="module")
def saved_constant(saved) -> bytes:
    return saved["constant-dynamic"]


def test_dropout_that_draws_random_numbers_is_refused(tmp_path, saved):
    data = saved["tiny-llama"]
    entries = trust.records(data)
    name = next(n for n in entries if n.endswith("models/model.json"))
    program = json.loads(entries[name])
    dropouts = [n for n in program["graph_module"]["graph"]["nodes"] if n["target"].endswith(".dropout.default")]
    assert dropouts and pt2.check(data) == []  # eval mode: train=False, allowed
    train = next(i for i in dropouts[0]["inputs"] if i["name"] == "train")
    train["arg"] = {"as_bool": True}
    entries[name] = json.dumps(program).encode()
    [entry] = pt2.check(trust.zipped(entries))
    assert "calls 'torch.ops.aten.dropout.default'" in str(entry) and "here train is True" in str(entry)


def test_a_program_calling_executorch_s_dim_order_ops_still_loads(tmp_path):
    class Copies(torch.nn.Module):
        def forward(self, x):
            return torch.ops.dim_order_ops._to_dim_order_copy.default(x, dtype=torch.float16, dim_order=[0, 1]) * 2

    path = str(tmp_path / "dim_order.pt2")
    torch.export.save(torch.export.export(Copies(), (torch.randn(2, 3),)), path)
    spec = resolve(path)
    torch.testing.assert_close(spec.eager(), Copies()(spec.inputs[0]))


# --- bounds -------------------------------------------------------------------------------------------


def _refused(tmp_path, capsys, data: bytes, *flags: str) -> str:
    """The message of ``edgefuse report`` refusing the archive ``data`` (exit 2, no traceback, no file of
    its folder changed)."""
    path = tmp_path / "model.pt2"
    path.write_bytes(data)
    before = _files(tmp_path)
    code, err = _cli(str(path), capsys, *flags)
    assert code == USAGE, err
    assert "Traceback" not in err and _files(tmp_path) == before
    return err


_TERABYTE = f"{1 << 40:,} bytes, past the bound of {DEFAULT_MAX_BYTES:,} bytes; raise it with --max-bytes"


@pytest.mark.parametrize("flags", [(), ("--trust-pickled-pt2",)])  # trusting its code lifts no bound
def test_a_weight_declared_at_a_terabyte_is_refused_before_it_is_made(flags, tmp_path, capsys, saved_constant):
    # A zero stride lets one stored float stand for 2**38 of them; a copy of the weight would make them all.
    err = _refused(tmp_path, capsys, trust.huge_weight_archive(saved_constant, 1 << 38), *flags)
    assert f"entry 'weight', of shape [{1 << 38}], holds {_TERABYTE}" in err


def test_tensors_declared_each_within_the_bound_are_refused_past_it_together(tmp_path, capsys, saved):
    # Two weights of 3 GiB each (zero strides): each within the 4 GiB bound, not both. The 32 bytes of the
    # sample input (four token ids) are counted first.
    err = _refused(tmp_path, capsys, trust.huge_weight_archive(saved["tiny-llama"], 3 << 28, 2))
    second = _second_weight(saved["tiny-llama"])
    assert (f"the tensors the archive holds, up to data/weights/model_weights_config.json entry "
            f"{second!r}, holds {(6 << 30) + 32:,} bytes, past the bound of {DEFAULT_MAX_BYTES:,} "
            "bytes") in err


def _second_weight(data: bytes) -> str:
    entries = trust.records(data)
    config = json.loads(next(d for n, d in entries.items() if n.endswith("_weights_config.json")))
    return list(config["config"])[1]


def test_a_graph_value_declared_at_a_terabyte_is_refused(tmp_path, capsys, saved_constant):
    def edit(program):
        program["graph_module"]["graph"]["tensor_values"]["x"]["sizes"] = [{"as_int": 1 << 35}, {"as_int": 8}]

    err = _refused(tmp_path, capsys, program_edited(saved_constant, edit))
    assert f"the graph's value 'x', of shape [{1 << 35}, 8], holds {_TERABYTE}" in err


def test_an_operator_that_makes_more_than_its_graph_declares_is_refused_before_it_runs(tmp_path, capsys):
    # The JSON still declares 8 floats for it: the shapes are propagated from the real sample inputs.
    err = _refused(tmp_path, capsys, trust.huge_ones_archive(10 ** 12))
    assert ("the float32 tensor node 'ones' makes (aten.ones.default), of shape [1000000000000], holds "
            "4,000,000,000,000 bytes, past the bound of") in err


def test_what_a_program_makes_in_total_is_bounded(tmp_path, capsys):
    class Chain(torch.nn.Module):
        def forward(self, x):
            y = x.expand(256, 256)  # a view of the input: its 4 bytes, not 256 KB
            for _ in range(4):
                y = y + 1  # 256 KB each
            return y

    buffer = io.BytesIO()
    torch.export.save(torch.export.export(Chain(), (torch.ones(1, 1),)), buffer)
    err = _refused(tmp_path, capsys, buffer.getvalue(), "--max-bytes", "600K")
    assert ("what the program makes on its sample inputs, up to node 'add_2', holds 786,436 bytes, past the "
            "bound of 614,400 bytes; raise it with --max-bytes") in err


@pytest.mark.parametrize("case", ["unbacked-symbol", "power"])
def test_symbolic_sizes_that_would_never_finish_are_refused_in_time(case, tmp_path, capsys, saved_constant):
    def edit(program):
        if case == "unbacked-symbol":  # torch counts up to the symbol's number
            program["range_constraints"]["u1000000000000"] = {"min_val": 0, "max_val": 4}
        else:
            value = program["graph_module"]["graph"]["tensor_values"]["x"]
            value["sizes"][0] = {"as_expr": {"expr_str": "Pow(Integer(9), Integer(999999999))", "hint": None}}

    err = _refused(tmp_path, capsys, program_edited(saved_constant, edit))
    assert ("range_constraints names 'u1000000000000'" if case == "unbacked-symbol"
            else "is not a plain sympy expression") in err


def test_a_program_that_runs_past_its_deadline_is_stopped(tmp_path, capsys):
    # Two 12288 x 12288 matrices expanded from one number: within the byte bound, minutes to multiply.
    err = _refused(tmp_path, capsys, trust.slow_archive(12288), "--max-seconds", "2")
    assert "running" in err and "took more than 2 s, the bound of its load; raise it with --max-seconds" in err


def test_the_deadline_stops_the_checks_too(tmp_path, capsys, saved_constant, monkeypatch):
    check = pt2.check

    def slow_check(data, limits):  # Python that would take half a minute (sympy on a hostile size, say)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pass
        return check(data, limits)

    monkeypatch.setattr(pt2, "check", slow_check)
    err = _refused(tmp_path, capsys, saved_constant, "--max-seconds", "1")
    assert "loading" in err and "took more than 1 s" in err


def test_a_first_run_that_crashes_is_exit_2_naming_the_signal(tmp_path, capsys, saved_constant, monkeypatch):
    # The program runs in a child: a kernel that crashes ends the child, not edgefuse.
    def crash(spec, limits):
        faulthandler.disable()  # pytest's dump of the child's stack is no part of the test
        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(modelspec, "_first_run", crash)
    err = _refused(tmp_path, capsys, saved_constant)
    assert "on its sample inputs ended with SIGSEGV" in err


def test_an_operator_whose_output_size_is_data_is_refused(tmp_path, capsys):
    class Selects(torch.nn.Module):
        def forward(self, x):
            return x[x > 0] * 2

    buffer = io.BytesIO()
    torch.export.save(torch.export.export(Selects(), (torch.randn(8),)), buffer)
    err = _refused(tmp_path, capsys, buffer.getvalue())
    assert "the size of its output depends on the values of its input" in err


@pytest.mark.parametrize("how, reason", [("compressed", "entry 'archive/data.pkl' is compressed"),
                                         ("overlapping", "entry 'archive/data/0' overlaps 'archive/data/1'")])
def test_sample_inputs_whose_zip_would_inflate_are_refused(how, reason, tmp_path, capsys, saved_constant):
    # 256 MB of sample inputs in a few hundred KB (torch.load would make them all).
    data = trust.inflated_inputs_archive(saved_constant, how)
    assert len(data) < 2 << 20
    err = _refused(tmp_path, capsys, data)
    assert f"data/sample_inputs/model.pt: {reason}" in err


def test_a_fifo_as_model_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)

    def writer():  # were it opened to read, this would end the wait (with nothing written)
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader: nothing waits on it
            pass

    guard = threading.Timer(20, writer)
    guard.start()
    try:
        code, err = _cli(str(fifo), capsys)
    finally:
        guard.cancel()
    assert code == USAGE, err
    assert f"{fifo} is a FIFO, not a regular file: a saved program is read from a regular file only" in err


def test_a_device_as_model_is_refused_without_reading_it(tmp_path, capsys):
    (tmp_path / "zero.pt2").symlink_to("/dev/zero")
    code, err = _cli(str(tmp_path / "zero.pt2"), capsys)
    assert code == USAGE, err
    assert "zero.pt2 is a character device, not a regular file" in err


def test_a_file_past_max_bytes_is_refused_naming_the_option(tmp_path, capsys, saved_constant):
    err = _refused(tmp_path, capsys, saved_constant, "--max-bytes", "1K")
    assert f"(a saved program) holds {len(saved_constant):,} bytes, past the bound of 1,024; raise it with --max-bytes" in err


def test_json_nested_past_its_bound_is_refused_before_it_is_parsed(saved_constant):
    nested: list = []
    for _ in range(MAX_DEPTH):
        nested = [nested]
    data = program_edited(saved_constant, lambda program: program.__setitem__("nested", nested))
    with pytest.raises(TooLarge, match=f"models/model.json has JSON nested {MAX_DEPTH + 2}, past edgefuse's fixed bound"):
        pt2.check(data)


def test_subgraphs_nested_past_their_bound_are_refused(saved_constant):
    def edit(program):
        graph = {"inputs": [], "outputs": [], "nodes": []}
        for _ in range(MAX_SUBGRAPH_DEPTH + 1):
            graph = {"inputs": [], "outputs": [], "nodes": [
                _node("torch.ops.higher_order.cond", graph={"as_graph": {"name": "g", "graph": graph}})]}
        program["graph_module"]["graph"]["nodes"] += graph["nodes"]

    with pytest.raises(TooLarge, match=f"a subgraph has nesting depth {MAX_SUBGRAPH_DEPTH + 1}, past"):
        pt2.check(program_edited(saved_constant, edit))


def test_a_tensor_of_a_rank_past_the_bound_is_refused(saved_constant):
    def edit(program):
        program["graph_module"]["graph"]["tensor_values"]["x"]["sizes"] = [{"as_int": 1}] * (MAX_RANK + 1)

    with pytest.raises(TooLarge, match=f"the graph's value 'x' has rank {MAX_RANK + 1}, past"):
        pt2.check(program_edited(saved_constant, edit))


def test_the_bounds_are_options_of_every_command_that_takes_a_model():
    parser = cli.build_parser()
    for command in (["report", "m.pt2"], ["lower", "m.pt2", "-o", "out.pte"], ["bench", "m.pt2"]):
        args = parser.parse_args([*command, "--max-bytes", "512K", "--max-seconds", "2.5"])
        assert (args.max_bytes, args.max_seconds) == (512 << 10, 2.5)
    for bad in (["--max-bytes", "lots"], ["--max-bytes", "0"], ["--max-seconds", "0"]):
        with pytest.raises(SystemExit) as exit:
            parser.parse_args(["report", "m.pt2", *bad])
        assert exit.value.code == USAGE
