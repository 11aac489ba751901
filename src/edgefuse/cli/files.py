"""Where edgefuse writes files of its own choosing: folders only the user can write, never through a link.

A fixed name under a shared folder (``/tmp/edgefuse-demo``) can be made first by another user, or hold a
symlink another user planted under the file's name, and a write would then go where they point. So the
folders edgefuse picks itself are either fresh (:func:`fresh_private_folder`, ``tempfile.mkdtemp``: mode
0700, a new name each time) or checked (:func:`own_folder`: made 0700 when missing, else a real folder,
not a link, owned by this user and not writable by others), and :func:`write_text` opens the file
without following a symlink at its name.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile


class UnsafeFolder(PermissionError):
    """A folder edgefuse would write in is a link, not a folder, another user's, or writable by others."""


def fresh_private_folder(prefix: str) -> str:
    """A new folder under the system's temporary directory that only this user can enter (0700)."""
    return tempfile.mkdtemp(prefix=prefix)


def own_folder(path: str | os.PathLike) -> str:
    """``path`` as a folder this user owns and no other user can write: made (0700) when missing.

    Raises :class:`UnsafeFolder` when it is a symlink, not a folder, owned by another user or writable
    by others, and ``OSError`` when it cannot be made.
    """
    path = os.fspath(path)
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    try:
        status = os.lstat(path)
    except OSError as error:
        raise UnsafeFolder(error.errno or errno.EACCES, f"{path} cannot be read: {error.strerror}") from None
    if stat.S_ISLNK(status.st_mode):
        raise UnsafeFolder(errno.EACCES, f"{path} is a symlink, not a folder")
    if not stat.S_ISDIR(status.st_mode):
        raise UnsafeFolder(errno.ENOTDIR, f"{path} is not a folder")
    if status.st_uid != os.geteuid():
        raise UnsafeFolder(errno.EACCES, f"{path} belongs to another user (uid {status.st_uid})")
    if status.st_mode & stat.S_IWOTH:
        raise UnsafeFolder(errno.EACCES, f"{path} can be written by other users")
    return path


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path``, replacing a file of this user's, never through a symlink at ``path``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFolder(errno.ELOOP, f"{os.fspath(path)} is a symlink; not written through it") from None
        raise
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        status = os.fstat(f.fileno())
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():
            raise UnsafeFolder(errno.EACCES, f"{os.fspath(path)} is not a file of this user's")
        os.set_blocking(f.fileno(), True)
        f.truncate(0)  # only once it is known to be this user's regular file
        f.write(text)
