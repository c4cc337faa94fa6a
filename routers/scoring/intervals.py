"""95 % bootstrap intervals for family-weighted aggregates of per-request scores.

The headline figures weigh every workload family equally (the mean of family
values), so an interval must too: each resample draws requests with replacement
*within* each family, recomputes every family's value and averages them. Used by
the offline and the live scores alike.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd


def family_weighted(per_request: pd.DataFrame, figures: Callable[[pd.DataFrame], dict]) -> dict:
    """The mean over families of ``figures(family rows)``."""
    fams = [g for _, g in per_request.groupby("family", sort=True)]
    return pd.DataFrame([figures(f) for f in fams]).mean().to_dict()


def family_bootstrap(per_request: pd.DataFrame, figures: Callable[[pd.DataFrame], dict],
                     names, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """``{name}_low`` / ``{name}_high`` for each figure in ``names``."""
    rng = np.random.default_rng(seed)
    fams = [g.reset_index(drop=True) for _, g in per_request.groupby("family", sort=True)]
    boots = []
    for _ in range(n_boot):
        sample = [f.iloc[rng.integers(0, len(f), len(f))] for f in fams]
        boots.append(pd.DataFrame([figures(f) for f in sample]).mean())
    b = pd.DataFrame(boots)
    lo, hi = (1 - level) / 2, (1 + level) / 2
    out = {}
    for k in names:
        out[f"{k}_low"], out[f"{k}_high"] = float(b[k].quantile(lo)), float(b[k].quantile(hi))
    return out
