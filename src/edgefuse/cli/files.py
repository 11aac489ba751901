"""Where edgefuse writes files of its own choosing: folders only the user can write, never through a link.

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

import errno
import os
import stat
import tempfile

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafeFolder(PermissionError):
    """A folder edgefuse would write in is a link, not a folder, another user's, or writable by others."""


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
    """A descriptor of the folder ``path``, opened one component at a time without following a link,
    each folder above it checked (:func:`_check_parent`) and the folder itself :func:`_check_own`;
    with ``make``, missing folders are made (0700) inside the checked ones."""
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
        _check_own(fd, path)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_own(fd: int, path: str) -> None:
    """Refuse the open folder ``fd`` unless this user owns it and neither its group nor others can write it."""
    status = os.fstat(fd)
    if status.st_uid != os.geteuid():
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
    """Write ``text`` to ``path`` in a folder :func:`own_folder` accepts, replacing a file of this user's,
    never through a symlink at ``path`` or above it."""
    path = os.fspath(path)
    folder = _open_own_folder(os.path.dirname(path) or ".")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.path.basename(path), flags, 0o644, dir_fd=folder)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFolder(errno.ELOOP, f"{path} is a symlink; not written through it") from None
        raise
    finally:
        os.close(folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        status = os.fstat(f.fileno())
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():
            raise UnsafeFolder(errno.EACCES, f"{path} is not a file of this user's")
        os.set_blocking(f.fileno(), True)
        f.truncate(0)  # only once it is known to be this user's regular file
        f.write(text)
