"""Atomic, non-clobbering writes for everything the framework produces.

A run's results are never overwritten by accident: writing to an existing path is
refused unless the caller passes ``overwrite=True``, and every write goes to a
temporary file in the same folder first, then is renamed into place, so an
interrupted write leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


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
    if path.exists() and not overwrite:
        raise OutputExistsError(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_parquet(df, path, overwrite: bool = False) -> Path:
    with atomic_path(path, overwrite=overwrite) as tmp:
        df.to_parquet(tmp, index=False)
    return Path(path)


def write_text(text: str, path, overwrite: bool = False) -> Path:
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_text(text)
    return Path(path)
