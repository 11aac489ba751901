"""Finding, setting up and loading the QNN libraries (edgefuse.qnn.sdk), and its clear errors."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from edgefuse.qnn import sdk as qnn_sdk_module
from edgefuse.qnn.sdk import (
    HOST_DIR,
    LIBRARIES,
    MANIFEST,
    REAL_DIR,
    RUNTIME_DIR,
    Absent,
    QnnSdkUnavailable,
    QnnSdkUnsafe,
    Sdk,
    default_root,
    ensure_in_process,
    find,
    setup,
)


@pytest.fixture
def no_sdk(monkeypatch, tmp_path):
    """A user with no QNN SDK: an empty cache folder and no QNN_SDK_ROOT."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    return tmp_path


@pytest.fixture
def x86_64_linux(monkeypatch):
    """The platform check passed, for tests of the steps after it on any machine."""
    monkeypatch.setattr(qnn_sdk_module, "check_platform", lambda: None)


@pytest.fixture
def a_c_compiler(monkeypatch):
    """The compiler check passed, for tests of the steps after it on a machine without one."""
    monkeypatch.setattr(qnn_sdk_module, "c_compiler", lambda: "cc")


def test_the_default_root_is_in_the_users_cache_folder(no_sdk):
    assert default_root() == no_sdk / "cache" / "edgefuse" / "qnn" / qnn_sdk_module.QNN_VERSION


def test_nothing_set_up_is_absent_and_names_the_command(no_sdk):
    found = find()
    assert isinstance(found, Absent) and not found
    assert "edgefuse qnn setup" in found.reason


def test_a_qnn_sdk_root_without_the_htp_library_is_absent(no_sdk, monkeypatch):
    monkeypatch.setenv("QNN_SDK_ROOT", str(no_sdk))
    found = find()
    assert not found and "libQnnHtp.so" in found.reason and "edgefuse qnn setup" in found.reason


def test_a_users_qnn_sdk_root_is_taken_as_it_is(no_sdk, monkeypatch):
    (no_sdk / HOST_DIR).mkdir(parents=True)
    (no_sdk / HOST_DIR / "libQnnHtp.so").write_bytes(b"")
    monkeypatch.setenv("QNN_SDK_ROOT", str(no_sdk))
    assert find() == Sdk(no_sdk, "QNN_SDK_ROOT")


def test_an_unfinished_set_up_is_not_taken_as_done(no_sdk, x86_64_linux, a_c_compiler):
    """Libraries without the manifest (written last) are an unfinished set-up: not found, and a new
    set-up refuses to build into it rather than mix old and new files."""
    root = default_root()
    (root / HOST_DIR).mkdir(parents=True)
    (root / HOST_DIR / "libQnnHtp.so").write_bytes(b"")
    found = find()
    assert not found and "unfinished" in found.reason
    with pytest.raises(QnnSdkUnavailable, match="no finished QNN set-up"):
        setup()


def test_not_x86_64_linux_is_a_clear_error(no_sdk, monkeypatch):
    monkeypatch.setattr(qnn_sdk_module.platform, "machine", lambda: "aarch64")
    with pytest.raises(QnnSdkUnavailable, match="x86_64 Linux only; this is Linux aarch64"):
        setup(no_sdk / "root")
    assert not (no_sdk / "root").exists()


def test_no_c_compiler_is_a_clear_error(no_sdk, x86_64_linux, monkeypatch):
    empty = no_sdk / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(QnnSdkUnavailable, match="no C compiler"):
        setup(no_sdk / "root")
    assert not (no_sdk / "root").exists()


def test_an_unreachable_registry_is_a_clear_error(no_sdk, x86_64_linux, a_c_compiler, monkeypatch):
    """pip pointed at a registry that refuses connections, with no configuration, links or cache."""
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "5")
    with pytest.raises(QnnSdkUnavailable, match="pip could not download onnxruntime-qnn==2.7.0"):
        setup(no_sdk / "root")
    assert not (no_sdk / "root").exists()
    assert not list(qnn_sdk_module.wheel_folder().iterdir())  # no partial download left


