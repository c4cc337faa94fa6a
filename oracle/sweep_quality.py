"""Quality from a quality sweep (:mod:`modeswitch.engine.quality_sweep`): measured per request.

Without a sweep, a request the profile did not measure gets each mode's ROUGE-L and
accuracy by interpolation between measured requests, and the study's rule judges a
family on the mean of its few measured requests. With one, every swept request
carries its own measured quality per mode, and the family means the rule judges come
from the sweep's requests (hundreds per family, against a profile's handful); a
(family, mode) the sweep did not run keeps the profile's mean.

Latency, energy and memory stay the profile's: the sweep times nothing.
"""

from __future__ import annotations

import pandas as pd

from modeswitch.oracle import family_rule

#: the quality metrics a sweep measures (the estimate's columns of the same names)
SWEPT = ("rouge_l_vs_baseline", "accuracy")
#: ``quality_basis`` values
SWEEP, PROFILE, ESTIMATED = "measured (sweep)", "measured (profile)", "estimated"
#: the estimate's column holding a request's predicted P(fail) (:mod:`modeswitch.oracle.quality_risk`)
RISK = "quality_risk"


def apply(est: pd.DataFrame, basis: pd.DataFrame, sweep: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``est`` (indexed by unit, mode) with the sweep's quality where it measured that
    (request, mode); ``basis`` with each request's ``quality_basis``."""
    est = est.copy()
    basis = basis.copy()
    measured = basis["label_source"].eq("measured") & basis["estimate_basis"].eq("measured request")
    basis["quality_basis"] = measured.map({True: PROFILE, False: ESTIMATED})
    if sweep is None or sweep.empty:
        return est, basis
    s = sweep.rename(columns={"request_id": "unit"}).set_index(["unit", "mode"])[list(SWEPT)]
    hit = s.index.intersection(est.index)
    if len(hit):
        for col in SWEPT:  # where the sweep measured it (a request without a gold answer has no accuracy)
            got = s.loc[hit, col]
            est.loc[got.index[got.notna()], col] = got[got.notna()].to_numpy()
        swept = hit.get_level_values("unit").unique()
        basis.loc[basis.index.isin(swept), "quality_basis"] = SWEEP
    return est, basis


def family_table(sweep: pd.DataFrame, requests: pd.DataFrame, profile_table: pd.DataFrame) -> pd.DataFrame:
    """The per-(group, mode) quality the rule judges: from the sweep's requests where the
    sweep ran that (group, mode), else the profile's (``profile_table``, the same shape:
    :func:`modeswitch.oracle.family_rule.family_quality`)."""
    if sweep is None or sweep.empty:
        return profile_table
    req = requests.set_index("id")
    swept = sweep[sweep["request_id"].isin(req.index)]
    if swept.empty:
        return profile_table
    groups = family_rule.group_of(req.loc[swept["request_id"].unique()])
    metrics = swept.rename(columns={"request_id": "unit"}).set_index(["unit", "mode"])[list(SWEPT)]
    reference_of = swept.drop_duplicates("request_id").set_index("request_id")["reference_mode"]
    table = family_rule.family_quality(metrics, groups, reference_of)
    return table.combine_first(profile_table) if profile_table is not None else table
