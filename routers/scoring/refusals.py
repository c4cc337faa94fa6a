"""What stopped a certificate: the calibration picks that broke a limit at the first
threshold Learn then Test refused (``certificate_refusals.csv``, the report's "What the
certificate refused").

Why: "What the certificate costs" (:mod:`modeswitch.routers.scoring.threshold_sweep`) says how much
saving the certificate gives up, not why. The certificate walks its thresholds from the
strictest and stops at the first one whose calibration picks violate too often; those
picks are the reason, and they are rarely spread evenly: a handful of (family, mode)
pairs, decided by models that never saw the family, where the mode is slower than the
reference or loses quality. A table of them names what a better latency or risk model
(or a feature) has to fix before the certificate can loosen (docs/scoring.md has the
per-request CPU study's).

Each row: one (calibration family, picked mode, limit broken) at the refused threshold,
with how many calibration picks broke it, the family's calibration rows, their median
latency ratio to the reference and median concurrency. Leave one family out: one
certificate per held-out family, named in ``held_out``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.experimental import experimental_func
from modeswitch.routers.certified import CertifiedRouter

#: the limits a pick can break, as the training table's ``violates_<limit>__<mode>`` columns name them
LIMITS = ("quality", "energy", "memory")
COLUMNS = ["held_out", "threshold", "refused_threshold", "family", "mode", "limit", "violations",
           "calibration_rows", "median_latency_ratio", "median_concurrency"]


def _true(value) -> bool:
    """A table cell as a boolean, a missing one False (as the certificate reads labels)."""
    return bool(pd.notna(value) and value)


def refusal_rows(certified: CertifiedRouter, table: pd.DataFrame, held_out: str = "") -> pd.DataFrame:
    """The violating calibration picks at ``certified``'s refused threshold, grouped by
    (family, mode, limit), looked up in ``table`` by request id. Empty where the walk
    refused nothing, or where the router predates the record (``refused_picks_``,
    ``calibration_request_ids_``)."""
    picks = getattr(certified, "refused_picks_", None)
    ids = getattr(certified, "calibration_request_ids_", None)
    if picks is None or ids is None or len(ids) == 0:
        return pd.DataFrame(columns=COLUMNS)
    by_id = table.assign(_id=table["request_id"].astype(str)).drop_duplicates("_id").set_index("_id")
    missing = [i for i in ids if i not in by_id.index]
    if missing:
        raise ValueError(f"{len(missing)} calibration request(s) are not in the table (e.g. {missing[0]!r}): "
                         "not the table the router was trained on")
    ref = certified.router_.reference_
    out = []
    for rid, mode in zip(ids, np.asarray(picks, dtype=object)):
        row = by_id.loc[rid]
        if mode == ref or _true(row.get(f"safe__{mode}")):
            continue
        broken = [k for k in LIMITS if _true(row.get(f"violates_{k}__{mode}"))]
        ref_ms = row.get(f"latency_ms__{ref}", np.nan)
        out.append({"family": str(row.get("family", "")), "mode": str(mode), "limit": "+".join(broken) or "unmeasured",
                    "latency_ratio": row.get(f"latency_ms__{mode}", np.nan) / ref_ms if ref_ms else np.nan,
                    "concurrency": row.get("concurrent_requests", np.nan)})
    if not out:
        return pd.DataFrame(columns=COLUMNS)
    cal_rows = by_id.loc[list(ids), "family"].astype(str).value_counts()
    g = pd.DataFrame(out).groupby(["family", "mode", "limit"], sort=False).agg(
        violations=("mode", "size"), median_latency_ratio=("latency_ratio", "median"),
        median_concurrency=("concurrency", "median")).reset_index()
    g["calibration_rows"] = g["family"].map(cal_rows).fillna(0).astype(int)
    g["held_out"] = held_out
    g["threshold"] = certified.threshold_
    g["refused_threshold"] = certified.refused_threshold_
    return g.sort_values("violations", ascending=False, kind="stable")[COLUMNS].reset_index(drop=True)


@experimental_func
def certificate_refusals(parts_by_router: dict, table: pd.DataFrame) -> pd.DataFrame:
    """Every certified router's refusal rows (:func:`refusal_rows`). ``parts_by_router``:
    ``{router name: {held-out family or None: CertifiedRouter}}``
    (:func:`modeswitch.routers.scoring.threshold_sweep.certified_parts`); ``table``: the training
    table the routers were trained on."""
    frames = [refusal_rows(c, table, key or "").assign(router=name)
              for name, parts in parts_by_router.items() for key, c in parts.items()]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=["router", *COLUMNS])
    return pd.concat(frames, ignore_index=True)[["router", *COLUMNS]]