def _linked_layout(source: Path):
    """Stand-ins for unpacking the wheel and compiling the wrapper that link the libraries of an
    existing set-up instead, with QNN's own libQnnHtp.so where the wrapper would be."""

    def lay_out(wheel, root):
        for folder in (REAL_DIR, RUNTIME_DIR):
            (root / folder).parent.mkdir(parents=True, exist_ok=True)
            (root / folder).symlink_to(source / folder)
        (root / HOST_DIR).mkdir(parents=True)
        for name in LIBRARIES:
            if name != "libQnnHtp.so":
                (root / HOST_DIR / name).symlink_to(Path("..", REAL_DIR.name, name))

    def build_wrapper(root, compiler=None):
        target = root / HOST_DIR / "libQnnHtp.so"
        target.symlink_to(Path("..", REAL_DIR.name, "libQnnHtp.so"))
        return target

    return lay_out, build_wrapper


@pytest.mark.slow
def test_without_the_wrapper_the_self_check_fails_with_qnns_log(edgefuse_sdk, monkeypatch, tmp_path, capsys):
    """QNN 2.51's own libQnnHtp.so, given ExecuTorch 1.5.1's device config, cannot create the HTP
    device: ``edgefuse qnn setup`` exits with 3 and QNN's own error lines, and leaves nothing behind."""
    from edgefuse.cli import main
    from edgefuse.inputs.errors import UNAVAILABLE

    lay_out, build_wrapper = _linked_layout(edgefuse_sdk.root)
    monkeypatch.setattr(qnn_sdk_module, "lay_out", lay_out)
    monkeypatch.setattr(qnn_sdk_module, "build_wrapper", build_wrapper)
    wheel = tmp_path / "any.whl"
    wheel.write_bytes(b"")
    assert main(["-q", "qnn", "setup", str(tmp_path / "root"), "--wheel", str(wheel)]) == UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("edgefuse qnn setup: the QNN self-check failed: lowering failed")
    assert "unknown custom config socModel 0" in err and "Failed to create device_handle" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["any.whl"]


def test_a_set_up_is_laid_out_as_an_sdk_root(edgefuse_sdk):
    root = edgefuse_sdk.root
    wrapper = root / HOST_DIR / "libQnnHtp.so"
    assert wrapper.is_file() and not wrapper.is_symlink()
    elf = subprocess.run(["readelf", "-d", str(wrapper)], capture_output=True, text=True).stdout
    assert "Library soname: [libQnnHtp.so]" in elf and "NODELETE" in elf
    for name in LIBRARIES:
        assert (root / REAL_DIR / name).is_file()
        if name != "libQnnHtp.so":  # relative links: the folder can be moved
            assert os.readlink(root / HOST_DIR / name) == str(Path("..", REAL_DIR.name, name))
    assert any(p.name.startswith("libc++") for p in (root / RUNTIME_DIR).iterdir())
    manifest = qnn_sdk_module.read_manifest(root)
    assert manifest["qnn_version"] == qnn_sdk_module.QNN_VERSION and manifest["self_check"]["ok"]
    assert edgefuse_sdk.environment() == {"QNN_SDK_ROOT": str(root), "LD_LIBRARY_PATH": str(root / HOST_DIR)}


def test_a_second_set_up_reuses_the_first(edgefuse_sdk):
    files = sorted(edgefuse_sdk.root.rglob("*"))
    before = [(p, p.lstat().st_mtime_ns) for p in files]
    sdk, new = setup(edgefuse_sdk.root)
    assert not new and sdk.root == edgefuse_sdk.root
    assert [(p, p.lstat().st_mtime_ns) for p in sorted(edgefuse_sdk.root.rglob("*"))] == before


def test_one_process_uses_one_qnn_sdk(qnn_sdk, tmp_path):
    assert ensure_in_process(qnn_sdk) == qnn_sdk  # again: nothing changes
    with pytest.raises(QnnSdkUnavailable, match="already uses the QNN libraries"):
        ensure_in_process(Sdk(tmp_path, "argument"))
    assert os.environ["QNN_SDK_ROOT"] == str(qnn_sdk.root)


