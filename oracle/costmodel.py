"""A per-mode cost model fitted from measured requests, and its validation.

Why: labels and offline scores were interpolated from a profile with a handful of
cells, and were off by a third live. The work a request costs has a known shape,
so each (backend, mode, condition) gets a small model of that shape, fitted to
the median of each request's clean trials (:func:`modeswitch.engine.noise.clean_trials`):

* **TTFT** grows with the uncached prompt, ``Pu`` = prompt minus the reused prefix
  (a prefix-caching mode re-uses the shared prefix), linearly and (attention)
  quadratically; requests served one after another in a group wait for the ones
  before them, ``(C - 1)`` x their decode work;
* **latency** = a constant + prefill work + decode work, where the decode of ``E``
  tokens costs per token a constant plus a term growing with the context
  (``P + E/2`` on average), all times the concurrency ``C``;
* **energy** (J) has the same terms; energy per token divides by ``C x E``;
* **peak memory** = weights + KV cache for ``C x (P + E)`` tokens.

Every coefficient is non-negative (more work never costs less) and they are fitted
with a robust loss on *relative* residuals (``scipy.optimize.least_squares``,
``soft_l1``), which is what the MAPE judges. Where the form misfits (training
MAPE above ``misfit``) and there are enough requests, a monotone gradient-boosted
model (LightGBM, increasing in every size) is tried and kept if it cross-validates
better. Quality is not extrapolated: it stays an empirical mean per (mode,
family or benchmark suite) with its count.

:func:`validate` runs K-fold cross-validation grouped by request (a request's
trials never sit on both sides) and reports MAPE and the share within 10 % per
metric and mode, next to the Delaunay interpolation of :mod:`modeswitch.oracle.estimate` on
the same folds. The oracle uses the cost model for a (mode, metric) only where it
validated better (:meth:`CostModel.prefers`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from modeswitch.dataset.errors import InputFileError
from modeswitch.dataset.io import atomic_path
from modeswitch.engine.modes import get_mode
from modeswitch.oracle.cells import (
    MODELLED,
    Cells,
    OracleError,
    family_condition,
    quality_key,
    request_rows,
    summarise,
)
from modeswitch.oracle.estimate import estimate

#: metrics validate() reports (tokens/s follows from latency, so it is not listed)
VALIDATED = ("latency_ms", "ttft_ms", "energy_per_token_j", "peak_memory_mb")
QUALITY = ("accuracy", "rouge_l_vs_reference", "rouge_l_vs_baseline")
VERSION = 1


def _prefix_cached(mode: str) -> bool:
    try:
        return bool(get_mode(mode).prefix_caching)
    except KeyError:
        return False


def design(shape: pd.DataFrame, mode: str, metric: str) -> np.ndarray:
    """The structural terms of ``metric`` for requests of ``shape`` in ``mode``
    (columns: prompt_tokens, expected_output_tokens, shared_prefix_tokens,
    concurrent_requests); token counts in thousands to keep the fit well scaled."""
    P = shape["prompt_tokens"].to_numpy(float) / 1e3
    E = shape["expected_output_tokens"].to_numpy(float) / 1e3
    C = shape["concurrent_requests"].fillna(1).to_numpy(float)
    Pu = _uncached(shape, mode) / 1e3
    one = np.ones_like(P)
    decode = E * (P + E / 2)
    if metric == "ttft_ms":
        return np.column_stack([one, Pu, Pu**2, (C - 1) * E, (C - 1) * decode])
    if metric == "peak_memory_mb":
        return np.column_stack([one, C * (P + E)])
    # latency_ms and energy (J)
    return np.column_stack([one, C * Pu, C * Pu**2, C * E, C * decode])


def _uncached(shape: pd.DataFrame, mode: str) -> np.ndarray:
    """Prompt tokens the mode has to prefill: a prefix-caching mode re-uses the shared prefix."""
    P = shape["prompt_tokens"].to_numpy(float)
    if not _prefix_cached(mode):
        return P
    return np.maximum(P - shape["shared_prefix_tokens"].fillna(0).to_numpy(float), 1.0)


def _output_tokens(shape: pd.DataFrame) -> np.ndarray:
    """Tokens a unit generates in all: per request times the requests arriving together."""
    return (shape["expected_output_tokens"].to_numpy(float)
            * shape["concurrent_requests"].fillna(1).to_numpy(float))


def _target(metrics: pd.DataFrame, shape: pd.DataFrame, metric: str) -> np.ndarray:
    if metric == "energy_per_token_j":  # fitted as joules: the terms are additive there
        return metrics["energy_per_token_j"].to_numpy(float) * _output_tokens(shape)
    return metrics[metric].to_numpy(float)


def _from_target(pred: np.ndarray, shape: pd.DataFrame, metric: str) -> np.ndarray:
    if metric == "energy_per_token_j":
        return pred / np.maximum(_output_tokens(shape), 1)
    return pred


def fit_structural(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising a robust loss of the relative residuals."""
    w = 1.0 / np.maximum(np.abs(y), 1e-12)
    A = X * w[:, None]
    start, *_ = np.linalg.lstsq(A, np.ones_like(y), rcond=None)
    start = np.clip(start, 0, None)
    used = np.abs(X).sum(axis=0) > 0  # a term that is zero everywhere stays zero
    start[~used] = 0
    free = np.flatnonzero(used)
    if len(free) == 0:
        return start
    res = least_squares(lambda th: A[:, free] @ th - 1.0, start[free] + 1e-12,
                        bounds=(0, np.inf), loss="soft_l1", f_scale=0.05, x_scale="jac")
    coef = np.zeros(X.shape[1])
    coef[free] = res.x
    return coef


