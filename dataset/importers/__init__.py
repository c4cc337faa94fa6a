"""Importers turn external measurement files into the profile schema.

Each importer is one small module here that registers a :class:`Importer`: a name,
the source columns that identify its format, and a ``convert`` function.
:func:`import_file` picks the importer whose signature columns the file has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from modeswitch.dataset.errors import InputFileError, read_table
from modeswitch.dataset.profile_schema import conform, validate_profile
from modeswitch.dataset.registry import Registry, discover_package


@dataclass(frozen=True)
class Importer:
    name: str
    description: str
    signature: frozenset[str]
    convert: Callable[[pd.DataFrame, Path], pd.DataFrame]


IMPORTERS: Registry[Importer] = Registry("importer", discover_package(__name__))


def register_importer(importer: Importer) -> Importer:
    return IMPORTERS.register(importer.name, importer)


def list_importers() -> list[Importer]:
    return IMPORTERS.values()


def detect_importer(columns, path=None) -> Importer:
    cols = set(columns)
    matches = [imp for imp in list_importers() if imp.signature <= cols]
    if not matches:
        raise InputFileError(
            path, None, None,
            "no importer recognises this file's columns; known formats: "
            + "; ".join(f"{i.name} (needs {', '.join(sorted(i.signature))})"
                        for i in list_importers()),
        )
    # the most specific signature wins
    return max(matches, key=lambda i: len(i.signature))


def import_file(path, importer: str | None = None) -> pd.DataFrame:
    """Read one external file and return a validated profile table."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    raw = read_table(path, pd.read_csv, keep_default_na=True)
    if importer is not None:
        imp = IMPORTERS.get(importer)
        missing = sorted(imp.signature - set(raw.columns))
        if missing:
            raise InputFileError(path, None, missing[0], f"column required by {imp.name} is missing")
    else:
        imp = detect_importer(raw.columns, path)
    out = imp.convert(raw, path)
    return validate_profile(conform(out), path=path)


def import_files(paths, importer: str | None = None) -> pd.DataFrame:
    frames = [import_file(p, importer) for p in paths]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
