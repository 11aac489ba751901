"""What the runtime logs: its threadpool's set-up lines are dropped and nothing else; a failed call's log goes
into its error, and a call that does not fail writes its log out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from executorch.extension.pybindings import portable_lib

from edgefuse.runtime import LoadedProgram, start_threadpool
from edgefuse.runtime.log import LOG_LINES_IN_ERROR, with_its_log, without_set_up_noise


def _log(line: str) -> None:
    """Write a line as the runtime's bindings do: to sys.stderr, piece by piece, flushing each piece."""
    for piece in (line[:1], line[1:20], line[20:], "\n"):
        sys.stderr.write(piece)
        sys.stderr.flush()


def _probe(fail: bool):
    def create() -> int:
        _log("[cpuinfo_utils.cpp:87] Failed to open midr file /sys/devices/soc0/image_version")
        _log("[threadpool.cpp:70] Invalid threadpool!")  # not set-up noise: it goes through
        if fail:
            raise RuntimeError("no threadpool")
        return 3

    return create


def test_the_threadpools_set_up_lines_are_dropped_and_others_pass(monkeypatch, capsys):
    monkeypatch.setattr(portable_lib, "_threadpool_get_thread_count", _probe(fail=False))
    assert start_threadpool.__wrapped__() == 3
    assert capsys.readouterr().err == "[threadpool.cpp:70] Invalid threadpool!\n"


def test_a_failure_keeps_its_log_and_gives_standard_error_back(monkeypatch, capsys):
    monkeypatch.setattr(portable_lib, "_threadpool_get_thread_count", _probe(fail=True))
    stderr = sys.stderr
    with pytest.raises(RuntimeError, match="no threadpool"):
        start_threadpool.__wrapped__()
    assert sys.stderr is stderr
    assert capsys.readouterr().err == "[threadpool.cpp:70] Invalid threadpool!\n"


def test_another_threads_line_in_the_middle_of_a_set_up_line_goes_through_whole(capsys):
    def other():
        sys.stderr.write("hello from another thread\n")

    with without_set_up_noise():
        for piece in ("[", "cpuinfo_utils.cpp", ":", "87", "] "):  # the runtime's line, held so far
            sys.stderr.write(piece)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        sys.stderr.write("Failed to open midr file /sys/x\n")
    assert capsys.readouterr().err == "hello from another thread\n"


def test_threads_that_start_pools_at_once_give_standard_error_back():
    # sys.stderr is one for the process. Thread b tries to start while a is inside and leaves after it:
    # without a lock, b saves a's stream, a restores the real one, then b restores a's, which stays.
    stderr = sys.stderr
    a_inside, b_trying, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        with without_set_up_noise():
            a_inside.set()
            b_trying.wait(10)
            time.sleep(0.2)  # b is inside by now, unless it waits for a
        a_out.set()

    def b():
        a_inside.wait(10)
        b_trying.set()
        with without_set_up_noise():
            a_out.wait(10)  # b leaves after a

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sys.stderr is stderr


