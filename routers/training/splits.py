"""Train/test splits of a training table.

* ``random``: stratified by label (75/25 by default), the study's only split;
* ``group`` (default): whole workload families held out, so no family appears on
  both sides (the test measures generalisation to unseen request populations);
* ``lofo``: leave one family out, one fold per family.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.model_selection import (
    GroupKFold,
    GroupShuffleSplit,
    KFold,
    LeaveOneGroupOut,
    StratifiedKFold,
    train_test_split,
)

from modeswitch.dataset.errors import InputError

SPLITS = ("random", "group", "lofo")
#: where leave-one-family-out tunes: one study per fold, on its training families only
#: ("nested"), or one on every row ("pooled"); routers.training.trainer says why nested
LOFO_TUNING = ("nested", "pooled")


def split_indices(table: pd.DataFrame, split: str = "group", test_size: float = 0.25,
                  seed: int = 42) -> list[tuple[np.ndarray, np.ndarray]]:
    """Folds as (train positions, test positions); one fold unless ``lofo``."""
    n = len(table)
    idx = np.arange(n)
    groups = table["family"].astype(str).to_numpy()
    if split == "random":
        n_test = int(np.ceil(test_size * n))
        if n_test < 1 or n - n_test < 1:
            raise InputError(f"the table has {n} row(s): a random split with test size {test_size} leaves "
                             f"its {'test' if n_test < 1 else 'training'} part empty; it needs more rows")
        y = table["label"].astype(str)
        counts = y.value_counts()
        strat = y if counts.min() >= 2 and len(counts) * 2 <= n * test_size else None
        tr, te = train_test_split(idx, test_size=test_size, random_state=seed, stratify=strat)
        return [(np.sort(tr), np.sort(te))]
    if split == "group":
        if len(set(groups)) < 2:
            raise InputError("a group split needs at least two workload families")
        gss = GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=seed)
        return [next(gss.split(idx, groups=groups))]
    if split == "lofo":
        if len(set(groups)) < 2:
            raise InputError("leave-one-family-out needs at least two workload families")
        return list(LeaveOneGroupOut().split(idx, groups=groups))
    raise InputError(f"unknown split {split!r}; choose one of {SPLITS}")


def inner_folds(table: pd.DataFrame, split: str, seed: int, n_folds: int = 3):
    """Validation folds inside a training part, of the same kind as the outer split."""
    idx = np.arange(len(table))
    groups = table["family"].astype(str).to_numpy()
    if split in ("group", "lofo") and len(set(groups)) >= 2:
        k = min(n_folds, len(set(groups)))
        return list(GroupKFold(n_splits=k).split(idx, groups=groups))
    y = table["label"].astype(str).to_numpy()
    k = max(2, min(n_folds, pd.Series(y).value_counts().min()))
    if pd.Series(y).value_counts().min() >= 2:
        return list(StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(idx, y))
    if len(idx) < 2:
        raise InputError(f"the training part has {len(idx)} row(s): tuning needs at least 2 to validate on")
    return list(KFold(n_splits=min(n_folds, len(idx)), shuffle=True, random_state=seed).split(idx))
