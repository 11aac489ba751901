"""The QNN libraries that ExecuTorch's Qualcomm backend compiles and runs with: where they are, how to
set them up from a package registry, and how to load them into the running process.

ExecuTorch 1.5.1 carries its own side of the Qualcomm backend but not Qualcomm's libraries (the QNN
SDK). A user who has the SDK sets ``QNN_SDK_ROOT`` and nothing here changes it. Everyone else gets
the x86_64 Linux libraries from the ``onnxruntime-qnn`` wheel on PyPI (:func:`setup`): it holds QNN's
HTP library, which compiles programs and runs them on an x86 emulator of the HTP, and QNN's system
library, with the C++ runtime they link. :func:`setup` lays them out as an SDK root::

    ROOT/lib/x86_64-linux-clang/   what QNN_SDK_ROOT and LD_LIBRARY_PATH point at: the device-config
                                   wrapper as libQnnHtp.so, and a link to libQnnSystem.so
    ROOT/lib/qairt/                the wheel's libQnnHtp.so and libQnnSystem.so
    ROOT/lib/onnxruntime_qnn.libs/ their libc++, libc++abi and libunwind (the name their RPATH reads)
    ROOT/edgefuse-qnn.json         written last: what was set up, and the self-check's result

The wrapper (``htp_device_config.c``, compiled on the user's machine) exists because ExecuTorch 1.5.1
was built against the QNN 2.37 headers, and QNN 2.47 and later read the HTP device custom config's
union at another offset; the C file says how it bridges that.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

#: The wheel the libraries come from, pinned by name, version, content and size.
PACKAGE = "onnxruntime-qnn"
PACKAGE_VERSION = "2.7.0"
QNN_VERSION = "2.51.0"
WHEEL = "onnxruntime_qnn-2.7.0-cp311-cp311-manylinux_2_35_x86_64.whl"
WHEEL_SHA256 = "c56c01562b8534fe8980cfea4601408d950c065f8251fb862ce82101c52c9849"
WHEEL_BYTES = 98_578_793

#: The folders of an SDK root (see the module's docstring).
HOST_DIR = Path("lib", "x86_64-linux-clang")
REAL_DIR = Path("lib", "qairt")
RUNTIME_DIR = Path("lib", "onnxruntime_qnn.libs")
#: The QNN libraries taken from the wheel: the HTP backend (compiler and emulator) and the system
#: library ExecuTorch reads context binaries with; nothing else in the wheel is loaded.
LIBRARIES = ("libQnnHtp.so", "libQnnSystem.so")
#: The file whose presence marks a finished set-up.
MANIFEST = "edgefuse-qnn.json"
#: The most a manifest may hold (edgefuse writes about 500 bytes).
_MANIFEST_BYTES = 1 << 16
#: The wrapper's C source, kept as package data beside this module.
WRAPPER_SOURCE = Path(__file__).with_name("htp_device_config.c")
#: The version of the layout above and of what the manifest records; a set-up written with another
#: one (or from another wrapper source) is rebuilt by :func:`setup`.
LAYOUT_VERSION = 2
#: A scratch folder of a set-up older than this is taken as left by an interrupted one and removed.
_STALE_SCRATCH_SECONDS = 3600.0

#: How long the set-up waits for its slow steps.
_MINUTES = 60.0
_SELF_CHECK_TIMEOUT = 10 * _MINUTES
_DOWNLOAD_TIMEOUT = 15 * _MINUTES


class QnnSdkUnavailable(RuntimeError):
    """The QNN libraries are not set up, or cannot be set up here; the message says why and what to run
    (the command line exits with 3, "a needed part unavailable")."""


class QnnSdkUnsafe(QnnSdkUnavailable):
    """The QNN libraries named are in a folder another user could have written, so edgefuse loads none
    of them; the message names the path (the command line exits with 2: the input is refused)."""


SETUP_HINT = "run `edgefuse qnn setup`, or set QNN_SDK_ROOT to a QNN SDK"


def cache_home() -> Path:
    """The user's cache folder: ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"


def default_root() -> Path:
    """Where :func:`setup` puts the SDK root unless told otherwise."""
    return cache_home() / "edgefuse" / "qnn" / QNN_VERSION


def wheel_folder() -> Path:
    """Where the downloaded wheel is kept, for every set-up of this user."""
    return cache_home() / "edgefuse" / "qnn" / "wheels"