def test_the_libraries_are_loaded_where_executorch_opens_them_by_name(qnn_sdk):
    """ExecuTorch opens libQnnHtp.so and libQnnSystem.so by name; in this process (started without
    LD_LIBRARY_PATH naming them) that finds the ones ensure_in_process loaded."""
    import ctypes

    for name in LIBRARIES:
        ctypes.CDLL(name, mode=os.RTLD_LOCAL | os.RTLD_NOW | os.RTLD_NOLOAD)  # raises if not loaded


@pytest.mark.slow
def test_the_wrapper_built_from_this_source_passes_the_self_check(pinned_libraries, tmp_path):
    """The C source as it is now, compiled against the set-up's real QNN libraries: one RmsNorm
    compiles on QNN and matches eager on the emulator (a wrapper that passed ExecuTorch's configs on
    unmoved would fail here with "unknown custom config socModel 0"). It runs even when the set-up's
    wrapper was built from another source, which the other tests then skip as not set up."""
    lay_out, _ = _linked_layout(pinned_libraries)
    root = tmp_path / "root"
    root.mkdir()
    lay_out(None, root)
    qnn_sdk_module.build_wrapper(root)
    check = qnn_sdk_module.self_check(root)
    assert check.ok, f"{check.detail}; QNN logged: {qnn_sdk_module.qnn_log_lines(check.log)}"


def _planted(root: Path, **changes) -> Path:
    """A folder laid out as a finished set-up of this edgefuse (empty files for libraries), with
    ``changes`` made to its manifest."""
    for folder in (HOST_DIR, REAL_DIR, RUNTIME_DIR):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        (root / REAL_DIR / name).write_bytes(b"")
        (root / HOST_DIR / name).write_bytes(b"")
    (root / RUNTIME_DIR / "libc++.so.1").write_bytes(b"")
    manifest = {
        "package": qnn_sdk_module.PACKAGE, "package_version": qnn_sdk_module.PACKAGE_VERSION,
        "qnn_version": qnn_sdk_module.QNN_VERSION, "wheel_sha256": qnn_sdk_module.WHEEL_SHA256,
        "layout": qnn_sdk_module.LAYOUT_VERSION, "wrapper_sha256": qnn_sdk_module.wrapper_sha256(),
        "compiler": "cc", "self_check": {"ok": True, "detail": "planted"},
    }
    manifest.update(changes)
    (root / MANIFEST).write_text(json.dumps(manifest))
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def test_a_planted_set_up_of_this_user_is_found(no_sdk):
    """The stand-in the next tests spoil: as planted, it is taken."""
    root = _planted(no_sdk / "root")
    assert find(root) == Sdk(root, "argument")


