"""Which held-out requests lie outside the training data, and the certified targets.

Why: no router predicts a condition never varied in training (hold out the only
family with concurrency above 1 and the batching modes' gain is unseen). A score
that mixes such requests with covered ones hides where a router interpolates and
where it guesses. Per held-out request, :func:`coverage` names the numeric
features (feature set A) whose value lies outside the range the router's training
part spans (per fold: with leave-one-family-out each family against the others);
the report then scores covered and extrapolated requests apart
(:func:`split_headlines`).

:func:`risk_table` puts each certified router's target violation rate next to the
rate it reached on the calibration requests and on the held-out ones (offline and
live), so the guarantee can be checked where it is claimed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from modeswitch.dataset.features import FEATURE_SET_A
from modeswitch.routers.risk_control import sampling_slack
from modeswitch.routers.scoring.offline import aggregate_scores
from modeswitch.routers.scoring.report import headline_table


def coverage(table: pd.DataFrame, folds) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per request: ``request_id``, ``extrapolated``, ``outside`` (feature names),
    per family: each feature outside the training range with both ranges).

    ``folds``: (train positions, test positions) of the split; a request is judged
    against the training part of the fold that holds it out."""
    rows, fams = [], []
    for tr, te in folds:
        train, test = table.iloc[tr], table.iloc[te]
        lo = train[list(FEATURE_SET_A)].min()
        hi = train[list(FEATURE_SET_A)].max()
        vals = test[list(FEATURE_SET_A)]
        out = (vals.lt(lo, axis=1) | vals.gt(hi, axis=1))
        for rid, flags in zip(test["request_id"].astype(str), out.to_numpy()):
            names = [f for f, b in zip(FEATURE_SET_A, flags) if b]
            rows.append({"request_id": rid, "extrapolated": bool(names), "outside": ",".join(names)})
        for fam, g in test.groupby(test["family"].astype(str)):
            o = out.loc[g.index]
            for f in FEATURE_SET_A:
                if o[f].any():
                    fams.append({"family": fam, "feature": f, "requests_outside": int(o[f].sum()),
                                 "requests": len(g), "family_min": float(g[f].min()),
                                 "family_max": float(g[f].max()), "train_min": float(lo[f]),
                                 "train_max": float(hi[f])})
    per = pd.DataFrame(rows).drop_duplicates("request_id")
    cols = ["family", "feature", "requests_outside", "requests", "family_min", "family_max",
            "train_min", "train_max"]
    return per, pd.DataFrame(fams, columns=cols)


def split_headlines(per_request: pd.DataFrame, overhead: dict, marks: pd.DataFrame) -> dict:
    """Headline tables (equal family weights) over covered and over extrapolated
    held-out requests; a part with no request is left out."""
    pr = per_request if "extrapolated" in per_request else \
        per_request.merge(marks[["request_id", "extrapolated"]], on="request_id", how="left")
    pr = pr.copy()
    pr["extrapolated"] = pr["extrapolated"].fillna(False).astype(bool)
    out = {}
    for name, part in (("inside", pr[~pr["extrapolated"]]), ("extrapolated", pr[pr["extrapolated"]])):
        if len(part):
            _, overall = aggregate_scores(part.drop(columns=["extrapolated", "outside"], errors="ignore"))
            out[name] = headline_table(overall, overhead)
    return out


def risk_table(routers: dict, head: pd.DataFrame, live_summary: pd.DataFrame | None,
               held_out: int = 0, live_requests: int = 0) -> pd.DataFrame:
    """Per router with a certified threshold: target, confidence, calibration requests,
    the threshold, the calibration's violation rate and upper bound, and the held-out
    violation rate offline (and live, where run), with the slack the ``held_out``
    test requests allow by chance (:func:`modeswitch.routers.risk_control.sampling_slack`, at the
    certificate's delta; the rate is family-weighted, the slack counts requests):
    ``met_offline`` is the rate within target + slack, ``met_strictly`` within target;
    live, ``live_slack`` and ``met_live`` the same over the ``live_requests``."""
    live = live_summary.set_index("router") if live_summary is not None else None
    rows = []
    for name, r in routers.items():
        cal = getattr(r, "calibration_", None)
        folds = getattr(r, "by_family", None)
        if folds:  # leave one family out: the routers scored are the folds' refits
            cals = [getattr(m, "calibration_", None) for m in folds.values()]
            cals = [c for c in cals if c]
            if not cals:
                continue
            done = [c for c in cals if c["threshold"] is not None]
            cal = {"alpha": cals[0]["alpha"], "delta": cals[0]["delta"],
                   "n": int(np.median([c["n"] for c in cals])),
                   "threshold": float(np.median([c["threshold"] for c in done])) if done else None,
                   "rate": float(np.mean([c["rate"] for c in cals])),
                   "upper_bound": float(np.max([c["upper_bound"] for c in cals]))}
            certified_folds = f"{len(done)}/{len(cals)} folds"
        else:
            certified_folds = None
        if not cal:
            continue
        rec = {"router": name, "target": cal["alpha"], "confidence": 1 - cal["delta"],
               "calibration_requests": cal["n"], "certified": cal["threshold"] is not None,
               "threshold": cal["threshold"], "calibration_rate": cal["rate"],
               "calibration_upper_bound": cal["upper_bound"],
               "held_out_rate": float(head.loc[name, "violation_rate_any"]) if name in head.index else math.nan}
        if certified_folds:
            rec["certified"] = certified_folds  # thresholds: the folds' median
        if live is not None and name in live.index:
            rec["live_rate"] = float(live.loc[name, "violation_rate_any"])
            if live_requests:
                rec["live_requests"] = int(live_requests)
                rec["live_slack"] = sampling_slack(cal["alpha"], live_requests, cal["delta"])
                rec["met_live"] = bool(rec["live_rate"] <= cal["alpha"] + rec["live_slack"]) \
                    if np.isfinite(rec["live_rate"]) else None
        slack = sampling_slack(cal["alpha"], held_out, cal["delta"]) if held_out else math.nan
        rec["held_out_requests"], rec["held_out_slack"] = int(held_out), slack
        ok = np.isfinite(rec["held_out_rate"])
        rec["met_offline"] = bool(rec["held_out_rate"] <= cal["alpha"] + (slack if held_out else 0.0)) if ok else None
        rec["met_strictly"] = bool(rec["held_out_rate"] <= cal["alpha"]) if ok else None
        rows.append(rec)
    return pd.DataFrame(rows)


