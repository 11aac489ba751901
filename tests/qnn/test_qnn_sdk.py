"""Finding, setting up and loading the QNN libraries (edgefuse.qnn.sdk), and its clear errors."""

from __future__ import annotations

import os
import subprocess
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


def test_an_unfinished_set_up_is_not_taken_as_done(no_sdk):
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


def test_no_c_compiler_is_a_clear_error(no_sdk, monkeypatch):
    empty = no_sdk / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(QnnSdkUnavailable, match="no C compiler"):
        setup(no_sdk / "root")
    assert not (no_sdk / "root").exists()


def test_an_unreachable_registry_is_a_clear_error(no_sdk, monkeypatch):
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


def test_without_the_wrapper_the_self_check_fails_with_qnns_log(edgefuse_sdk, monkeypatch, tmp_path, capsys):
    """QNN 2.51's own libQnnHtp.so, given ExecuTorch 1.5.1's device config, cannot create the HTP
    device: ``edgefuse qnn setup`` exits with 3 and QNN's own error lines, and leaves nothing behind."""
    from edgefuse.cli import main
    from edgefuse.cli.errors import UNAVAILABLE

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