@pytest.mark.parametrize("spoil, reason", [
    (lambda root: os.chown(root, 65534, 65534), "root belongs to another user (uid 65534)"),
    (lambda root: os.chown(root / MANIFEST, 65534, 65534), "edgefuse-qnn.json belongs to another user (uid 65534)"),
    (lambda root: os.chown(root / REAL_DIR / "libQnnHtp.so", 65534, 65534), "libQnnHtp.so belongs to another user (uid 65534)"),
    (lambda root: root.chmod(0o777), "root can be written by other users (mode 777)"),
    (lambda root: (root / RUNTIME_DIR / "libc++.so.1").chmod(0o666), "libc++.so.1 can be written by other users (mode 666)"),
    (lambda root: (root / HOST_DIR).chmod(0o775), "x86_64-linux-clang can be written by other users (mode 775)"),
])
def test_a_set_up_another_user_could_have_written_is_not_loaded(no_sdk, x86_64_linux, a_c_compiler, spoil, reason):
    """A set-up whose folder, manifest or libraries another user owns or may write could hold anyone's
    code: find() says why instead of returning it, and setup() refuses it (QnnSdkUnsafe: exit 2) with the
    reason, touching nothing."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root; run the QNN tier as root to test it")
    root = _planted(no_sdk / "root")
    spoil(root)
    found = find(root)
    assert not found and found.unsafe and reason in found.reason and "edgefuse loads no library" in found.reason
    with pytest.raises(QnnSdkUnsafe, match=re.escape(reason)):
        setup(root)
    assert (root / MANIFEST).is_file()


@pytest.mark.parametrize("changes, reason", [
    ({"wheel_sha256": "0" * 64}, "is not the pinned one (wheel_sha256 '000"),
    ({"qnn_version": "2.37.0"}, "is not the pinned one (qnn_version '2.37.0', not '2.51.0')"),
    ({"self_check": {"ok": False, "detail": "planted"}}, "failed its self-check"),
])
def test_a_set_up_of_other_pins_is_not_loaded(no_sdk, x86_64_linux, a_c_compiler, changes, reason):
    root = _planted(no_sdk / "root", **changes)
    found = find(root)
    assert not found and reason in found.reason
    with pytest.raises(QnnSdkUnavailable, match=re.escape(reason)):
        setup(root)


@pytest.mark.parametrize("changes", [{"wrapper_sha256": "0" * 64}, {"layout": 1}, {"layout": None, "wrapper_sha256": None}])
def test_a_set_up_built_from_another_wrapper_source_is_rebuilt(no_sdk, x86_64_linux, a_c_compiler, monkeypatch, changes):
    """A set-up built from another htp_device_config.c or layout (or before they were recorded) is
    not found, and setup() rebuilds it in its place, recording the current source's hash."""
    root = _planted(no_sdk / "root", **changes)
    found = find(root)
    assert not found and "must be rebuilt" in found.reason and "edgefuse qnn setup" in found.reason

    def lay_out(wheel, scratch):
        _planted(scratch)
        (scratch / MANIFEST).unlink()

    monkeypatch.setattr(qnn_sdk_module, "lay_out", lay_out)
    monkeypatch.setattr(qnn_sdk_module, "build_wrapper", lambda scratch, compiler=None: scratch / HOST_DIR / "libQnnHtp.so")
    monkeypatch.setattr(qnn_sdk_module, "self_check", lambda scratch: qnn_sdk_module.SelfCheck(True, "rebuilt"))
    wheel = no_sdk / "any.whl"
    wheel.write_bytes(b"")
    sdk, new = setup(root, wheel=wheel)
    assert new and sdk == Sdk(root, "argument") and sdk.source == "argument"
    assert sdk.manifest["wrapper_sha256"] == qnn_sdk_module.wrapper_sha256()
    assert sdk.manifest["layout"] == qnn_sdk_module.LAYOUT_VERSION
    assert find(root) == sdk and find(root).manifest["self_check"]["detail"] == "rebuilt"
    assert sorted(p.name for p in no_sdk.iterdir()) == ["any.whl", "root"]  # the old one is gone


def test_scratch_folders_of_interrupted_set_ups_are_removed(no_sdk, x86_64_linux, monkeypatch):
    """This user's scratch folders older than an hour go at the next set-up; a recent one (a set-up
    running now) and another user's stay."""
    stale, recent, others = (no_sdk / f".root.partial-{name}" for name in ("stale", "recent", "others"))
    for folder in (stale, recent, others):
        (folder / "lib").mkdir(parents=True)
    two_hours_ago = time.time() - 7200
    for folder in (stale, others):
        os.utime(folder, (two_hours_ago, two_hours_ago))
    if os.geteuid() == 0:
        os.chown(others, 65534, 65534)
    monkeypatch.setenv("PATH", str(no_sdk / "no-bin"))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(QnnSdkUnavailable, match="no C compiler"):
        setup(no_sdk / "root")
    assert not stale.exists() and recent.exists()
    assert others.exists() or os.geteuid() != 0


@pytest.mark.parametrize("make, reason", [
    (lambda dir: dir.write_text("a file\n"), "is not a folder"),
    (lambda dir: dir.symlink_to(dir.parent), "is a symbolic link"),
    (lambda dir: dir.symlink_to(dir.parent / "nowhere"), "is a symbolic link"),
    (lambda dir: dir.parent.joinpath("file").write_text(""), "file is not a folder, so"),
])
def test_a_dir_that_cannot_hold_a_set_up_is_a_clear_error_before_any_slow_step(no_sdk, monkeypatch, capsys, make, reason):
    """``edgefuse qnn setup DIR`` with a file, a link (dangling or not) or a path below a file: exit 3
    with the reason, before the platform check and everything after it."""
    from edgefuse.cli import main
    from edgefuse.inputs.errors import UNAVAILABLE

    def slow_work():
        raise AssertionError("the set-up went on past its folder's check")

    monkeypatch.setattr(qnn_sdk_module, "check_platform", slow_work)
    target = no_sdk / "dir"
    make(target)
    if reason.startswith("file"):
        target = no_sdk / "file" / "dir"
    assert main(["-q", "qnn", "setup", str(target)]) == UNAVAILABLE
    err = capsys.readouterr().err
    assert err.startswith("edgefuse qnn setup: ") and reason in err and "Traceback" not in err