def measurement_sources(table: pd.DataFrame) -> pd.Series:
    """Each request's measurement source, by request id: a measured request is its own;
    an estimated one shares its ``estimate_basis`` (the nearest measured cell it copies,
    or the pool of cells it is interpolated in) with every request estimated alike; a
    table without that column makes every request its own. Why: the binomial slack
    counts requests as independent, but 28 of one family's 104 rows could copy a single
    measured cell (the per-request study, long_prompt_short_output), so eight violations
    may be four measurements."""
    ids = table["request_id"].astype(str)
    if "estimate_basis" not in table:
        out = pd.Series(ids.to_numpy(), index=ids.to_numpy())
    else:
        # the same cell or pool, whether or not the cost model later took some modes' latency
        basis = (table["estimate_basis"].astype(str).str.replace(" (outside measured range)", "", regex=False)
                 .str.split("; cost model").str[0])
        own = basis.str.startswith("measured") | basis.eq("external")
        out = pd.Series(np.where(own, "request " + ids, basis), index=ids.to_numpy())
    return out[~out.index.duplicated()]  # one per request, as the report looks them up


def risk_by_family(routers: dict, per_request: pd.DataFrame, sources: pd.Series | None = None) -> pd.DataFrame:
    """Per certified router and held-out family: the certificate's target next to the
    family's own held-out violation rate, with the slack its request count allows by
    chance (``met``: within target + slack). A certificate that holds on average can
    break in one family (the group split's cost LightGBM: 2.08 % against 1 %, all in
    one family); this table shows where. ``sources`` (:func:`measurement_sources`): also
    how many distinct measurement sources the family's requests and its violations
    rest on (``sources``, ``violating_sources``), since the slack counts requests.
    ``calibration_families``: how many families the certificate was held to one by one
    (:func:`new_family_breaks` reads it where the family was not one of them)."""
    rows = []
    for name, r in routers.items():
        folds = getattr(r, "by_family", None)
        mine = per_request[per_request["router"] == name]
        for fam, g in mine.groupby("family"):
            # leave one family out: each family was scored by its own fold's refit
            model = folds.get(fam, r) if folds else r
            cal = getattr(model, "calibration_", None)
            if not cal:
                continue
            n = len(g)
            rate = float(g["violates_any"].astype(bool).mean()) if n else math.nan
            slack = sampling_slack(cal["alpha"], n, cal["delta"])
            groups = cal.get("groups") or {}
            rec = {"router": name, "family": fam, "target": cal["alpha"], "requests": n,
                   "held_out_rate": rate, "slack": slack, "met": bool(rate <= cal["alpha"] + slack),
                   "calibrated_per_family": bool(groups),
                   "calibration_families": len({m for v in groups.values() for m in v["members"]}),
                   "calibration_rate_of_family": next((v["rate"] for v in groups.values()
                                                        if fam in v["members"]), math.nan)}
            if sources is not None:
                src = sources.reindex(g["request_id"].astype(str)).to_numpy()
                bad = g["violates_any"].astype(bool).to_numpy()
                rec["sources"] = int(pd.unique(src).size)
                rec["violating_sources"] = int(pd.unique(src[bad]).size)
            rows.append(rec)
    return pd.DataFrame(rows)


def new_family_breaks(by_family: pd.DataFrame) -> dict | None:
    """What a certificate held family by family can promise a family it never saw, set
    beside what happened (None where no held-out family was new to its certificate).

    Why: certified in each of its K calibration families, a certificate says nothing of
    a new family beyond where that family stands among them. If families are
    exchangeable, the new one's own rate is the highest of the K + 1 with chance
    1 / (K + 1); only then can it break the target (beyond the certificate's own
    delta). Leaving one of seven families out, that is one fold in seven per router,
    however many requests each family holds: a bound on the design, not on the routers,
    which only more families (or feedback, :mod:`modeswitch.routers.adaptive`) can tighten."""
    if by_family is None or not len(by_family) or "calibration_families" not in by_family:
        return None
    # certified family by family (K > 0), and the family not among them
    new = by_family[(by_family["calibration_families"] > 0) & by_family["calibration_rate_of_family"].isna()]
    if not len(new):
        return None
    k = int(new["calibration_families"].median())  # the text's K; each pair's own K sets its chance
    return {"pairs": len(new), "calibration_families": k, "chance": 1.0 / (k + 1),
            "expected": float((1.0 / (new["calibration_families"] + 1)).sum()),
            "broken": int((~new["met"].astype(bool)).sum())}

