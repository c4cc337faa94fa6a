"""The training table as one object (:class:`TrainingTable`): what training, scoring,
the Python API and the study read from it.

Why: the table used to travel as a raw frame plus ``attrs`` metadata, and every reader
re-derived the same things (the labels, the per-mode safety columns, the feature
columns, the folds), scoring and the API through the trainer's privates. Here each is
derived once, by name, from the frame :mod:`modeswitch.oracle.training_table` writes: one row per
request with its features, ``label`` (the oracle's mode), and per mode ``m`` the
columns ``<metric>__m`` (costs), ``violates_<constraint>__m`` and ``safe__m``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import clone

from modeswitch.dataset.errors import InputError
from modeswitch.oracle.content_columns import TOKEN_IDS
from modeswitch.oracle.training_table import frame_hash, table_meta
from modeswitch.routers.certified import CertifiedRouter
from modeswitch.routers.training.costs import UNSAFE_PENALTY, regret_weights
from modeswitch.routers.training.splits import split_indices

#: training-table columns that describe a label, not the request
NOT_FEATURES = ("label", "label_source", "estimate_basis", "latency_basis", "quality_basis",
                "reference_mode", "condition", "request_id", TOKEN_IDS)


def select_labels(table: pd.DataFrame, labels: str = "all") -> pd.DataFrame:
    """The rows to train and score on: all, or only those labelled from the request's
    own measurements (``labels="measured"``). Training and scoring call it alike, so
    both see the same table (and its hash)."""
    if labels == "all":
        return table.reset_index(drop=True)
    if labels != "measured":
        raise InputError(f"--labels {labels!r}: choose all or measured")
    if "label_source" not in table or not (table["label_source"] == "measured").any():
        raise InputError("--labels measured: the table has no measured labels (build it with "
                         "`dataset build --profiled` from a profile with per-request rows)")
    out = table[table["label_source"] == "measured"].reset_index(drop=True)
    out.attrs = table.attrs
    return out


@dataclass(frozen=True)
class TrainingTable:
    """A training table's rows (``frame``, index 0..n-1, metadata in ``attrs``) and what
    is read from them. Build with :meth:`of` (a frame or a table) or :meth:`read`."""

    frame: pd.DataFrame
    #: the metadata oracle.training_table recorded (modes, constraints, profile hash ...)
    meta: dict = field(repr=False)

    @classmethod
    def of(cls, table, labels: str = "all") -> TrainingTable:
        """``table`` (a frame or a TrainingTable) with the rows ``labels`` selects."""
        if isinstance(table, TrainingTable):
            return table if labels == "all" else cls.of(table.frame, labels)
        meta = table_meta(table)
        return cls(select_labels(table, labels), meta)

    @classmethod
    def read(cls, path, labels: str = "all") -> TrainingTable:
        frame = pd.read_parquet(path)
        frame.attrs["source_path"] = str(Path(path).resolve())
        return cls.of(frame, labels)

    def __len__(self) -> int:
        return len(self.frame)

    # -- what each row says --------------------------------------------------------------
    @property
    def modes(self) -> list[str]:
        return list(self.meta["modes"])

    @property
    def labels(self) -> np.ndarray:
        """The oracle's mode per row."""
        return self.frame["label"].astype(str).to_numpy()

    @property
    def safe(self) -> pd.DataFrame:
        """(rows, modes) booleans: the mode meets every constraint there (unknown: no)."""
        return pd.DataFrame({m: self.frame[f"safe__{m}"].fillna(False).astype(bool).to_numpy()
                             for m in self.modes})

    def costs(self, metric: str = "latency_ms") -> pd.DataFrame:
        """(rows, modes) one per-mode cost column, e.g. each mode's latency."""
        return pd.DataFrame({m: self.frame[f"{metric}__{m}"].to_numpy() for m in self.modes})

    @property
    def feature_columns(self) -> list[str]:
        """The request's columns (what a logged model takes): no per-mode costs, no label."""
        return [c for c in self.frame.columns if "__" not in c and c not in NOT_FEATURES]

    @property
    def features(self) -> pd.DataFrame:
        return self.frame[self.feature_columns]

    @cached_property
    def hash(self) -> str:
        """Names the MLflow experiment and the Optuna studies of this table."""
        return frame_hash(self.frame)

    # -- parts ---------------------------------------------------------------------------
    def folds(self, split: str = "group", test_size: float = 0.25, seed: int = 42) -> list:
        """The (train rows, test rows) splits of :func:`modeswitch.routers.training.splits.split_indices`."""
        return split_indices(self.frame, split, test_size, seed)

    def held_out_family(self, test_rows) -> str:
        """The family a leave-one-family-out fold's ``test_rows`` hold out (its first row's)."""
        return str(self.frame["family"].iloc[test_rows[0]])

    def rows(self, idx) -> TrainingTable:
        """The rows ``idx`` as a table of their own (same metadata)."""
        part = self.frame.iloc[np.asarray(idx)].reset_index(drop=True)
        part.attrs = dict(self.frame.attrs)
        return TrainingTable(part, self.meta)

    # -- fitting as training fits ----------------------------------------------------------
    def fit(self, router, rows=None, regret_weighted: bool = False,
            unsafe_penalty: float = UNSAFE_PENALTY):
        """Fit ``router`` on ``rows`` (default: all) as training fits it: the labels, the
        regret weights when it was tuned with them, the safety labels from the
        ``safe__<mode>`` columns (read by the routers that need them)."""
        part = self if rows is None else self.rows(rows)
        w = regret_weights(part.frame, part.modes, unsafe_penalty) if regret_weighted else None
        return router.fit(part.frame, part.labels, sample_weight=w)

    def refit(self, router, rows, regret_weighted: bool = False, unsafe_penalty: float = UNSAFE_PENALTY,
              params: dict | None = None):
        """A fresh clone of the fitted ``router`` (same hyperparameters) fitted on ``rows``.
        ``params``: the family's hyperparameters to set on the clone instead (a nested
        leave-one-family-out fold's own, as training tuned them); on a certified router
        they go to the router it certifies."""
        fresh = clone(router)
        if params:
            inner = "router__" if isinstance(fresh, CertifiedRouter) else ""
            fresh.set_params(**{inner + k: v for k, v in params.items()})
        return self.fit(fresh, rows, regret_weighted, unsafe_penalty)