@dataclass(frozen=True)
class Sdk:
    """A QNN SDK root that ExecuTorch can use.

    ``source`` says where it was found: ``"QNN_SDK_ROOT"`` (set by the user), ``"edgefuse"`` (set up by
    :func:`setup` in the default place) or ``"argument"`` (a folder the caller named); ``manifest`` is
    what :func:`setup` recorded, empty for an SDK edgefuse did not set up.
    """

    root: Path
    source: str
    manifest: dict = field(default_factory=dict, compare=False)

    @property
    def library_dir(self) -> Path:
        return self.root / HOST_DIR

    @property
    def qnn_version(self) -> str | None:
        return self.manifest.get("qnn_version")

    def environment(self) -> dict[str, str]:
        """The variables a separate process needs to use this SDK through ExecuTorch."""
        return {"QNN_SDK_ROOT": str(self.root), "LD_LIBRARY_PATH": str(self.library_dir)}

    def shell_lines(self) -> list[str]:
        """``export`` lines for a POSIX shell (``LD_LIBRARY_PATH`` keeps what it held)."""
        root = shlex.quote(str(self.root))
        library = shlex.quote(str(self.library_dir))
        return [f"export QNN_SDK_ROOT={root}", f'export LD_LIBRARY_PATH={library}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"']


@dataclass(frozen=True)
class Absent:
    """No usable QNN SDK; ``reason`` says why and what to run, ``unsafe`` that it is one edgefuse refuses
    to load (:func:`_unsafe`). False in a boolean context."""

    reason: str
    unsafe: bool = False

    def __bool__(self) -> bool:
        return False


def read_manifest(root: Path) -> dict | None:
    """What :func:`setup` recorded in ``root``, or None when ``root`` is no finished, current and safe
    edgefuse set-up."""
    return _inspect(Path(root)).manifest


def pinned_set_up(root: str | os.PathLike | None = None) -> Path | None:
    """``root`` (default :func:`default_root`) when it is a safe edgefuse set-up of the pinned wheel,
    current or with a wrapper built from another source, else None: QNN's own libraries in it
    (``REAL_DIR``) are the ones a wrapper built from the current source must work with."""
    root = Path(root) if root is not None else default_root()
    found = _inspect(root)
    return root.absolute() if found.manifest is not None or found.rebuild else None


def wrapper_sha256() -> str:
    """The SHA-256 of the wrapper's C source this edgefuse builds; a set-up records the one it built."""
    with open(WRAPPER_SOURCE, "rb") as f:
        return _sha256(f)


@dataclass(frozen=True)
class _Inspection:
    """``manifest``: a finished, current and safe set-up's; else ``problem`` says what is wrong with the
    folder as a set-up of this edgefuse, ``unsafe`` that it is not safe to load (:func:`_unsafe`) and
    ``rebuild`` that :func:`setup` rebuilds it (built from another wrapper source or layout)."""

    manifest: dict | None
    problem: str | None = None
    rebuild: bool = False
    unsafe: bool = False


def _inspect(root: Path) -> _Inspection:
    """What ``root`` holds as a set-up of this edgefuse (:class:`_Inspection`): no manifest, not safe to
    load, a failed self-check, other pins, another wrapper source or layout, or a finished set-up."""
    from edgefuse.runtime.files import read_regular

    try:
        manifest = json.loads(read_regular(root / MANIFEST, _MANIFEST_BYTES, "a QNN set-up's manifest"))
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("self_check"), dict):
        return _Inspection(None, f"{root} holds no finished QNN set-up of edgefuse")
    unsafe = _unsafe(root)
    if unsafe:
        return _Inspection(None, unsafe, unsafe=True)
    if not manifest["self_check"].get("ok"):
        return _Inspection(None, f"the QNN set-up in {root} failed its self-check")
    pins = {"wheel_sha256": WHEEL_SHA256, "qnn_version": QNN_VERSION}
    other = [f"{key} {manifest.get(key)!r}, not {value!r}" for key, value in pins.items() if manifest.get(key) != value]
    if other:
        return _Inspection(None, f"the QNN set-up in {root} is not the pinned one ({'; '.join(other)})")
    if manifest.get("layout") != LAYOUT_VERSION or manifest.get("wrapper_sha256") != wrapper_sha256():
        return _Inspection(None, (
            f"the QNN set-up in {root} was built from another {WRAPPER_SOURCE.name} or layout than this "
            "edgefuse's and must be rebuilt"
        ), rebuild=True)
    return _Inspection(manifest)


