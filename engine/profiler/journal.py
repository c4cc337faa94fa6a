"""The run's journal: an append-only JSONL of finished rows, fsynced before the next
measurement starts, so an interrupted run resumes where it stopped. Its first line is
the run's identity: a rerun with other settings cannot mix rows."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from modeswitch.dataset.errors import InputError, InputFileError
from modeswitch.dataset.io import OutputLock, os_errors, write_text

if TYPE_CHECKING:
    from modeswitch.engine.profiler.plan import ProfileSpec


def _header(path: Path):
    """A journal's first line, parsed (raises OSError or JSONDecodeError)."""
    with open(path) as fh:
        return json.loads(fh.readline())


def recorded_plan(path) -> dict:
    """The plan (:class:`ProfileSpec` as a dict) a profile run recorded in its journal's
    first line: what live scoring replays to run a measured request as it was profiled."""
    path = Path(path)
    try:
        header = _header(path)
    except OSError as exc:
        raise InputFileError(path, None, None, f"cannot be read ({exc.strerror})") from None
    except json.JSONDecodeError:
        raise InputFileError(path, 1, None, "line 1 is not a profile run's header (JSON)") from None
    if not isinstance(header, dict) or not isinstance(header.get("spec"), dict):
        raise InputFileError(path, 1, "spec", "missing: not a profiler's journal")
    return header["spec"]


def journal_identity(path) -> str | None:
    """The identity a run's journal records in its first line, or None where there is no
    readable journal: whether a rerun with some settings would continue it."""
    try:
        header = _header(path)
    except (OSError, json.JSONDecodeError):
        return None
    return header.get("identity") if isinstance(header, dict) else None


def plan_beside(profile) -> dict | None:
    """The plan recorded in the journal beside ``profile`` (``<profile>.journal.jsonl``),
    or None where there is none: what a measured request's prompt is rebuilt from by default."""
    path = Path(f"{profile}.journal.jsonl")
    return recorded_plan(path) if path.is_file() else None


class Journal:
    """Append-only JSONL of finished rows; the first line identifies the run.

    Lines with a ``kind`` key are facts about the run, not rows (the thread
    calibration): ``meta[kind]`` holds the last one of each kind.

    One writer at a time: the journal is locked (:class:`modeswitch.dataset.io.OutputLock`) from
    before it is read until :meth:`close`, so a second run on the same output is refused
    with the first one's pid instead of appending duplicate rows beside it.
    """

    def __init__(self, path: Path, spec: ProfileSpec):
        self.path = path
        self.lock = OutputLock(path).acquire()
        self.rows: list[dict] = []
        self.meta: dict[str, dict] = {}
        text = path.read_text() if path.exists() else ""
        lines = text.splitlines()
        header = None
        if lines:
            try:
                header = json.loads(lines[0])
            except json.JSONDecodeError:
                if any(line.strip() for line in lines[1:]):
                    raise InputFileError(path, None, None, "line 1 (the run's header) is corrupt; rows follow "
                                         "it, so the file is not a torn start: move it aside") from None
        if path.exists() and header is None:  # killed before or while writing its header: nothing to keep
            path.unlink()
        if header is not None:
            if header.get("identity") != spec.identity():
                raise InputError(
                    f"{path} holds a profile run with other settings "
                    f"({header.get('spec')}); choose another output path to start a new run"
                )
            self.run_id = header["run_id"]
            for i, line in enumerate(lines[1:], start=2):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    if i != len(lines):
                        raise InputFileError(path, None, None, f"line {i} is corrupt") from None
                    # an interrupted last write: dropped, it will be measured again
                    continue
                if "kind" in obj:
                    self.meta[obj["kind"]] = obj
                else:
                    self.rows.append(obj)
            if not text.endswith("\n"):
                self._rewrite(header)
        else:
            self.run_id = uuid.uuid4().hex[:12]
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"identity": spec.identity(), "run_id": self.run_id, "spec": asdict(spec)})

    def close(self) -> None:
        """Let the next run have the output."""
        self.lock.release()

    def _rewrite(self, header: dict):
        lines = [header, *self.meta.values(), *self.rows]
        write_text("\n".join(json.dumps(r) for r in lines) + "\n", self.path, overwrite=True)

    def _append(self, obj: dict):
        with os_errors(self.path), open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(obj, default=_json_default) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def keys(self) -> set[tuple]:
        """(request id, mode, trial, attempt) of every journalled row."""
        return {(r["request_id"], r["mode"], r["trial"], r.get("attempt", 0)) for r in self.rows}

    def add_meta(self, kind: str, data: dict):
        obj = {"kind": kind, **data}
        self._append(obj)
        self.meta[kind] = obj

    def add(self, row: dict):
        self._append(row)
        self.rows.append(json.loads(json.dumps(row, default=_json_default)))


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o))
