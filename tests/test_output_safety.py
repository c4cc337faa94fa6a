"""One writer per output, and OS errors as one line: a second run on an output in use is
refused naming the first one's pid; a write that fails on a full disk or a read-only
folder leaves no temporary file and ends the command with one line and exit 2.

A full disk and a read-only folder are simulated by making the write raise the error
the OS would raise (ENOSPC, EROFS): the test machine's disk is neither, and as root a
read-only mode bit does not stop a write."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import OutputLock, write_parquet, write_text

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _holder(path: Path) -> subprocess.Popen:
    """Another process holding the lock on ``path`` until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from modeswitch.dataset.io import OutputLock
        lock = OutputLock({str(path)!r}).acquire()
        print("held", flush=True)
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_is_refused_naming_the_first_ones_pid(tmp_path):
    out = tmp_path / "p.parquet.journal.jsonl"
    holder = _holder(out)
    try:
        with pytest.raises(InputError, match=f"pid {holder.pid}"):
            OutputLock(out).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)  # the kernel drops the lock, however the holder ends
        holder.wait()
    with OutputLock(out) as lock:
        assert lock.lock_path.read_text().strip() == str(os.getpid())
    assert not lock.lock_path.exists()


def test_a_second_journal_on_one_output_is_refused_until_the_first_is_closed(tmp_path):
    from modeswitch.engine.profiler import Journal, ProfileSpec

    path = tmp_path / "p.parquet.journal.jsonl"
    spec = ProfileSpec(model="m")
    first = Journal(path, spec)
    with pytest.raises(InputError, match=f"being written by another run \\(pid {os.getpid()}\\)"):
        Journal(path, spec)
    first.add({"request_id": "r", "mode": "m", "trial": 0})
    first.close()
    again = Journal(path, spec)
    assert [r["request_id"] for r in again.rows] == ["r"]  # nothing duplicated, nothing lost
    again.close()


def test_profile_on_an_output_in_use_ends_in_one_line(tmp_path, monkeypatch):
    import modeswitch.engine.models.resolve

    monkeypatch.setattr(modeswitch.engine.models.resolve, "resolve_models", lambda *a, **k: (Path("/models/target"), None, None))
    out = tmp_path / "p.parquet"
    holder = _holder(out.with_name(out.name + ".journal.jsonl"))
    try:
        res = runner.invoke(app, ["profile", "--quick", "--modes", "fp16_baseline", "-o", str(out)])
    finally:
        holder.kill()
        holder.wait()
    assert res.exit_code == 2 and f"pid {holder.pid}" in res.output, res.output
    assert not out.exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_failed_write_leaves_no_temporary_file_and_names_the_path(tmp_path, monkeypatch, code):
    def failing(self, path, **kw):
        Path(path).write_bytes(b"half")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(pd.DataFrame, "to_parquet", failing)
    out = tmp_path / "t.parquet"
    with pytest.raises(InputError, match=str(out)):
        write_parquet(pd.DataFrame({"x": [1]}), out)
    assert list(tmp_path.iterdir()) == []


def test_writing_onto_a_directory_is_one_error(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        write_text("x", tmp_path)


def test_requests_on_a_full_disk_end_in_one_line_and_write_nothing(tmp_path, monkeypatch):
    def full(self, *a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "r.jsonl"
    res = runner.invoke(app, ["requests", "--workloads", "batch_pressure", "-n", "50", "-o", str(out)])
    assert res.exit_code == 2 and "No space left on device" in res.output and str(out) in res.output
    assert len(res.output.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_an_api_key_file_that_is_a_directory_is_one_line(tmp_path):
    res = runner.invoke(app, ["serve", "--router", "rule", "--api-key-file", str(tmp_path)])
    assert res.exit_code == 2 and "Is a directory" in res.output and str(tmp_path) in res.output, res.output


def test_train_with_its_store_under_a_file_is_one_line(tmp_path):
    from tests.helpers import synthetic_table

    data = tmp_path / "t.parquet"
    synthetic_table(("short_prompt_short_output", "batch_pressure"), 10).to_parquet(data)
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = runner.invoke(app, ["train", "--data", str(data), "--routers", "dt", "--trials", "1",
                              "--mlruns", str(blocker / "mlruns")])
    assert res.exit_code == 2 and str(blocker) in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("rows", [1, 2])
def test_a_table_too_small_to_split_is_one_error(rows):
    from modeswitch.routers.training.splits import inner_folds, split_indices
    from tests.helpers import synthetic_table

    table = synthetic_table(("short_prompt_short_output", "batch_pressure"), 10).head(rows)
    with pytest.raises(InputError, match=f"{1 if rows == 2 else rows} row"):
        for tr, _te in split_indices(table, "random"):
            inner_folds(table.iloc[tr], "random", seed=0)


def test_an_interrupted_lock_holder_never_blocks_the_next_run(tmp_path):
    """kill -9 leaves the lock file behind with a dead pid in it; the lock itself is gone."""
    out = tmp_path / "o.jsonl"
    holder = _holder(out)
    holder.kill()
    holder.wait()
    t0 = time.perf_counter()
    OutputLock(out).acquire().release()
    assert time.perf_counter() - t0 < 1.0