def _unsafe(root: Path) -> str | None:
    """Why no library under ``root`` may be loaded, or None: ``root``, a library folder, a file in one
    (or the manifest), what a link among them leads to, or a folder above any of them could have been
    written by another user (:func:`edgefuse.runtime.files.check_loadable`), so it could hold anyone's
    code. Whether edgefuse set ``root`` up or not, the same holds."""
    from edgefuse.runtime.files import UnsafeFolder, check_loadable

    folders = [root / folder for folder in (HOST_DIR, REAL_DIR, RUNTIME_DIR)]
    paths = [root, root / MANIFEST, *folders]
    try:
        paths += [path for folder in folders if folder.is_dir() for path in sorted(folder.iterdir())]
    except OSError as error:
        return f"cannot inspect the QNN libraries in {root}: {error}"
    for path in paths:
        if not os.path.lexists(path):
            continue
        try:
            check_loadable(path)
        except UnsafeFolder as error:
            return f"{error.strerror}: edgefuse loads no library that another user could have put there"
        except OSError as error:
            return f"cannot inspect {path}: {error}"
    return None


def find(root: str | os.PathLike | None = None) -> Sdk | Absent:
    """The QNN SDK to use: ``root`` if given, else ``QNN_SDK_ROOT`` if set, else edgefuse's set-up in
    :func:`default_root`; :class:`Absent` with the reason when there is none."""
    if root is not None:
        source, path = "argument", Path(root)
    elif os.environ.get("QNN_SDK_ROOT"):
        source, path = "QNN_SDK_ROOT", Path(os.environ["QNN_SDK_ROOT"])
    else:
        source, path = "edgefuse", default_root()
    found = _inspect(path)
    if found.manifest is not None:
        return Sdk(path.absolute(), source, found.manifest)
    if (path / MANIFEST).exists():
        return Absent(f"{found.problem}: {SETUP_HINT}", found.unsafe)
    if source == "edgefuse":
        if path.exists():
            return Absent(f"the QNN set-up in {path} is unfinished: {SETUP_HINT}")
        return Absent(f"no QNN libraries are set up: {SETUP_HINT}")
    htp = path / HOST_DIR / "libQnnHtp.so"
    if not htp.is_file():
        return Absent(f"{source}={path} holds no {HOST_DIR / 'libQnnHtp.so'}: {SETUP_HINT}")
    unsafe = _unsafe(path)
    if unsafe:
        return Absent(f"{source}={path}: {unsafe}: {SETUP_HINT}", unsafe=True)
    return Sdk(path.absolute(), source)


# ---------------------------------------------------------------------------------------------------
# Loading the libraries into this process


_LOADED: dict[str, object] = {}
_LOADING = threading.Lock()


def ensure_in_process(sdk: Sdk | Absent | None = None) -> Sdk:
    """Make this process's ExecuTorch use ``sdk`` (default: :func:`find`); returns it.

    ``LD_LIBRARY_PATH`` is read once, when a process starts, so setting it now would not reach
    ExecuTorch, which opens ``libQnnHtp.so`` and ``libQnnSystem.so`` by name. Instead both are loaded
    here by absolute path: a library opened by name later is the one already loaded under that
    SONAME. Measured: loaded before torch, they crash the process (global: "Pure virtual function
    called" from their libc++; local: a segfault in torch's operator registration when ExecuTorch
    registers its ops); loaded local (RTLD_LOCAL) after torch, lowering and running work. So torch is
    imported first. ``QNN_SDK_ROOT`` is set too, for ExecuTorch's Python side (it reads the SDK's
    version through it, and downloads no SDK when it is set).

    A process holds one QNN library: asking for another root after one was loaded raises
    :class:`QnnSdkUnavailable`, as does an absent SDK, and one whose libraries another user could have
    written (:func:`_unsafe`, checked again here, right before they are loaded).
    """
    if sdk is None:
        sdk = find()
    if not sdk:
        raise (QnnSdkUnsafe if sdk.unsafe else QnnSdkUnavailable)(sdk.reason)
    with _LOADING:
        loaded = _LOADED.get("root")
        if loaded is not None:
            if loaded != str(sdk.root):
                raise QnnSdkUnavailable(
                    f"this process already uses the QNN libraries of {loaded}; a process can use only one QNN SDK"
                )
            os.environ["QNN_SDK_ROOT"] = str(sdk.root)
            return sdk
        import torch  # noqa: F401  (before any QNN library, see above)

        unsafe = _unsafe(sdk.root)
        if unsafe:
            raise QnnSdkUnsafe(f"the QNN SDK in {sdk.root}: {unsafe}")
        handles = []
        for name in LIBRARIES:
            path = sdk.library_dir / name
            try:
                handles.append(ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW))
            except OSError as error:
                raise QnnSdkUnavailable(f"cannot load {path}: {error}; {SETUP_HINT}") from error
        os.environ["QNN_SDK_ROOT"] = str(sdk.root)
        _LOADED["root"] = str(sdk.root)
        _LOADED["handles"] = handles
    return sdk