def test_the_real_runtime_logs_nothing_while_edgefuse_starts_its_pool():
    # A fresh process whose sys.stderr is not fd 2, as in a notebook. The runtime's own reset, called
    # after, does log there: its log goes through sys.stderr, where edgefuse drops the set-up lines.
    code = textwrap.dedent(
        """
        import io, sys
        log = io.StringIO()
        sys.stderr = log
        from executorch.extension.pybindings import portable_lib
        from edgefuse.runtime import set_threads, start_threadpool
        start_threadpool()
        set_threads(1)
        held = log.getvalue()
        portable_lib._unsafe_reset_threadpool(1)
        sys.stderr = sys.__stderr__
        print(repr(held), "Resetting threadpool" in log.getvalue()[len(held):])
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    held = done.stdout.strip().splitlines()[-1]
    assert "cpuinfo" not in held and "Resetting" not in held and held.endswith("True"), done.stdout


# --- a call into the runtime keeps its log: in the error when it fails, on stderr when it does not ---------

def _logs_then(result: int | None):
    def step() -> int:
        _log("[method.cpp:1206] Input 0 has unexpected scalar type: expected Float but was Half.")
        if result is None:
            raise RuntimeError("method->set_inputs() for method 'forward' failed with error 0x12")
        return result

    return step


def test_a_failing_call_carries_what_the_runtime_logged_and_prints_nothing(capsys):
    stderr = sys.stderr
    with pytest.raises(RuntimeError) as raised:
        with_its_log(_logs_then(None))
    assert str(raised.value) == (
        "method->set_inputs() for method 'forward' failed with error 0x12 "
        "(the runtime logged: Input 0 has unexpected scalar type: expected Float but was Half)"
    )
    assert sys.stderr is stderr and capsys.readouterr().err == ""


def test_a_call_that_succeeds_writes_its_log_out_and_other_threads_go_straight_through(capsys):
    def step() -> int:
        thread = threading.Thread(target=lambda: sys.stderr.write("hello from another thread\n"))
        thread.start()
        thread.join()
        assert capsys.readouterr().err == "hello from another thread\n"  # not held until the call ends
        return _logs_then(7)()

    assert with_its_log(step) == 7
    logged = capsys.readouterr().err
    assert logged == "[method.cpp:1206] Input 0 has unexpected scalar type: expected Float but was Half.\n"



@pytest.mark.parametrize("raised", [KeyboardInterrupt, ValueError])
def test_an_interrupt_or_an_error_of_another_kind_keeps_its_type_and_writes_the_log_out(raised, capsys):
    def step() -> int:
        _log("[method.cpp:1206] Input 0 has unexpected scalar type: expected Float but was Half.")
        raise raised("stop")

    with pytest.raises(raised, match="^stop$"):
        with_its_log(step)
    logged = capsys.readouterr().err
    assert logged == "[method.cpp:1206] Input 0 has unexpected scalar type: expected Float but was Half.\n"



def test_a_failure_without_a_log_is_raised_as_it_is():
    error = RuntimeError("failed with error 0x12")

    def step() -> int:
        raise error

    with pytest.raises(RuntimeError) as raised:
        with_its_log(step)
    assert raised.value is error

def test_a_long_log_gives_its_last_lines_to_the_error(capsys):
    def step() -> int:
        for i in range(2000):
            _log(f"[tensor_impl.cpp:135] line {i}.")
        raise RuntimeError("failed with error 0x10")

    with pytest.raises(RuntimeError) as raised:
        with_its_log(step)
    last = "; ".join(f"line {i}" for i in range(2000 - LOG_LINES_IN_ERROR, 2000))
    before = 2000 - LOG_LINES_IN_ERROR
    assert str(raised.value) == f"failed with error 0x10 (the runtime logged: {before} lines before; {last})"
    assert capsys.readouterr().err == ""


def test_what_the_runtime_logged_about_a_file_reaches_the_error_escaped(capsys):
    # A name read from a .pte (a delegate's id) that the runtime logs must not move the terminal's cursor.
    def step() -> int:
        _log("[backend.cpp:10] Backend \x1b[2J\u202eEvil is not registered.")
        raise RuntimeError("failed with error 0x14")

    with pytest.raises(RuntimeError) as raised:
        with_its_log(step)
    assert str(raised.value) == ("failed with error 0x14 (the runtime logged: Backend \\x1b[2J\\u202eEvil is not "
                                 "registered)")


def test_a_failed_call_says_why_when_there_is_no_standard_error(monkeypatch):
    monkeypatch.setattr(sys, "stderr", None)  # pythonw, some services
    with pytest.raises(RuntimeError, match="the runtime logged: Input 0 has unexpected scalar type"):
        with_its_log(_logs_then(None))
    assert with_its_log(_logs_then(3)) == 3 and sys.stderr is None

@pytest.mark.slow
def test_the_real_runtime_says_why_a_run_failed_in_the_error(capsys):
    from torch.export import export

    from edgefuse.compare.pte_checks import lower_to_pte
    from edgefuse.xnnpack.inspect import run_pte

    class Mean(torch.nn.Module):
        def forward(self, x):
            return x.mean(-1, keepdim=True)

    pte = lower_to_pte(export(Mean(), (torch.randn(3, 8),)), "stock").pte
    program = LoadedProgram(pte)
    capsys.readouterr()
    why = r"error 0x12 \(the runtime logged: Input 0 has unexpected scalar type: expected Float but was Half\)"
    with pytest.raises(RuntimeError, match=why):
        program.run([torch.randn(3, 8, dtype=torch.float16)])
    with pytest.raises(RuntimeError, match=why):  # check_models runs its programs so
        run_pte(pte, [torch.randn(3, 8, dtype=torch.float16)])
    assert capsys.readouterr().err == ""
    assert program.run([torch.ones(3, 8)])[0].flatten().tolist() == [1.0, 1.0, 1.0]


def test_an_error_the_caller_names_as_explained_carries_the_log_and_keeps_its_type(capsys):
    # A method meta's refusal of a value that is no tensor: an IndexError, after the runtime logs why.
    def step() -> int:
        _log("[method_meta.cpp:246] Tag: 4 output: 1 is not Tensor")
        raise IndexError("Cannot get output tensor meta at 1")

    with pytest.raises(IndexError) as raised:
        with_its_log(step, explained=(IndexError,))
    assert str(raised.value) == "Cannot get output tensor meta at 1 (the runtime logged: Tag: 4 output: 1 is not Tensor)"
    assert capsys.readouterr().err == ""
