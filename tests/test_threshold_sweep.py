"""A certified router's threshold swept over held-out requests (routers.scoring.threshold_sweep):
the curve passes through the certified point, starts at the reference, and the report
splits the distance from the ceiling into what the predictions and the certificate cost.
Synthetic tables with a known shift (tests.test_group_certificates)."""

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from modeswitch.routers.certified import CertifiedRouter
from modeswitch.routers.families.cost import LinearCostRouter
from modeswitch.routers.registry import get_router
from modeswitch.routers.scoring import report
from modeswitch.routers.scoring.capture import capture_and_violations, envelope, router_points
from modeswitch.routers.scoring.offline import aggregate_scores, score_requests
from modeswitch.routers.scoring.overhead import Overhead
from modeswitch.routers.scoring.threshold_sweep import (
    certificate_price,
    picks_at,
    router_curves,
    targets_of,
)
from tests.test_cost_routers import FAST, QUANT, REF
from tests.test_group_certificates import shifted_table

TARGET = 0.05


def held_out(seed: int, **kw) -> pd.DataFrame:
    """New requests with the metadata the offline scorer reads."""
    t = shifted_table(150, seed=seed, **kw)
    t.attrs["modeswitch"] = json.dumps({"modes": [REF, FAST, QUANT]})
    return t


def certified(train) -> CertifiedRouter:
    return CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=TARGET, cross_fit_groups=True,
                           calibrate_on="all").fit(train)


def point(test, picks) -> tuple[float, float]:
    return capture_and_violations(score_requests(test, np.asarray(picks, dtype=object)))


def test_the_curve_starts_at_the_reference_and_passes_through_the_certified_point():
    r, test = certified(shifted_table(150, seed=3)), held_out(7)
    assert r.threshold_ is not None  # something certified: the point below is not the reference's
    curves = router_curves({"cost": r, "reference": get_router("dt")}, test)
    assert set(curves["router"]) == {"cost"}  # only certified routers have a threshold to sweep
    assert (curves["decision"] == "served").all() and (curves["requests"] == len(test)).all()
    at = curves.loc[np.isclose(curves["threshold"], r.threshold_)].iloc[0]
    assert (at["capture"], at["violations"]) == pytest.approx(point(test, r.predict(test)))
    strictest = curves.loc[curves["threshold"].idxmin()]
    assert strictest["capture"] == pytest.approx(0.0) and strictest["violations"] == 0.0
    assert curves["capture"].max() > at["capture"]  # looser thresholds keep more (and break more)
    assert curves["violations"].max() > at["violations"]
    assert len(curves) > 10


def test_each_family_is_decided_by_its_own_folds_router_at_one_threshold():
    """Leave one family out: ``by_family`` routers, each deciding its own family's rows."""
    train = shifted_table(150, seed=3, shifted=("c",), plain=("a", "b"))
    folds = {f: certified(train[train["family"] != f].reset_index(drop=True)) for f in ("a", "c")}
    test = held_out(11, shifted=("c",), plain=("a",))
    lofo = SimpleNamespace(by_family=folds)
    curves = router_curves({"cost": lofo}, test)
    t = float(np.median(curves["threshold"]))
    t = curves["threshold"].iloc[np.argmin(np.abs(curves["threshold"] - t))]
    fam = test["family"].to_numpy()
    picks = np.empty(len(test), dtype=object)
    for f, r in folds.items():
        picks[fam == f] = picks_at(r, test[fam == f], [t])[0]
    got = curves.loc[curves["threshold"] == t].iloc[0]
    assert (got["capture"], got["violations"]) == pytest.approx(point(test, picks))
    assert targets_of({"cost": lofo, "dt": get_router("dt")}) == {"cost": TARGET}


