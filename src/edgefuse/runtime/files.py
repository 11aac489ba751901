"""How edgefuse reads the files it is handed and writes the files it names: regular files within a bound,
folders only the user can write, never through a link.

Reading: :func:`read_regular` and :func:`open_regular` open a file without blocking and refuse anything
but a regular file (a FIFO would block, ``/dev/zero`` never ends) and a file past a size bound, before
reading a byte; what is read is that one open file. Writing: :func:`write_new` writes a name edgefuse
chose only as a new file (or over one it wrote in the same run), never through a link at the name.
Loading: :func:`check_loadable` refuses a library (or a folder of libraries) that anyone but the user or
root could have written.

Folders:

A fixed name under a shared folder (``/tmp/edgefuse-demo``) can be made first by another user, or hold a
symlink another user planted under the file's name, and a write would then go where they point. So the
folders edgefuse picks itself are either fresh (:func:`fresh_private_folder`, ``tempfile.mkdtemp``: mode
0700, a new name each time) or checked (:func:`own_folder`: made 0700 when missing, else a real folder,
not a link, owned by this user and writable by no one else). The check opens every component of the
path in turn without following a link and checks the open folder itself (``fstat``), so a parent that
another user can write (who could swap a component for a link) is refused too; :func:`write_text`
checks the folder the same way when it writes and creates the file inside that open folder, never
through a link at its name, so nothing swapped after the check is written through.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
import tempfile
from typing import Callable
from typing import BinaryIO

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafeFolder(PermissionError):
    """A folder edgefuse would write in is a link, not a folder, another user's, or writable by others; or
    a file or folder it would load code from could have been written by another user."""


def fresh_private_folder(prefix: str) -> str:
    """A new folder under the system's temporary directory that only this user can enter (0700)."""
    return tempfile.mkdtemp(prefix=prefix)


def own_folder(path: str | os.PathLike) -> str:
    """``path`` as a folder this user owns and no other user can write: made (0700) when missing.

    Raises :class:`UnsafeFolder` when it or a folder above it is a symlink another user could swap, it
    is not a folder, owned by another user or writable by its group or others, or a folder above it is
    writable by another user; ``OSError`` when it cannot be made.
    """
    path = os.fspath(path)
    os.close(_open_own_folder(path, make=True))
    return path


