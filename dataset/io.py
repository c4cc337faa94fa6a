"""Atomic, non-clobbering writes for everything the framework produces, one writer at a time.

A run's results are never overwritten by accident: writing to an existing path is
refused unless the caller passes ``overwrite=True``, and every write goes to a
temporary file in the same folder first, then is renamed into place, so an
interrupted write leaves either the old file or the new one, never half of one.
A write that fails (a read-only folder, a full disk) removes its temporary file
and is raised as an :class:`~modeswitch.dataset.errors.InputError` naming the path, so the CLI
prints one line and exits 2.

An output that a run appends to for a long time (a profile's journal) is held with
:class:`OutputLock`, so a second run on the same output is refused, naming the
first one's pid, instead of both appending to it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from modeswitch.dataset.errors import InputError


class OutputExistsError(FileExistsError):
    def __init__(self, path):
        super().__init__(
            f"{path} already exists; refusing to overwrite a previous result "
            "(choose another output path, or pass --overwrite)"
        )


@contextmanager
def atomic_path(path, overwrite: bool = False):
    """Yield a temporary path beside ``path``; rename it into place on success."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path} is a directory; give a file path to write")
    if path.exists() and not overwrite:
        raise OutputExistsError(path)
    with os_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with os_errors(path):
            os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError | FileNotFoundError):
            raise _os_error(path, exc) from None
        raise


@contextmanager
def atomic_folder(path):
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` (a cache
    entry rebuilt whole, e.g. a model checkpoint), on failure it is removed. Readers
    never see a half-written folder: they find the old one, the new one, or none."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with os_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    try:
        yield tmp
        with os_errors(path):
            if path.exists():
                shutil.rmtree(path)
            tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: OS errors a user can fix (permissions, space, quota, a read-only or missing
#: folder, a directory where a file belongs); any other OSError is left as it is
USER_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EISDIR,
               errno.ENOTDIR, errno.ENAMETOOLONG, errno.EFBIG}


def _os_error(path, exc: OSError) -> Exception:
    if exc.errno not in USER_ERRNOS:
        return exc
    return InputError(f"cannot write {path}: {exc.strerror or exc}")


@contextmanager
def os_errors(path):
    """Around a write to ``path``: a permission, space or read-only error becomes one
    :class:`~modeswitch.dataset.errors.InputError` naming the path (other OS errors pass unchanged)."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, FileExistsError | FileNotFoundError) or exc.errno not in USER_ERRNOS:
            raise
        raise _os_error(path, exc) from None


def write_parquet(df, path, overwrite: bool = False) -> Path:
    with atomic_path(path, overwrite=overwrite) as tmp:
        df.to_parquet(tmp, index=False)
    return Path(path)


def write_csv(df, path, overwrite: bool = False) -> Path:
    with atomic_path(path, overwrite=overwrite) as tmp:
        df.to_csv(tmp, index=False)
    return Path(path)


def write_text(text: str, path, overwrite: bool = False) -> Path:
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_text(text)
    return Path(path)


class OutputLock:
    """An exclusive ``flock`` on ``<path>.lock`` beside an output, held for one run.

    The lock file holds the holder's pid, so the refusal names it. The kernel drops the
    lock when the holder exits, however it exits (a kill -9 too), so a stale file never
    blocks a later run; :meth:`release` removes the file while still holding the lock,
    and :meth:`acquire` checks that the file it locked is still the one at the path (a
    run that opened it just before it was removed tries again on the new one).
    """

    def __init__(self, path):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        with os_errors(self.lock_path):
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise InputError(f"{self.path} is being written by another run (pid {holder}); wait for it "
                                     "to finish, or choose another output path") from None
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.lock_path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    def __del__(self):  # a holder dropped without release (an in-process run that failed)
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit the kernel drops the lock anyway
            pass

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