def test_a_router_without_scores_is_swept_through_its_threshold_and_left_as_served():
    """A guarded classifier has no row scores: each threshold is set, decided, and the
    certified one set back."""
    train = shifted_table(150, seed=3)
    r = CertifiedRouter(get_router("lr", safety_threshold=0.5, fallback="reference"), target_violation_rate=TARGET,
                        cross_fit_groups=True, calibrate_on="all").fit(train, train["label"].to_numpy())
    test = held_out(7)
    assert r.threshold_ is not None
    before = np.asarray(r.predict(test), dtype=object)
    picks = picks_at(r, test, [r.threshold_, 0.5])
    assert (picks[0] == before).all()
    r.router_.set_risk_threshold(0.5)
    loose = np.asarray(r.router_.predict(test), dtype=object)
    r.router_.set_risk_threshold(r.threshold_)
    assert (picks[1] == loose).all() and (loose != before).any()  # the sweep moved the decision
    assert (np.asarray(r.predict(test), dtype=object) == before).all()  # the served threshold is back


def test_the_price_sets_the_certified_point_beside_hindsight_and_the_ceiling(tmp_path):
    r, test = certified(shifted_table(150, seed=3)), held_out(7)
    curves = router_curves({"cost": r}, test)
    per = score_requests(test, np.asarray(r.predict(test), dtype=object), router="cost")
    ceiling = envelope(pd.DataFrame({"violations": [0.0, 0.02, 0.2], "capture": [0.5, 0.9, 1.2],
                                     "safe_capture": [0.5, 0.7, 0.1]}))
    own = envelope(pd.DataFrame({"violations": [0.0, 0.01, 0.2], "capture": [0.0, 0.3, 1.0]}))
    price = certificate_price(curves, router_points(per), {"cost": TARGET}, ceiling, own).iloc[0]
    under = curves[curves["violations"] <= TARGET]
    assert price["hindsight_capture"] == pytest.approx(under["capture"].max())
    assert price["hindsight_violations"] <= TARGET and price["hindsight_capture"] >= price["certified_capture"]
    assert (price["certified_capture"], price["certified_violations"]) == pytest.approx(point(test, r.predict(test)))
    assert price["ceiling_capture"] == pytest.approx(0.9)  # the envelope's best at <= 5 %
    assert price["ceiling_safe_capture"] == pytest.approx(0.7)  # its safe picks' saving alone
    md = "\n".join(report._price_md(pd.DataFrame([price])))
    assert "## What the certificate costs" in md and f"hindsight {price['hindsight_capture']:.1%}" in md
    assert "counting safe picks' saving alone: 70.0%" in md
    # the routers' own rule's ceiling beside the best rule's
    assert price["ceiling_rule_capture"] == pytest.approx(0.3)
    assert "by these routers' own rule, the fastest mode under a risk threshold: 30.0%" in md


def test_the_report_writes_what_each_certificate_refused(tmp_path):
    """certificate_refusals.csv and its README lines, one per certificate (leave one family
    out: per held-out family), from the calibration picks at the refused threshold."""
    from modeswitch.routers.scoring.refusals import certificate_refusals

    train = shifted_table(100, seed=5)
    parts = {"a": certified(train[train["family"] != "a"]), "c": certified(train[train["family"] != "c"])}
    got = certificate_refusals({"cost": parts}, train)
    assert set(got["held_out"]) <= {"a", "c"} and len(got)
    for held, g in got.groupby("held_out"):
        assert held not in set(g["family"])  # its certificate never calibrated on the held-out family
        assert (g["refused_threshold"] == parts[held].refused_threshold_).all()
    md = "\n".join(report._refusals_md(got))
    first = got.iloc[0]
    assert "## What the certificate refused" in md and f"(held out: {first['held_out']})" in md
    assert f"{first['mode']} on {first['family']} ({first['limit']}) {int(first['violations'])} of" in md
    test = held_out(7)
    per = score_requests(test, np.asarray(parts["a"].predict(test), dtype=object), router="cost")
    per_family, overall = aggregate_scores(per)
    files = report.write_report(tmp_path / "r", per_request=per, per_family=per_family, overall=overall,
                                overhead={"cost": Overhead("cost", "compiled", 10, 1.0, 1.0, 1.0, None)},
                                context={"name": "t"}, certificate_refusals=got)
    assert tmp_path / "r" / "certificate_refusals.csv" in files
    assert len(pd.read_csv(tmp_path / "r" / "certificate_refusals.csv")) == len(got)
    assert "## What the certificate refused" in (tmp_path / "r" / "README.md").read_text()