def test_qnns_harmless_option_66_line_is_left_out_of_its_log_lines():
    log = (
        "[INFO] [Qnn ExecuTorch]: Running level=3 optimization.\n"
        "[ERROR] [Qnn ExecuTorch]:  <E> unexpected GraphHtpSettings option 66\n"
        "[ERROR] [Qnn ExecuTorch]:  <E> Failed to create device_handle\n"
    )
    assert qnn_sdk_module.qnn_log_lines(log) == "[ERROR] [Qnn ExecuTorch]:  <E> Failed to create device_handle"


def test_qnns_info_lines_are_left_out_of_its_log_lines():
    """INFO lines say what ran, not why it failed: without an error line, only the warnings are quoted."""
    log = (
        "[INFO] [Qnn ExecuTorch]: Running level=3 optimization.\n"
        "INFO:root:Qnn partitioner: 12 nodes supported\n"
        "[WARNING] [Qnn ExecuTorch]: QnnDsp <W> a warning\n"
        "[INFO] [Qnn ExecuTorch]: Destroy Qnn context\n"
    )
    assert qnn_sdk_module.qnn_log_lines(log) == "[WARNING] [Qnn ExecuTorch]: QnnDsp <W> a warning"
    assert qnn_sdk_module.qnn_log_lines("[INFO] [Qnn ExecuTorch]: Destroy Qnn context\n") == ""


# --- a library another user could have written is never loaded ------------------------------------------

PLANTED_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>

/* Runs when the library is loaded: leaves a file where EDGEFUSE_PLANTED_MARKER says. */
__attribute__((constructor)) static void planted(void) {
  const char *marker = getenv("EDGEFUSE_PLANTED_MARKER");
  FILE *f = marker ? fopen(marker, "w") : NULL;
  if (f) fclose(f);
}
"""


@pytest.fixture(scope="module")
def planted_library(tmp_path_factory) -> Path:
    """A shared library whose constructor writes a marker file: loading it leaves a trace."""
    folder = tmp_path_factory.mktemp("planted")
    source, library = folder / "planted.c", folder / "libplanted.so"
    source.write_text(PLANTED_SOURCE)
    subprocess.run([qnn_sdk_module.c_compiler(), "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def _planted_sdk(root: Path, library: Path) -> Path:
    """A QNN SDK root as a user's own would be (no manifest of edgefuse's) holding ``library`` as both QNN
    libraries, every part of it writable by this user alone."""
    (root / HOST_DIR).mkdir(parents=True)
    for name in LIBRARIES:
        (root / HOST_DIR / name).write_bytes(library.read_bytes())
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755)
    return root


def _load_in_a_child(sdk: str, marker: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``ensure_in_process(Sdk(sdk, "argument"))`` in a new process: what it says, and whether the planted
    library ran (``marker``)."""
    code = (
        "import sys; from pathlib import Path\n"
        "from edgefuse.qnn.sdk import QnnSdkUnavailable, Sdk, ensure_in_process\n"
        "try:\n"
        f"    ensure_in_process(Sdk(Path({sdk!r}), 'argument'))\n"
        "except QnnSdkUnavailable as error:\n"
        "    sys.exit(f'refused ({type(error).__name__}): {error}')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {}), "EDGEFUSE_PLANTED_MARKER": str(marker)})


def test_the_planted_library_runs_when_loaded_from_a_folder_of_the_users_own(planted_library, tmp_path):
    """The control of the tests below: loaded from a root only this user can write, the library runs and
    leaves its marker."""
    root = _planted_sdk(tmp_path / "sdk", planted_library)
    marker = tmp_path / "MARKER"
    done = _load_in_a_child(str(root), marker)
    assert done.returncode == 0, done.stderr
    assert marker.exists()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757], ids=["777", "775", "757"])