def _mape(pred, y) -> float:
    ok = np.isfinite(pred) & np.isfinite(y) & (np.abs(y) > 0)
    return float(np.mean(np.abs(pred[ok] - y[ok]) / np.abs(y[ok]))) if ok.any() else math.nan


def _gbm_frame(shape: pd.DataFrame, mode: str) -> np.ndarray:
    """The boosted model's inputs: prompt, output and uncached tokens, concurrency."""
    return np.column_stack([shape["prompt_tokens"].to_numpy(float),
                            shape["expected_output_tokens"].to_numpy(float), _uncached(shape, mode),
                            shape["concurrent_requests"].fillna(1).to_numpy(float)])


def _fit_gbm(Z: np.ndarray, y: np.ndarray, seed: int = 0):
    import lightgbm as lgb  # lazy: LightGBM is optional

    params = dict(objective="regression", n_estimators=200, learning_rate=0.05, num_leaves=7,
                  min_child_samples=3, monotone_constraints=[1] * Z.shape[1],
                  random_state=seed, verbose=-1)
    return lgb.LGBMRegressor(**params).fit(Z, np.log(np.maximum(y, 1e-12)))


@dataclass
class GroupModel:
    """One (mode, condition, metric): its form, coefficients (or booster) and fit."""

    mode: str
    condition: str
    metric: str
    form: str  # "structural" | "monotone_gbm"
    n: int
    train_mape: float
    coef: list[float] = field(default_factory=list)
    booster: str | None = None
    _gbm: object = None

    def predict(self, shape: pd.DataFrame) -> np.ndarray:
        if self.form == "structural":
            raw = design(shape, self.mode, self.metric) @ np.asarray(self.coef)
        else:
            if self._gbm is None:
                import lightgbm as lgb  # lazy: LightGBM is optional

                self._gbm = lgb.Booster(model_str=self.booster)
            raw = np.exp(self._gbm.predict(_gbm_frame(shape, self.mode)))
        return _from_target(raw, shape, self.metric)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("mode", "condition", "metric", "form", "n",
                                              "train_mape", "coef", "booster")}


def _fit_group(mode, condition, metric, shape, y, misfit, seed) -> GroupModel:
    X = design(shape, mode, metric)
    coef = fit_structural(X, y)
    gm = GroupModel(mode, condition, metric, "structural", len(y), _mape(X @ coef, y), coef.tolist())
    if gm.train_mape > misfit and len(y) >= 20:
        # inner 3-fold comparison of the two forms on this group's requests
        rng = np.random.default_rng(seed)
        fold = rng.permutation(len(y)) % 3
        err_s, err_g = [], []
        Z = _gbm_frame(shape, mode)
        for f in range(3):
            tr, te = fold != f, fold == f
            c = fit_structural(X[tr], y[tr])
            err_s.append(np.abs(X[te] @ c - y[te]) / y[te])
            g = _fit_gbm(Z[tr], y[tr], seed)
            err_g.append(np.abs(np.exp(g.predict(Z[te])) - y[te]) / y[te])
        if np.mean(np.concatenate(err_g)) < np.mean(np.concatenate(err_s)):
            g = _fit_gbm(Z, y, seed)
            gm = GroupModel(mode, condition, metric, "monotone_gbm", len(y),
                            _mape(np.exp(g.predict(Z)), y),
                            booster=g.booster_.model_to_string(), _gbm=g.booster_)
    return gm


