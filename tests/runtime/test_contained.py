"""A step run in a forked child: its result comes back, and a crash of the child becomes an error that names
the signal, what the child was doing and the last lines it wrote, while this process goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from edgefuse.runtime.contained import Crashed, TimedOut, contained


def test_the_steps_result_comes_back_and_the_child_is_another_process():
    parent = os.getpid()
    assert contained(lambda note: None if os.getpid() != parent else "ran here") is None
    assert contained(lambda note: "a reason it failed") == "a reason it failed"


def _dies_of(number: int):
    def step(note):
        note("loading model.pte")
        os.write(2, b"terminate called after throwing an instance of 'Oops'\n  what():  \x1b[2Jbad bytes\n")
        os.kill(os.getpid(), number)
    return step


@pytest.mark.parametrize("number, name", [(signal.SIGSEGV, "SIGSEGV"), (signal.SIGABRT, "SIGABRT")])
def test_a_child_killed_by_a_signal_is_reported_with_its_last_note_and_words(number, name):
    with pytest.raises(Crashed) as crashed:
        contained(_dies_of(number))
    assert str(crashed.value) == (f"the runtime crashed ({name}) loading model.pte: terminate called after throwing "
                                  "an instance of 'Oops'; what():  \\x1b[2Jbad bytes")


def test_a_child_that_ends_without_a_result_is_reported_with_its_exit_status():
    def step(note):
        note("running model.pte")
        os._exit(3)

    with pytest.raises(Crashed, match=r"^the runtime ended the process \(exit status 3\) running model.pte$"):
        contained(step)


def test_an_exception_in_the_step_is_a_bug_raised_here_with_the_childs_traceback():
    def step(note):
        raise KeyError("not the program's fault")

    with pytest.raises(RuntimeError, match="(?s)the step failed in its child process:\nTraceback.*KeyError"):
        contained(step)


def _python(code: str, *options: str, output=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *options, "-c", textwrap.dedent(code)], stdout=output, stderr=output,
                            text=True)


def test_a_full_disk_in_the_step_is_raised_here_as_the_os_error_it_was_with_its_file():
    """A disk that fills while the child writes is no bug: it comes back as the ``OSError`` (number and file),
    which the command names; any other ``OSError`` stays a bug with the child's traceback."""
    import errno

    def full(note):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/stock.pte")

    with pytest.raises(OSError) as raised:
        contained(full)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, "/out/stock.pte")

    def denied(note):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), "/out/stock.pte")

    with pytest.raises(RuntimeError, match="PermissionError"):
        contained(denied)


def test_a_command_says_what_a_full_disk_kept_it_from_writing_and_exits_2(capsys):
    import errno

    from edgefuse.console.command import run_command
    from edgefuse.inputs.errors import INTERNAL, USAGE

    def full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/stock.pte")

    assert run_command("edgefuse lower", full) == USAGE
    err = capsys.readouterr().err
    assert err == ("edgefuse lower: No space left on device writing /out/stock.pte: free some space, or write "
                   "the output to another disk\n")

    def other():
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    assert run_command("edgefuse lower", other) == INTERNAL
    assert "Traceback" in capsys.readouterr().err


def test_the_last_words_are_the_childs_own_when_pythons_fault_handler_is_on():
    # With python -X faulthandler, the child's dump of its Python frames would otherwise end its stderr.
    command = _python(
        """
        import os
        from edgefuse.runtime.contained import Crashed, contained

        def step(note):
            os.write(2, b"terminate called after throwing an instance of 'Oops'\\n")
            os.abort()

        try:
            contained(step)
        except Crashed as error:
            print(error)
        """, "-X", "faulthandler")
    out, err = command.communicate(timeout=300)
    assert out.strip() == "the runtime crashed (SIGABRT): terminate called after throwing an instance of 'Oops'", err


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie left for its new parent to reap is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel ends the child on Linux only")
def test_the_child_does_not_outlive_the_process_that_started_it(tmp_path):
    said = tmp_path / "child"
    command = _python(
        f"""
        import os, time
        from edgefuse.runtime.contained import contained

        def step(note):
            with open({str(said) + ".new"!r}, "w") as f:
                f.write(str(os.getpid()))
            os.replace({str(said) + ".new"!r}, {str(said)!r})
            time.sleep(300)

        contained(step)
        """, output=subprocess.DEVNULL)  # no pipe the child holds open: the wait below is for the parent alone
    deadline = time.monotonic() + 300
    while not said.exists() and time.monotonic() < deadline and command.poll() is None:
        time.sleep(0.1)
    child = int(said.read_text())
    command.kill()
    command.wait()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    outlived = _running(child)
    if outlived:
        os.kill(child, signal.SIGKILL)  # the test leaves no process behind
    assert not outlived


def test_a_child_still_running_at_its_time_is_killed_and_timed_out(tmp_path):
    said = tmp_path / "child"

    def step(note):
        said.write_text(str(os.getpid()))
        note("running model.pte")
        time.sleep(60)

    with pytest.raises(TimedOut, match=r"^the step did not finish in time \(running model.pte\)$"):
        contained(step, until=time.monotonic() + 1.0)
    child = int(said.read_text())
    outlived = _running(child)  # killed at its time, not left to finish its minute
    if outlived:
        os.kill(child, signal.SIGKILL)  # the test leaves no process behind
    assert not outlived


def test_the_child_runs_torch_on_one_thread_whatever_this_process_uses():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert contained(lambda note: torch.get_num_threads()) == 1
    finally:
        torch.set_num_threads(threads)