def test_a_planted_library_in_a_root_others_can_write_is_not_found(planted_library, no_sdk, monkeypatch, mode):
    """``QNN_SDK_ROOT`` at a folder its group or others can write, holding a library but no manifest of
    edgefuse's: not found, and the reason names the folder and why."""
    root = _planted_sdk(no_sdk / "sdk", planted_library)
    root.chmod(mode)
    monkeypatch.setenv("QNN_SDK_ROOT", str(root))
    found = find()
    assert not found, found
    assert f"{root} can be written by other users (mode {mode:o})" in found.reason
    assert "edgefuse loads no library that another user could have put there" in found.reason


def test_a_planted_library_in_a_root_others_can_write_is_not_loaded(planted_library, tmp_path):
    """Handed straight to ensure_in_process (no find() before it), the library is still not loaded."""
    root = _planted_sdk(tmp_path / "sdk", planted_library)
    root.chmod(0o777)
    marker = tmp_path / "MARKER"
    done = _load_in_a_child(str(root), marker)
    assert done.returncode == 1 and f"{root} can be written by other users (mode 777)" in done.stderr, done.stderr
    assert "QnnSdkUnsafe" in done.stderr, done.stderr
    assert not marker.exists()
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_lower_with_a_planted_qnn_sdk_root_exits_2_and_loads_nothing(planted_library, tmp_path):
    """The command a user runs, with ``QNN_SDK_ROOT`` at a group-writable folder holding a planted
    library: exit 2 (refused input) naming the folder, the library never loaded, nothing written."""
    from edgefuse.inputs.errors import USAGE

    root = _planted_sdk(tmp_path / "sdk", planted_library)
    root.chmod(0o775)
    marker, out = tmp_path / "MARKER", tmp_path / "out.pte"
    done = subprocess.run(
        [sys.executable, "-m", "edgefuse", "-q", "lower", "tiny-llama", "--backend", "qnn", "-o", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "QNN_SDK_ROOT": str(root), "EDGEFUSE_PLANTED_MARKER": str(marker)},
    )
    assert done.returncode == USAGE, done.stderr
    assert f"{root} can be written by other users (mode 775)" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize("spoil, reason", [
    (lambda root: (root / HOST_DIR / "libQnnHtp.so").chmod(0o666), "libQnnHtp.so can be written by other users (mode 666)"),
    (lambda root: (root / HOST_DIR / "libQnnSystem.so").chmod(0o646), "libQnnSystem.so can be written by other users (mode 646)"),
    (lambda root: (root / HOST_DIR).chmod(0o1777), "x86_64-linux-clang can be written by other users (mode 1777)"),
])
def test_a_library_or_library_folder_others_can_write_in_a_private_root_is_refused(planted_library, no_sdk, spoil, reason):
    """One writable library (or its folder, sticky or not: a library it lacks could be added) is enough."""
    root = _planted_sdk(no_sdk / "sdk", planted_library)
    spoil(root)
    found = find(root)
    assert not found and found.unsafe and reason in found.reason, found


def test_what_a_library_link_leads_to_is_checked_where_it_is(planted_library, no_sdk):
    """A library that is a link is judged by its target, and the folders above the target, wherever they are."""
    root = _planted_sdk(no_sdk / "sdk", planted_library)
    elsewhere = no_sdk / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "libQnnSystem.so.2"
    os.replace(root / HOST_DIR / "libQnnSystem.so", target)
    (root / HOST_DIR / "libQnnSystem.so").symlink_to(target)
    assert find(root) == Sdk(root, "argument")
    target.chmod(0o666)
    found = find(root)
    assert not found and f"{target} can be written by other users (mode 666)" in found.reason, found
    target.chmod(0o755)
    elsewhere.chmod(0o777)
    found = find(root)
    assert not found and f"{elsewhere} can be written by other users, who could swap what it holds" in found.reason, found