def _group_of(units: pd.DataFrame) -> pd.Series:
    """The condition a unit is modelled under (a benchmark: per suite)."""
    suite = units["benchmark_suite"].fillna("").astype(str)
    return units["condition"].where(units["condition"] != "benchmark", "benchmark:" + suite)


@dataclass
class CostModel:
    """Per (mode, condition) models of each metric, quality statistics per (mode,
    family or suite), and (after :func:`validate`) the validation table."""

    backend: str
    reference_mode: str
    groups: dict[tuple[str, str, str], GroupModel] = field(default_factory=dict)
    quality: pd.DataFrame = field(default_factory=pd.DataFrame)
    validation: pd.DataFrame | None = None
    min_requests: int = 6

    # ------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, profile: pd.DataFrame, misfit: float = 0.10, seed: int = 0,
            min_requests: int = 6, source=None) -> CostModel:
        """Fit from a profile's measured per-request rows (aggregates are left out:
        they summarise cells, not requests)."""
        rows = request_rows(profile)
        if rows.empty:
            raise OracleError(f"{source or 'profile'}: no measured per-request rows to fit a cost model on")
        backends = rows["backend"].dropna().unique()
        if len(backends) > 1:
            raise OracleError(f"{source or 'profile'}: rows from several backends "
                              f"({', '.join(map(str, backends))}); fit one cost model per backend")
        cells = summarise(rows, source)
        model = cls(str(backends[0]), str(cells.units["reference_mode"].iloc[0]),
                    min_requests=min_requests)
        units = cells.units.assign(group=_group_of(cells.units))
        metrics = cells.metrics.reset_index()
        for (mode, group), g in metrics.merge(units[["group"]], left_on="unit",
                                              right_index=True).groupby(["mode", "group"]):
            shape = units.loc[g["unit"]]
            for metric in MODELLED:
                y = _target(g, shape, metric)
                # a unit without token counts (a published benchmark cell) has no shape to fit
                ok = np.isfinite(y) & (y > 0) & np.isfinite(design(shape, mode, metric)).all(axis=1)
                if ok.sum() < min_requests:
                    continue
                model.groups[(mode, group, metric)] = _fit_group(
                    mode, group, metric, shape[ok], y[ok], misfit, seed)
        model.quality = _quality_table(cells, units)
        return model

    # --------------------------------------------------------- predicting
    def predict(self, requests: pd.DataFrame) -> pd.DataFrame:
        """Per (request id, mode) estimates of every oracle metric (NaN where the
        request's condition has no model for that mode). ``requests`` needs ``id``,
        the shape columns, ``family`` and ``benchmark_suite``."""
        req = _with_condition(requests)
        out = []
        modes = sorted({k[0] for k in self.groups})
        for group, g in req.groupby("group", sort=False):
            for mode in modes:
                est = pd.DataFrame({"unit": g["id"].to_numpy(), "mode": mode})
                for metric in MODELLED:
                    gm = self.groups.get((mode, group, metric))
                    est[metric] = gm.predict(g) if gm is not None else np.nan
                est["tokens_per_s"] = _output_tokens(g) / (est["latency_ms"].to_numpy() / 1000)
                q = self._quality_for(mode, g)
                for c in QUALITY:
                    est[c] = q[c]
                out.append(est)
        cols = ["unit", "mode", *MODELLED, "tokens_per_s", *QUALITY]
        if not out:
            return pd.DataFrame(columns=cols).set_index(["unit", "mode"])
        return pd.concat(out, ignore_index=True)[cols].set_index(["unit", "mode"]).sort_index()

    def _quality_for(self, mode: str, g: pd.DataFrame) -> dict:
        key = quality_key(g)
        q = self.quality
        out = {}
        for c in QUALITY:
            if q.empty:
                out[c] = np.full(len(g), np.nan)
                continue
            table = q[q["mode"] == mode].set_index("key")[c]
            out[c] = key.map(table).to_numpy(float)
        if mode == self.reference_mode:  # the reference against its own output
            out["rouge_l_vs_baseline"] = np.where(np.isnan(out["rouge_l_vs_baseline"]), 1.0,
                                                  out["rouge_l_vs_baseline"])
        return out

    def prefers(self, mode: str, metric: str) -> bool:
        """Use the cost model for this (mode, metric)? Only where it validated better
        than the interpolation on the same folds."""
        v = self.validation
        if v is None or v.empty:
            return False
        row = v[(v["mode"] == mode) & (v["metric"] == metric)]
        if row.empty or not np.isfinite(row["mape_costmodel"].iloc[0]):
            return False
        # on the same requests (a table saved before that column: the interpolation's all)
        col = ("mape_interpolation_same_rows" if "mape_interpolation_same_rows" in row
               and np.isfinite(row["mape_interpolation_same_rows"].iloc[0]) else "mape_interpolation")
        interp = row[col].iloc[0]
        return not np.isfinite(interp) or row["mape_costmodel"].iloc[0] < interp

    # ------------------------------------------------------------ storage
    def to_dict(self) -> dict:
        return {
            "version": VERSION, "backend": self.backend, "reference_mode": self.reference_mode,
            "min_requests": self.min_requests,
            "groups": [g.to_dict() for g in self.groups.values()],
            "quality": self.quality.to_dict(orient="records"),
            "validation": None if self.validation is None else self.validation.to_dict(orient="records"),
        }

    def save(self, path, overwrite: bool = False) -> Path:
        """Write atomically as JSON (its validation table inside, and beside it as CSV)."""
        path = Path(path)
        with atomic_path(path, overwrite=overwrite) as tmp:
            Path(tmp).write_text(json.dumps(self.to_dict(), indent=1, default=_json))
        if self.validation is not None:
            with atomic_path(path.with_suffix(".validation.csv"), overwrite=overwrite) as tmp:
                self.validation.to_csv(tmp, index=False)
        return path

    @classmethod
    def load(cls, path) -> CostModel:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputFileError(path, None, None, f"not a cost model file: {exc}") from None
        if d.get("version") != VERSION:
            raise InputFileError(path, None, "version", f"cost model version {d.get('version')!r}; "
                                 f"this build reads version {VERSION}")
        m = cls(d["backend"], d["reference_mode"], min_requests=d.get("min_requests", 6))
        for g in d["groups"]:
            gm = GroupModel(**g)
            m.groups[(gm.mode, gm.condition, gm.metric)] = gm
        m.quality = pd.DataFrame(d["quality"])
        m.validation = None if d.get("validation") is None else pd.DataFrame(d["validation"])
        return m


