"""How much of the oracle's saving a router can keep when its safety knowledge comes
from the request's features: a ceiling for the cost routers' kind of decision.

Why: a router is asked for a share of the oracle's latency saving at a violation
rate cap (#16: >= 90 % at <= 2 % on held-out families). Whether that is reachable
depends first on whether a mode's safety on a request can be told from the request's
features at all, which no tuning of the router changes. Here each mode's safety is
predicted out of fold (one classifier per mode on ``safe__<mode>``; the project's own
splits: ``random`` and ``group`` hold one part out, ``lofo`` every family in turn),
each mode's latency is taken as *known* (the measured one: no latency model does
better), and three decision rules are walked over their knob:

* ``threshold``: the fastest mode whose predicted risk is at most t, else the
  reference (the cost-predicting routers' rule), over t;
* ``relative``: the largest relative saving ``1 - latency / reference latency`` less
  ``lam x risk`` (the reference: no saving, no risk), over lam;
* ``absolute``: the same with the saving in milliseconds (what capture sums).

The knob is chosen on the scored requests themselves, so each figure is optimistic
for its rule. It is a ceiling for these rules with this safety model, not for every
router: per-mode thresholds or a better safety model could do better, so each
mode's out-of-fold AUC is reported with it. Capture and violations are over requests
(not family-weighted as the scoring report's headline is). By default only held-out
requests inside the training part's feature ranges are scored
(:func:`modeswitch.routers.scoring.coverage.coverage`, as the report's "inside" part).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from modeswitch.dataset.features import feature_columns
from modeswitch.experimental import experimental_func
from modeswitch.routers.scoring import coverage

RISK_MODELS = ("lgbm", "lr")


def _risk_model(name: str, seed: int) -> object:
    if name == "lgbm":
        from lightgbm import LGBMClassifier  # lazy: LightGBM is optional

        return LGBMClassifier(n_estimators=200, num_leaves=15, learning_rate=0.05, min_child_samples=10,
                              verbose=-1, random_state=seed)
    if name == "lr":
        # lazy: scikit-learn is heavy
        from sklearn.compose import make_column_selector, make_column_transformer
        from sklearn.linear_model import LogisticRegression  # lazy: scikit-learn is heavy
        from sklearn.pipeline import make_pipeline  # lazy: scikit-learn is heavy
        from sklearn.preprocessing import OneHotEncoder, StandardScaler

        return make_pipeline(make_column_transformer(
            (StandardScaler(), make_column_selector(dtype_include="number")),
            (OneHotEncoder(handle_unknown="ignore"), make_column_selector(dtype_include="category"))),
            LogisticRegression(C=1.0, max_iter=2000))
    raise ValueError(f"risk model {name!r}: choose one of {RISK_MODELS}")


@dataclass(frozen=True)
class Frontier:
    split: str
    #: held-out requests scored (inside the training ranges unless asked otherwise)
    scored: int
    #: out-of-fold AUC of each mode's safety model, where both outcomes occur
    auc: dict[str, float]
    #: (rule, knob, capture, safe_capture, violations): one row per threshold / lam
    #: walked; rules ``threshold``, ``relative``, ``absolute``. ``capture`` counts every
    #: pick's saving, as the scoring report's capture does; ``safe_capture`` only the
    #: safe picks' (an unsafe pick saves nothing a deployment may keep)
    curve: pd.DataFrame

    def best_capture(self, cap: float, rule: str | None = None, safe: bool = False) -> float:
        """The largest capture (``safe``: safe picks' saving alone) at a violation rate <=
        ``cap`` (any rule, or ``rule``); NaN when no point of the walk is that safe."""
        c = self.curve if rule is None else self.curve[self.curve["rule"] == rule]
        ok = c[c["violations"] <= cap + 1e-12]
        return float(ok["safe_capture" if safe else "capture"].max()) if len(ok) else float("nan")


@experimental_func
def frontier(table: pd.DataFrame, split: str = "lofo", feature_set: str = "A", risk_model: str = "lgbm",
             inside_only: bool = True, test_size: float = 0.25, seed: int = 42) -> Frontier:
    """The capture / violation frontier of ``table`` (a training table: ``request_id``,
    features, ``family``, ``label``, ``reference_mode``, ``latency_ms__<mode>`` and
    ``safe__<mode>``)."""
    from sklearn.base import clone  # lazy: scikit-learn is heavy
    from sklearn.metrics import roc_auc_score  # lazy: scikit-learn is heavy

    from modeswitch.routers.training.splits import split_indices  # lazy: pulls scikit-learn, scipy

    modes = [c.split("__", 1)[1] for c in table.columns
             if c.startswith("safe__") and f"latency_ms__{c.split('__', 1)[1]}" in table.columns]
    ref = str(table["reference_mode"].iloc[0])
    if ref not in modes:
        raise ValueError(f"the reference mode {ref} has no latency_ms__/safe__ columns in the table")
    X = table[list(feature_columns(feature_set))].copy()
    for c in X.columns:
        if not pd.api.types.is_numeric_dtype(X[c]):
            X[c] = X[c].astype(str).astype("category")
    lat = np.column_stack([table[f"latency_ms__{m}"].to_numpy(float) for m in modes])
    safe = np.column_stack([table[f"safe__{m}"].fillna(False).to_numpy(bool) for m in modes])
    r = modes.index(ref)
    model = _risk_model(risk_model, seed)

    p_safe = np.ones_like(lat)
    tested = np.zeros(len(table), bool)
    folds = split_indices(table, split, test_size=test_size, seed=seed)
    inside = np.ones(len(table), bool)
    if inside_only:
        marks = coverage.coverage(table, folds)[0].set_index("request_id")["extrapolated"]
        inside = ~table["request_id"].astype(str).map(marks).fillna(True).to_numpy(bool)
    for tr, te in folds:
        tested[te] = True
        for j in range(len(modes)):
            y = safe[tr, j]
            if y.all() or not y.any():
                p_safe[te, j] = float(y.mean())
            else:
                p_safe[te, j] = clone(model).fit(X.iloc[tr], y).predict_proba(X.iloc[te])[:, 1]
    keep = (tested & inside if inside_only else tested) & np.isfinite(lat[:, r])
    rows = np.flatnonzero(keep)
    if not len(rows):
        return Frontier(split, 0, {}, pd.DataFrame(columns=["rule", "knob", "capture", "safe_capture", "violations"]))
    auc = {m: float(roc_auc_score(safe[rows, j], p_safe[rows, j])) for j, m in enumerate(modes)
           if 0 < safe[rows, j].mean() < 1}
    lat, safe, risk = lat[rows], safe[rows], 1 - p_safe[rows]
    lat = np.where(np.isfinite(lat), lat, np.inf)  # an unmeasured mode is never the fastest
    risk[:, r] = 0.0
    oracle = np.where(safe, lat, np.inf).min(axis=1)
    best = (lat[:, r] - oracle).sum()
    i = np.arange(len(rows))

    def point(rule, knob, pick):
        gain, ok = lat[:, r] - lat[i, pick], safe[i, pick]
        share = (lambda x: x / best) if best > 1e-12 else (lambda x: np.nan)
        return {"rule": rule, "knob": knob, "capture": share(gain.sum()), "safe_capture": share(gain[ok].sum()),
                "violations": float((~ok).mean()) if len(rows) else np.nan}

    out = [point("threshold", th, np.where(risk <= th, lat, np.inf).argmin(axis=1))
           for th in np.unique(np.concatenate([[0.0], np.quantile(risk, np.linspace(0, 1, 400)), [1.0]]))]
    saving = {"relative": 1 - lat / lat[:, [r]], "absolute": lat[:, [r]] - lat}
    for rule, gain in saving.items():
        gain = np.where(np.isfinite(gain), gain, -np.inf)
        gain[:, r] = 0.0
        positive = gain[np.isfinite(gain) & (gain > 0)]
        scale = float(positive.max()) if len(positive) else 1.0  # the largest saving to weigh
        for lam in [0.0, *(scale * np.geomspace(1e-4, 1e7, 500)), np.inf]:
            score = gain - lam * risk if np.isfinite(lam) else np.where(risk > 0, -np.inf, gain)
            out.append(point(rule, lam, score.argmax(axis=1)))
    return Frontier(split, len(rows), auc, pd.DataFrame(out))