def _open_own_folder(path: str, make: bool = False) -> int:
    """A descriptor of the folder ``path`` (:func:`_open_folder`), which :func:`_check_own` accepts."""
    fd = _open_folder(path, make)
    try:
        _check_own(os.fstat(fd), os.path.abspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_folder(path: str, make: bool = False) -> int:
    """A descriptor of the folder ``path``, opened one component at a time without following a link, each
    folder above it checked (:func:`_check_parent`); with ``make``, missing folders are made (0700) inside
    the checked ones. The folder itself is the caller's to check."""
    path = os.path.abspath(path)
    # Links above the folder are resolved once, then every component is opened with O_NOFOLLOW: a link
    # swapped in after this is refused, not followed.
    parent, name = os.path.split(path)
    components = [c for c in os.path.realpath(parent).split(os.sep) if c] + ([name] if name else [])
    fd = os.open(os.sep, _FOLDER)
    try:
        where = os.sep
        for i, component in enumerate(components):
            _check_parent(fd, where)
            where = os.path.join(where, component)
            try:
                try:
                    child = os.open(component, _FOLDER, dir_fd=fd)
                except FileNotFoundError:
                    if not make:
                        raise
                    try:
                        os.mkdir(component, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                    child = os.open(component, _FOLDER, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(where):
                    what = path if i == len(components) - 1 else where
                    raise UnsafeFolder(errno.EACCES, f"{what} is a symlink, not a folder") from None
                if error.errno == errno.ENOTDIR:
                    raise UnsafeFolder(errno.ENOTDIR, f"{where} is not a folder") from None
                raise UnsafeFolder(error.errno or errno.EACCES, f"{where} cannot be read: {error.strerror}") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_own(status: os.stat_result, path: str, owners: frozenset[int] | None = None) -> None:
    """Refuse what ``status`` describes unless one of ``owners`` (default: this user alone) owns it and
    neither its group nor others can write it."""
    if status.st_uid not in (owners or {os.geteuid()}):
        raise UnsafeFolder(errno.EACCES, f"{path} belongs to another user (uid {status.st_uid})")
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolder(errno.EACCES, f"{path} can be written by other users (mode {stat.S_IMODE(status.st_mode):o})")


def _check_parent(fd: int, path: str) -> None:
    """Refuse a folder above the one written in that another user could write, and so swap what it holds:
    one owned by a user other than this one or root, or writable by its group or others without the
    sticky bit (``/tmp`` has it: there others cannot rename or remove what is not theirs)."""
    status = os.fstat(fd)
    if status.st_uid not in (os.geteuid(), 0):
        raise UnsafeFolder(errno.EACCES, f"{path} belongs to another user (uid {status.st_uid}), who could swap "
                                         "what it holds")
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not status.st_mode & stat.S_ISVTX:
        raise UnsafeFolder(errno.EACCES, f"{path} can be written by other users, who could swap what it holds")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path``, a name edgefuse chose in a folder :func:`own_folder` accepts, as
    :func:`write_new` writes it (a new file, or one this run wrote), made inside the folder so checked:
    never through a symlink at ``path`` or above it. Raises :class:`UnsafeFolder` for such a folder or a
    symlink at ``path``, ``FileExistsError`` for a file this run did not write."""
    path = os.fspath(path)
    folder = _open_own_folder(os.path.dirname(path) or ".")
    try:
        _write_new(path, text, folder)
    except FileExistsError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFolder(errno.ELOOP, f"{path} is a symlink; not written through it") from None
        raise
    finally:
        os.close(folder)


# --- loading code from files ---------------------------------------------------------------------------

def _loaders() -> frozenset[int]:
    """Who may own a library edgefuse loads and its folders: this user, or root (a system-wide SDK)."""
    return frozenset({os.geteuid(), 0})


def check_loadable(path: str | os.PathLike) -> None:
    """Raise :class:`UnsafeFolder` unless no one but this user or root could have written ``path``, a
    library or a folder of libraries edgefuse loads code from: what it names (through any link) is owned
    by this user or root and writable by neither its group nor others, and every folder above it is one
    :func:`_check_parent` accepts (no one else can swap what it holds). Code loaded from ``path`` is then
    what the user or root put there. ``OSError`` when it cannot be looked at."""
    real = os.path.realpath(path)
    parent, name = os.path.split(real)
    folder = _open_folder(parent)
    try:
        _check_parent(folder, parent)
        if name:
            _check_own(os.stat(name, dir_fd=folder, follow_symlinks=False), real, _loaders())
    finally:
        os.close(folder)


# --- reading files others may hand the user -----------------------------------------------------------

#: Open for reading without blocking: opening a FIFO for reading blocks until a writer comes, so it is
#: opened this way and refused as not a regular file before anything waits on it.
_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotARegularFile(ValueError):
    """A file edgefuse was asked to read is not a regular file (a FIFO, a device, a folder, a socket)."""


class TooLarge(ValueError):
    """A file, or something it declares, is past a bound edgefuse reads it within; the message names the
    bound and how to raise it."""


def open_regular(path: str | os.PathLike, limit: int, what: str, raise_with: str = "") -> io.BufferedReader:
    """``path`` opened for reading in binary, once it is known to be a regular file of at most ``limit``
    bytes: what the caller then reads, hashes or unpacks is this one open file, whatever is put at the
    name later. ``what`` names the file in errors, ``raise_with`` the option that raises the bound.

    Raises :class:`NotARegularFile`, :class:`TooLarge`, or ``OSError`` when it cannot be opened.
    """
    fd = os.open(os.fspath(path), _READ)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise NotARegularFile(f"{os.fspath(path)} is {_kind(status.st_mode)}, not a regular file: {what} is read "
                                  "from a regular file only")
        _check_size(status.st_size, limit, f"{os.fspath(path)} ({what})", raise_with)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int, what: str, raise_with: str = "") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (:func:`open_regular`); a file
    that grows past the bound while it is read is refused too. Memory is set aside for the bytes the file
    holds, not for the bound (``read(limit)`` would ask for all of it at once)."""
    with open_regular(path, limit, what, raise_with) as f:
        return read_open(f, limit, f"{os.fspath(path)} ({what})", raise_with)


def read_open(f: io.BufferedReader, limit: int, where: str, raise_with: str = "") -> bytes:
    """Every byte of the file :func:`open_regular` opened, from its start, refused past ``limit`` (``where``
    names it in the refusal): :func:`read_regular`'s reading, for a caller that keeps the file open."""
    f.seek(0)
    size = os.fstat(f.fileno()).st_size
    data = f.read(size + 1)
    if size < len(data) <= limit:  # it grew while it was read: read on, up to the bound
        grown = bytearray(data)
        while len(grown) <= limit and (more := f.read(min(limit + 1 - len(grown), 1 << 20))):
            grown += more
        data = bytes(grown)
    _check_size(len(data), limit, where, raise_with)
    return data


def _check_size(size: int, limit: int, where: str, raise_with: str) -> None:
    if size > limit:
        how = f"; raise it with {raise_with}" if raise_with else ""
        raise TooLarge(f"{where} holds {size:,} bytes, past the bound of {limit:,}{how}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


# --- writing files edgefuse names itself ---------------------------------------------------------------

#: The files this process created under names it chose (device and inode): the only files such a name
#: may be written over.
_CREATED: set[tuple[int, int]] = set()


def why_unwritable(path: str | os.PathLike, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written, or ``None``: checked before the slow work so that it fails first, not
    after. A file needs its folder to exist and be writable (and itself, when it exists, not a folder and
    writable); with ``folder``, ``path`` is a folder made when missing, so the nearest folder of its path
    that exists (it included) must be one this user can write in."""
    path = os.path.abspath(os.fspath(path))
    if folder:
        nearest = path
        while not os.path.lexists(nearest):
            nearest = os.path.dirname(nearest)
        if not os.path.isdir(nearest):
            return f"{nearest} is not a folder"
        return None if os.access(nearest, os.W_OK | os.X_OK) else f"permission denied in {nearest}"
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        return "it is a directory; name a file in it"
    if not os.path.isdir(directory):
        return f"no directory {directory}"
    if not os.access(directory, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "permission denied"
    return None


def write_new(path: str | os.PathLike, data: bytes | str | BinaryIO) -> None:
    """Write ``data`` (bytes, text, or a binary file read to its end) to ``path``, a name edgefuse chose
    itself (a map beside the user's ``.pte``, a program kept beside another): created anew, never through
    a symlink at the name, and never over a file this process did not create. Raises ``FileExistsError``
    naming the file otherwise (its ``errno`` is ``ELOOP`` for a symlink)."""
    _write_new(os.fspath(path), data)


def _write_new(path: str, data: bytes | str | BinaryIO, folder: int | None = None) -> None:
    """:func:`write_new`, with the file made inside the open folder ``folder`` when one is given."""
    name = os.path.basename(path) if folder is not None else path
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, 0o666, dir_fd=folder)
    except FileExistsError:
        try:
            status = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:  # removed in between: try once more, still exclusively
            fd = os.open(name, flags, 0o666, dir_fd=folder)
        else:
            if stat.S_ISLNK(status.st_mode):
                raise FileExistsError(errno.ELOOP, f"{path} is a symlink; edgefuse writes a name it chose only "
                                                   "as a new file, never through a link", path) from None
            if not stat.S_ISREG(status.st_mode) or (status.st_dev, status.st_ino) not in _CREATED:
                raise FileExistsError(errno.EEXIST, f"{path} exists and edgefuse did not write it in this run; it "
                                                    "writes a name it chose only as a new file", path) from None
            fd = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        status = os.fstat(f.fileno())
        _CREATED.add((status.st_dev, status.st_ino))
        if isinstance(data, (bytes, str)):
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        else:
            shutil.copyfileobj(data, f, 1 << 20)


def replace_atomically(path: str | os.PathLike, write: Callable[[io.BufferedWriter], None]) -> None:
    """Have ``write`` fill a new temporary file beside ``path``, then rename it over ``path``: a failure or an
    interrupt leaves the old file or none, never half a one, and a link at ``path`` is replaced, not
    written through. The file gets the mode ``open()`` would give it, not ``mkstemp``'s 0600."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