def _json(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o))


def _quality_table(cells: Cells, units: pd.DataFrame) -> pd.DataFrame:
    """Mean quality per (mode, family or benchmark suite), with the request count."""
    m = cells.metrics.reset_index()
    m["key"] = m["unit"].map(quality_key(units))
    agg = m.groupby(["mode", "key"])[list(QUALITY)].mean()
    agg["n"] = m.groupby(["mode", "key"])["unit"].nunique()
    return agg.reset_index()


def _with_condition(requests: pd.DataFrame) -> pd.DataFrame:
    req = requests.reset_index(drop=True).copy()
    for c in ("shared_prefix_tokens", "concurrent_requests", "memory_pressure"):
        if c not in req:
            req[c] = 0.0 if c != "concurrent_requests" else 1.0
    if "benchmark_suite" not in req:
        req["benchmark_suite"] = None
    req["condition"] = [family_condition(r["family"], r["benchmark_suite"], r)
                        for r in req.to_dict(orient="records")]
    req["group"] = _group_of(req)
    return req


# ---------------------------------------------------------------- validation
def grouped_folds(rows: pd.DataFrame, k: int = 5, seed: int = 0):
    """K folds of request ids, stratified by family: every trial of a request falls in
    the same fold. Yields ``(train_ids, test_ids)``."""
    from sklearn.model_selection import StratifiedGroupKFold  # lazy: scikit-learn is heavy

    ids = rows["request_id"].astype(str).to_numpy()
    fam = rows["family"].astype(str).to_numpy()
    k = min(k, len(set(ids)))
    if k < 2:
        raise OracleError("cross-validation needs at least two measured requests")
    cv = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    for tr, te in cv.split(ids, fam, groups=ids):
        yield sorted(set(ids[tr])), sorted(set(ids[te]))


def _shape_frame(units: pd.DataFrame) -> pd.DataFrame:
    return units.reset_index().rename(columns={"unit": "id"})


def _long(wide: pd.DataFrame, name: str) -> pd.DataFrame:
    """(unit, mode) x metric columns -> one row per (unit, mode, metric)."""
    w = wide[list(VALIDATED)].copy()
    w.index.names = ["unit", "mode"]
    return w.reset_index().melt(id_vars=["unit", "mode"], var_name="metric", value_name=name)