# ---------------------------------------------------------------------------------------------------
# Setting the libraries up


def check_platform() -> None:
    """Raise :class:`QnnSdkUnavailable` unless this is x86_64 Linux, the one platform the wheel's
    libraries (and QNN's HTP emulator) are built for."""
    system, machine = platform.system(), platform.machine()
    if system != "Linux" or machine.lower() not in ("x86_64", "amd64"):
        raise QnnSdkUnavailable(
            f"QNN's x86 HTP emulator libraries exist for x86_64 Linux only; this is {system} {machine}. "
            "On another machine, set QNN_SDK_ROOT to a QNN SDK built for it"
        )


def c_compiler() -> str:
    """The system C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang`` on ``PATH``); raises
    :class:`QnnSdkUnavailable` when there is none."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise QnnSdkUnavailable(
        f"no C compiler found (looked for {', '.join(names)} on PATH): the QNN set-up compiles a small "
        "library; install one (Debian: apt-get install gcc) or set CC"
    )


def fetch_wheel(folder: Path | None = None, progress: Callable[[str], None] | None = None) -> Path:
    """The pinned wheel, from ``folder`` (default :func:`wheel_folder`) when it is there and intact,
    else downloaded into it with ``pip download`` (installed nowhere). Raises
    :class:`QnnSdkUnavailable` when pip cannot get it."""
    folder = Path(folder) if folder is not None else wheel_folder()
    wheel = folder / WHEEL
    if wheel.is_file() and _is_pinned_wheel(wheel):
        return wheel
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise QnnSdkUnavailable(f"cannot create {folder} for the downloaded wheel: {error}") from error
    if progress:
        progress(f"downloading {PACKAGE}=={PACKAGE_VERSION} (about 99 MB) with pip")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--progress-bar", "off", "-d", scratch,
            f"{PACKAGE}=={PACKAGE_VERSION}",
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise QnnSdkUnavailable(f"pip could not download {PACKAGE}=={PACKAGE_VERSION}: {error}") from error
        got = Path(scratch) / WHEEL
        if done.returncode != 0 or not got.is_file():
            said = _last_lines(done.stderr or done.stdout, 4)
            raise QnnSdkUnavailable(
                f"pip could not download {PACKAGE}=={PACKAGE_VERSION} from the package registry "
                f"(is it reachable?): {said or 'pip exited with ' + str(done.returncode)}. A wheel "
                f"downloaded elsewhere can be given with --wheel"
            )
        if not _is_pinned_wheel(got):
            raise QnnSdkUnavailable(f"the downloaded {WHEEL} is not the pinned one (its SHA-256 differs)")
        os.replace(got, wheel)
    return wheel


def _sha256(file: BinaryIO) -> str:
    """The SHA-256 of what is left to read in the open ``file``."""
    digest = hashlib.sha256()
    for block in iter(lambda: file.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _open_wheel(path: Path) -> BinaryIO:
    """``path`` opened as the wheel: a regular file no larger than the pinned wheel
    (:func:`edgefuse.runtime.files.open_regular`); raises :class:`QnnSdkUnavailable` otherwise."""
    from edgefuse.runtime.files import NotARegularFile, TooLarge, open_regular

    try:
        return open_regular(path, WHEEL_BYTES, f"the wheel {WHEEL}")
    except (NotARegularFile, TooLarge) as error:
        raise QnnSdkUnavailable(f"{error}; it is not the pinned {WHEEL}") from error
    except OSError as error:
        raise QnnSdkUnavailable(f"cannot read the wheel {path}: {error.strerror or error}") from error


def _is_pinned_wheel(path: Path) -> bool:
    """Whether ``path`` is a regular file that holds the pinned wheel."""
    try:
        with _open_wheel(path) as f:
            return _sha256(f) == WHEEL_SHA256
    except QnnSdkUnavailable:
        return False


def _last_lines(text: str, count: int) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines[-count:])


def lay_out(wheel: Path, root: Path) -> None:
    """Unpack the libraries of ``wheel`` into the SDK layout under ``root`` (an empty folder). The wheel is
    opened once: what is unpacked is the open file whose SHA-256 was checked, whatever is put at its
    name meanwhile."""
    with _open_wheel(wheel) as opened:
        if _sha256(opened) != WHEEL_SHA256:
            raise QnnSdkUnavailable(f"{wheel} is not the pinned {WHEEL} (its SHA-256 differs)")
        opened.seek(0)
        _unpack(opened, wheel.name, root)
    (root / HOST_DIR).mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        if name != "libQnnHtp.so":
            (root / HOST_DIR / name).symlink_to(Path("..", REAL_DIR.name, name))


def _unpack(wheel: BinaryIO, name: str, root: Path) -> None:
    """Copy QNN's libraries and their C++ runtime out of the open ``wheel`` (named ``name``) into ``root``."""
    wanted = {f"onnxruntime_qnn/{library}": root / REAL_DIR / library for library in LIBRARIES}
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.filename.startswith("onnxruntime_qnn.libs/") and not info.is_dir():
                wanted[info.filename] = root / RUNTIME_DIR / Path(info.filename).name
        missing = sorted(set(wanted) - set(archive.namelist()))
        if missing:
            raise QnnSdkUnavailable(f"{name} lacks {', '.join(missing)}")
        for member, target in wanted.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(target, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            target.chmod(0o755)


def build_wrapper(root: Path, compiler: str | None = None) -> Path:
    """Compile the device-config wrapper into ``root``'s library folder as ``libQnnHtp.so``."""
    compiler = compiler or c_compiler()
    target = root / HOST_DIR / "libQnnHtp.so"
    real = Path("..", REAL_DIR.name, "libQnnHtp.so")
    command = [
        compiler, "-O2", "-Wall", "-shared", "-fPIC", f'-DREAL_LIBRARY="{real}"',
        "-Wl,-soname,libQnnHtp.so", "-Wl,-z,nodelete", "-o", str(target), str(WRAPPER_SOURCE), "-ldl", "-lpthread",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5 * _MINUTES)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise QnnSdkUnavailable(f"compiling {WRAPPER_SOURCE.name} with {compiler} failed: {error}") from error
    if done.returncode != 0:
        raise QnnSdkUnavailable(
            f"compiling {WRAPPER_SOURCE.name} with {compiler} failed: {_last_lines(done.stderr, 6)}"
        )
    return target


@dataclass(frozen=True)
class SelfCheck:
    """What the self-check measured: one RmsNorm compiled by QNN and run on the HTP emulator."""

    ok: bool
    detail: str
    max_error: float | None = None
    allowed: float | None = None
    log: str = ""


def self_check(root: Path, timeout: float = _SELF_CHECK_TIMEOUT) -> SelfCheck:
    """Compile one RmsNorm with ExecuTorch's QNN flow against the libraries under ``root`` and run it on
    the HTP emulator, in a child process that has exactly :meth:`Sdk.environment` (so the printed
    environment is what is tested, and a crash of QNN's libraries ends only the child). ``log`` holds
    what the child wrote (QNN's own lines among it)."""
    sdk = Sdk(Path(root).absolute(), "argument")
    env = dict(os.environ)
    env.update(sdk.environment())
    if os.environ.get("LD_LIBRARY_PATH"):  # as the printed lines do: first, keeping what was there
        env["LD_LIBRARY_PATH"] += os.pathsep + os.environ["LD_LIBRARY_PATH"]
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *filter(None, [os.environ.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="edgefuse-qnn-check-") as scratch:
        result_file = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "edgefuse.qnn.selfcheck", str(result_file)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired as error:
            log = (error.stderr or b"").decode(errors="replace") if isinstance(error.stderr, bytes) else (error.stderr or "")
            return SelfCheck(False, f"the self-check did not finish in {timeout:.0f} s", log=log)
        log = (done.stdout or "") + (done.stderr or "")
        try:
            result = json.loads(result_file.read_text())
        except (OSError, ValueError):
            how = f"was killed by signal {-done.returncode}" if done.returncode < 0 else f"exited with {done.returncode}"
            return SelfCheck(False, f"the self-check process {how} before it finished", log=log)
    return SelfCheck(
        bool(result.get("ok")), str(result.get("detail", "")), result.get("max_error"), result.get("allowed"), log=log
    )


def qnn_log_lines(log: str, count: int = 6) -> str:
    """What QNN and ExecuTorch's QNN backend logged about a failure, in one line: the last ``count`` of
    their error lines (``[ERROR]``, ``<E>``, ``E hh:mm:ss``), or of their other lines but INFO ones (which
    say what ran, not what failed) when none is an error."""
    ours = [line.strip() for line in log.splitlines()
            if _QNN_LINE.search(line) and not _HARMLESS.search(line) and not _INFO_LINE.search(line)]
    errors = [line for line in ours if _ERROR_LINE.search(line)]
    return "; ".join((errors or ours)[-count:])


_QNN_LINE = re.compile(r"Qnn|QNN|htp_device_config")
#: An error line QNN 2.51's HTP library logs whenever a graph is created with custom configs, also
#: with QNN's own tools and headers (qnn-net-run, qnn-context-binary-generator), so it is no sign of
#: the 2.37/2.51 header mismatch (no public header names an option 66; ExecuTorch sends options 1-6,
#: whose numbers and layout did not change); the graph is still compiled at the precision asked
#: (the self-check's fp16 error is nonzero and within fp16's tolerance). Left out so it never hides
#: the line that explains a failure.
_HARMLESS = re.compile(r"unexpected GraphHtpSettings option 66")
#: An INFO line of QNN (``[INFO]``, ``<I>``, ``I hh:mm:ss``) or of Python's logging (``INFO:``).
_INFO_LINE = re.compile(r"\[INFO\]|<I>|^I \d|^INFO:|\bINFO\b:")
_ERROR_LINE = re.compile(r"\[ERROR\]|<E>|^E \d|\] cannot|\] the real")


def setup(
    root: str | os.PathLike | None = None,
    *,
    wheel: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Sdk, bool]:
    """Set the QNN libraries up in ``root`` (default :func:`default_root`); returns the SDK and whether
    it was set up now (False: a finished set-up was already there and is reused).

    Steps: check ``root`` (a folder or nothing, no link) and remove scratch folders that interrupted
    set-ups left beside it; reuse ``root`` if it is a finished set-up of this user, of the pinned wheel,
    built from this edgefuse's wrapper source and layout; else check the platform and the C compiler,
    get the pinned wheel (``wheel``, or the cached or downloaded one), unpack its libraries into the
    SDK layout, compile the wrapper, run the self-check, write the manifest. All of it happens in a
    temporary folder beside ``root``, renamed to ``root`` at the end (replacing a set-up built from
    another wrapper source or layout), so an interrupted or failed set-up never looks finished. Raises
    :class:`QnnSdkUnavailable` on every failure (the self-check's with QNN's log lines).
    """
    say = progress or (lambda _: None)
    source = "argument" if root is not None else "edgefuse"
    root = Path(root).absolute() if root is not None else default_root()
    _check_folder(root)
    _remove_stale_scratch(root)
    found = _inspect(root)
    rebuild = found.rebuild
    if found.manifest is not None:
        return Sdk(root, source, found.manifest), False
    if (root / MANIFEST).exists() and not rebuild:
        raise (QnnSdkUnsafe if found.unsafe else QnnSdkUnavailable)(found.problem)
    try:
        occupied = root.exists() and any(root.iterdir())
    except OSError as error:
        raise QnnSdkUnavailable(f"cannot read {root}: {error}") from error
    if occupied and not rebuild:
        raise QnnSdkUnavailable(
            f"{root} exists and is no finished QNN set-up of edgefuse; remove it or choose another folder"
        )
    if rebuild:
        say(found.problem)
    check_platform()
    compiler = c_compiler()
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise QnnSdkUnavailable(f"cannot create {root.parent}: {error}") from error
    if not os.access(root.parent, os.W_OK):
        raise QnnSdkUnavailable(f"cannot write in {root.parent}")
    wheel_path = Path(wheel) if wheel is not None else fetch_wheel(progress=say)
    if not wheel_path.is_file():
        raise QnnSdkUnavailable(f"no wheel at {wheel_path}")
    try:
        return _set_up_in_scratch(root, source, wheel_path, compiler, say)
    except OSError as error:  # a full disk, a file that cannot be written: nothing is left behind
        raise QnnSdkUnavailable(f"setting QNN up in {root} failed: {error}") from error


def _check_folder(root: Path) -> None:
    """Raise :class:`QnnSdkUnavailable` when ``root`` cannot be a set-up's folder: a symbolic link
    (dangling or not: the set-up is replaced by renaming, which would replace the link), something
    that is not a folder, or below something that is not one."""
    if root.is_symlink():
        raise QnnSdkUnavailable(f"{root} is a symbolic link (to {os.readlink(root)}); name a folder itself")
    if root.exists() and not root.is_dir():
        raise QnnSdkUnavailable(f"{root} is not a folder")
    above = next((parent for parent in root.parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        raise QnnSdkUnavailable(f"{above} is not a folder, so {root} cannot be made")


def _remove_stale_scratch(root: Path) -> None:
    """Remove this user's scratch folders beside ``root`` that an interrupted set-up left: those older
    than an hour (a set-up's own takes minutes), so one still running is left alone."""
    try:
        candidates = list(root.parent.glob(f".{root.name}.partial-*"))
    except OSError:
        return
    for path in candidates:
        try:
            info = path.lstat()
        except OSError:
            continue
        old = time.time() - info.st_mtime > _STALE_SCRATCH_SECONDS
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and old:
            shutil.rmtree(path, ignore_errors=True)


def _set_up_in_scratch(
    root: Path, source: str, wheel_path: Path, compiler: str, say: Callable[[str], None]
) -> tuple[Sdk, bool]:
    """The steps of :func:`setup` that write: in a scratch folder, renamed to ``root`` at the end (an
    outdated set-up in ``root`` is moved aside first and removed)."""
    with _scratch_beside(root) as scratch:
        say(f"unpacking QNN {QNN_VERSION}'s libraries from {wheel_path.name}")
        lay_out(wheel_path, scratch)
        say(f"compiling the device-config wrapper with {compiler}")
        source_sha256 = wrapper_sha256()
        build_wrapper(scratch, compiler)
        _drop_shared_write(scratch)
        say("self-check: compiling one RmsNorm with QNN and running it on the HTP emulator")
        check = self_check(scratch)
        if not check.ok:
            qnn_said = qnn_log_lines(check.log)
            raise QnnSdkUnavailable(
                f"the QNN self-check failed: {check.detail}"
                + (f" (QNN logged: {qnn_said})" if qnn_said else "")
            )
        manifest = {
            "package": PACKAGE,
            "package_version": PACKAGE_VERSION,
            "qnn_version": QNN_VERSION,
            "wheel_sha256": WHEEL_SHA256,
            "layout": LAYOUT_VERSION,
            "wrapper_sha256": source_sha256,
            "compiler": compiler,
            "self_check": {"ok": True, "detail": check.detail, "max_error": check.max_error, "allowed": check.allowed},
        }
        (scratch / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        (scratch / MANIFEST).chmod(0o644)
        try:
            _move_into_place(scratch, root)
        except OSError:
            finished = read_manifest(root)
            if finished is None:
                raise
            return Sdk(root, source, finished), False  # another set-up finished first
    return Sdk(root, source, manifest), True


def _drop_shared_write(folder: Path) -> None:
    """Make everything under ``folder`` writable by this user alone (whatever the umask), as a set-up
    must be to be loaded."""
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o022)


def _move_into_place(scratch: Path, root: Path) -> None:
    """Rename ``scratch`` to ``root``; an empty ``root`` is removed first, a full one (an outdated
    set-up) moved aside under a scratch name and removed after."""
    aside = None
    if root.exists():
        try:
            root.rmdir()  # os.replace cannot replace a folder that is not empty
        except OSError:
            aside = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-old-", dir=root.parent))
            os.replace(root, aside)  # onto the empty folder just made
    try:
        os.replace(scratch, root)
    except OSError:
        if aside is not None and not root.exists():
            os.replace(aside, root)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def _scratch_beside(root: Path) -> Iterator[Path]:
    """A new folder next to ``root`` (same file system, so it can be renamed to it); removed on the way
    out unless it was renamed."""
    scratch = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=root.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; the set-up is an ordinary folder
    try:
        yield scratch
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)