def test_a_folder_above_the_root_others_can_write_is_refused_unless_sticky(planted_library, no_sdk):
    """Another user who can write a folder above the root could swap the root for their own; with the
    sticky bit (as ``/tmp``) they cannot rename what is not theirs."""
    shared = no_sdk / "shared"
    shared.mkdir()
    root = _planted_sdk(shared / "sdk", planted_library)
    shared.chmod(0o777)
    found = find(root)
    assert not found and f"{shared} can be written by other users, who could swap what it holds" in found.reason
    shared.chmod(0o1777)
    assert find(root) == Sdk(root, "argument")


# --- the wheel: hashed and unpacked from one open regular file -------------------------------------------

def _wheel(path: Path, content: bytes) -> Path:
    """A stand-in wheel at ``path`` whose libraries each hold ``content`` and their name."""
    with zipfile.ZipFile(path, "w") as archive:
        for name in (*(f"onnxruntime_qnn/{n}" for n in LIBRARIES), "onnxruntime_qnn.libs/libc++.so.1"):
            archive.writestr(name, content + name.encode())
    return path


@pytest.fixture
def pinned_stand_in(tmp_path, monkeypatch) -> Path:
    """A stand-in wheel, pinned by its hash and size in place of onnxruntime-qnn's."""
    wheel = _wheel(tmp_path / "stand-in.whl", b"pinned ")
    monkeypatch.setattr(qnn_sdk_module, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setattr(qnn_sdk_module, "WHEEL_BYTES", wheel.stat().st_size)
    return wheel


def test_the_wheel_unpacked_is_the_file_whose_hash_was_checked(pinned_stand_in, tmp_path, monkeypatch):
    """Another wheel put at the name once the hash is checked is not what gets unpacked."""
    hashed = qnn_sdk_module._sha256

    def hash_then_swap(*args):
        digest = hashed(*args)
        swapped = _wheel(tmp_path / "swapped.whl", b"swapped in ")
        os.replace(swapped, pinned_stand_in)
        return digest

    monkeypatch.setattr(qnn_sdk_module, "_sha256", hash_then_swap)
    root = tmp_path / "root"
    root.mkdir()
    qnn_sdk_module.lay_out(pinned_stand_in, root)
    assert b"swapped in" in pinned_stand_in.read_bytes()  # the swap happened
    for name in LIBRARIES:
        assert (root / REAL_DIR / name).read_bytes() == f"pinned onnxruntime_qnn/{name}".encode()
    assert (root / RUNTIME_DIR / "libc++.so.1").read_bytes() == b"pinned onnxruntime_qnn.libs/libc++.so.1"


def test_a_wheel_that_is_no_regular_file_is_refused_without_waiting(pinned_stand_in, tmp_path):
    """A FIFO as the wheel (opening it to read would wait for a writer): refused at once."""
    fifo = tmp_path / "wheel.whl"
    os.mkfifo(fifo)
    root = tmp_path / "root"
    root.mkdir()
    outcome = []

    def lay_out():
        try:
            qnn_sdk_module.lay_out(fifo, root)
        except QnnSdkUnavailable as error:
            outcome.append(str(error))

    worker = threading.Thread(target=lay_out, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert outcome and "is a FIFO, not a regular file" in outcome[0], "laying out a FIFO blocked or was not refused"
    assert list(root.iterdir()) == []


def test_a_wheel_larger_than_the_pinned_one_is_refused_before_it_is_read(pinned_stand_in, tmp_path, monkeypatch):
    monkeypatch.setattr(qnn_sdk_module, "_sha256", lambda *_: pytest.fail("a wheel past the pinned size was hashed"))
    with open(pinned_stand_in, "ab") as f:
        f.write(b"\0")
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(QnnSdkUnavailable, match="past the bound of"):
        qnn_sdk_module.lay_out(pinned_stand_in, root)


def test_a_fifo_as_the_manifest_is_no_set_up_and_nothing_waits_on_it(no_sdk):
    """``qnn env DIR`` reads DIR's manifest: a FIFO there (reading it would wait for a writer) is refused at once."""
    root = _planted(no_sdk / "root")
    (root / MANIFEST).unlink()
    os.mkfifo(root / MANIFEST)
    found = []
    worker = threading.Thread(target=lambda: found.append(find(root)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert found, "reading the manifest blocked"
    assert not found[0] and "holds no finished QNN set-up of edgefuse" in found[0].reason