def validate(profile: pd.DataFrame, k: int = 5, seed: int = 0, misfit: float = 0.10,
             progress=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """K-fold (grouped by request) errors per metric and mode: the cost model next to
    the Delaunay interpolation on the same folds.

    Returns ``(table, predictions)``: one row per (metric, mode) with ``n`` held-out
    requests, ``mape_costmodel``, ``within10_costmodel``, ``mape_interpolation``,
    ``within10_interpolation``; and every held-out (request, mode, metric) with its
    measured median and both predictions.
    """
    rows = request_rows(profile)
    if rows.empty:
        raise OracleError("the profile has no measured per-request rows (request_id) to "
                          "cross-validate on: published cell aggregates describe cells, not "
                          "requests; profile requests with `modeswitch profile`")
    folds = list(grouped_folds(rows, k, seed))
    preds = []
    for i, (train_ids, test_ids) in enumerate(folds):
        train = rows[rows["request_id"].astype(str).isin(train_ids)]
        test = rows[rows["request_id"].astype(str).isin(test_ids)]
        actual = summarise(test)
        shapes = _shape_frame(actual.units)
        cm = CostModel.fit(train, misfit=misfit, seed=seed).predict(shapes)
        interp, _ = estimate(summarise(train), shapes)
        idx = actual.metrics.index
        f = _long(actual.metrics, "measured").merge(
            _long(cm.reindex(idx), "costmodel"), on=["unit", "mode", "metric"], how="left").merge(
            _long(interp.reindex(idx), "interpolation"), on=["unit", "mode", "metric"], how="left")
        preds.append(f.dropna(subset=["measured"]).assign(fold=i))
        if progress:
            progress(i + 1, len(folds))
    p = pd.concat(preds, ignore_index=True)
    p["family"] = p["unit"].map(rows.groupby(rows["request_id"].astype(str))["family"].first())
    out = []
    for (metric, mode), g in p.groupby(["metric", "mode"], sort=True):
        y = g["measured"].to_numpy(float)
        rec = {"metric": metric, "mode": mode, "n": int(len(g))}
        err = {}
        for col in ("costmodel", "interpolation"):
            e = err[col] = np.abs(g[col].to_numpy(float) - y) / np.abs(y)
            rec[f"mape_{col}"] = float(np.nanmean(e)) if np.isfinite(e).any() else math.nan
            rec[f"within10_{col}"] = float(np.mean(e[np.isfinite(e)] <= 0.10)) if np.isfinite(e).any() else math.nan
            rec[f"missing_{col}"] = int((~np.isfinite(e)).sum())
        # the interpolation on the requests the cost model predicted too: where the model
        # covers only some conditions, the comparison that decides which to use
        both = np.isfinite(err["costmodel"]) & np.isfinite(err["interpolation"])
        rec["mape_interpolation_same_rows"] = (float(err["interpolation"][both].mean()) if both.any()
                                               else math.nan)
        out.append(rec)
    return pd.DataFrame(out), p


def enough_requests(profile: pd.DataFrame, min_requests: int = 6, k: int = 5) -> str | None:
    """Why a cost model cannot be fitted on ``profile`` (None: it can): it needs
    measured requests, at least ``k`` of them, and some (mode, condition) with
    ``min_requests``: counted by the groups :meth:`CostModel.fit` fits, not by family
    (conditions drawn per request put one family's requests under several)."""
    rows = request_rows(profile)
    if rows.empty:
        return "no measured per-request rows"
    n = rows["request_id"].nunique()
    if n < k:
        return f"{n} measured requests, fewer than {k} folds"
    units = summarise(rows).units
    group = _group_of(units)
    per = rows.assign(group=rows["request_id"].astype(str).map(group)).groupby(
        ["mode", "group"])["request_id"].nunique()
    if per.max() < min_requests:
        return f"at most {per.max()} requests per (mode, condition); the model needs {min_requests}"
    return None


def fit_validated(profile: pd.DataFrame, k: int = 5, seed: int = 0, misfit: float = 0.10,
                  progress=None, source=None) -> CostModel:
    """Validate, then fit on every request: the model carries its validation table."""
    table, _ = validate(profile, k=k, seed=seed, misfit=misfit, progress=progress)
    model = CostModel.fit(profile, misfit=misfit, seed=seed, source=source)
    model.validation = table
    return model
