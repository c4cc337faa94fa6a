"""Pick, per unit, the fastest mode that meets every constraint.

Decision, per unit (a measured request, a workload cell, or a request whose
metrics were estimated):

1. Every mode is compared with the unit's reference mode: energy-per-token
   ratio, peak-memory ratio and the quality signals the reference has
   (see :class:`modeswitch.oracle.constraints.Constraints`). The reference itself is
   always safe.
2. Among safe modes the lowest mean latency wins.
3. Ties (exactly equal latency, or within ``latency_tie_rel``) break by lower
   energy per token, then lower peak memory, then the reference first, then the
   mode name in alphabetical order, so the result never depends on row order.

Missing data is never treated as safe: a unit without reference rows or a mode
missing a latency, energy or memory figure that the reference has is an
:class:`OracleError`, unless ``on_incomplete="skip"``, which skips the unit or
rejects the mode with reason.

Quality follows the study's rule (``missing_quality``): a mode with no quality
evidence for a unit (no signal that can be compared with the reference: benchmark
accuracy, ROUGE-L vs gold, ROUGE-L vs the reference-mode output), or lacking a
signal that the unit has, is **unsafe** by default (``quality_missing`` violation);
with ``missing_quality="pass"`` the missing signals are simply not checked. The
label table says which rule applied (``missing_quality``) and which signals were
checked (``quality_signals``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.oracle import estimate_error, family_rule, noise_aware, sweep_quality
from modeswitch.oracle.cells import Cells, OracleError, summarise
from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.estimate import estimate

EPS = 1e-9
QUALITY_SIGNALS = ("accuracy", "rouge_l_vs_reference", "rouge_l_vs_baseline")


def _fmt_missing(unit, mode, metrics):
    return f"unit {unit!r}, mode {mode!r}: {', '.join(metrics)} not measured"


def decide(metrics: pd.DataFrame, reference_of: pd.Series, constraints: Constraints,
           trials: pd.DataFrame | None = None, groups: pd.Series | None = None,
           family_table: pd.DataFrame | None = None, estimate_residuals: pd.DataFrame | None = None,
           estimated: set | None = None):
    """Label every unit in ``metrics`` (indexed by unit, mode). With ``trials`` (the
    clean per-trial rows, :attr:`Cells.trials`) and ``constraints.noise_aware``, the
    noise rule of :mod:`modeswitch.oracle.noise_aware` decides between modes within noise.

    ``groups`` (unit -> quality group) and ``family_table``
    (:func:`modeswitch.oracle.family_rule.family_quality`, from measured units) make the quality
    limits judge each (mode, group)'s means under ``quality_scope="family"``; without
    them every unit is judged on its own figures.

    ``estimate_residuals`` (:func:`modeswitch.oracle.estimate_error.residuals`) and ``estimated``
    (the units whose figures are estimates): with ``constraints.noise_aware``, the
    noise rule holds those units to the estimator's cross-validated error.

    Returns ``(labels, candidates, skipped)``: one row per labelled unit; one row
    per (unit, mode) with ratios, violations and the verdict; and the units
    skipped for want of reference data (only with ``on_incomplete="skip"``).
    """
    c = constraints
    cand = metrics.reset_index()
    cand["reference_mode"] = cand["unit"].map(reference_of)
    cand["is_reference"] = cand["mode"] == cand["reference_mode"]
    ref = cand[cand["is_reference"]].set_index("unit")
    skipped = _units_without_reference(cand, ref, reference_of, c)
    _check_some_left(skipped, cand["unit"].nunique())
    cand = cand[~cand["unit"].isin(skipped)].copy()

    r = ref.reindex(cand["unit"])  # each candidate's reference row, positionally aligned
    _add_ratios(cand, r)
    if groups is not None and family_table is not None:
        family_rule.attach(cand, family_table, groups)
    noisy = trials is not None and c.noise_aware and not trials.empty
    if noisy:
        noise_aware.add_intervals(cand, trials, c.confidence_level)
    if c.noise_aware and estimate_residuals is not None and not estimate_residuals.empty and estimated:
        if "n_paired" not in cand:
            cand["n_paired"] = 0
        estimate_error.attach(cand, estimate_residuals, estimated, c.confidence_level)
        noisy = True
    needs = _needed_signals(cand, r)
    cand["missing"] = _missing_metrics(cand, needs, c)
    cand["quality_missing"] = _quality_missing(cand, needs)
    _add_verdicts(cand, c)
    plain = chosen = _choose(cand, c)
    noise_info = None
    if noisy:
        chosen, noise_info = noise_aware.choose(cand, plain, _no_trials() if trials is None else trials,
                                                c.confidence_level)
    cand["chosen"] = cand["mode"] == cand["unit"].map(chosen)
    cand["reason"] = [_reason(row, c) for _, row in cand.iterrows()]
    if noise_info is not None:
        _noise_reasons(cand, plain, chosen, noise_info)
    cand["slowdown_vs_label"] = cand["latency_ms"] / cand["unit"].map(_label_latency(cand))

    labels = _label_table(cand, chosen, r["latency_ms"].groupby(level=0).first(), reference_of)
    labels["quality_signals"] = _quality_signals(cand, needs, labels.index)
    labels["n_modes"] = cand.groupby("unit").size().reindex(labels.index)
    labels["n_safe"] = cand.groupby("unit")["safe"].sum().reindex(labels.index)
    labels["rejected"] = _rejections(cand, labels.index)
    labels["missing_quality"] = c.missing_quality
    if noise_info is not None:
        labels = labels.join(noise_info)
        lab = cand[cand["chosen"]].set_index("unit")
        labels["speedup_low"] = lab["speedup_low"].reindex(labels.index)
        labels["speedup_high"] = lab["speedup_high"].reindex(labels.index)
    labels.index.name = "unit"
    cand = cand.drop(columns=[c for c in cand.columns if c.startswith("_")], errors="ignore")
    return labels, cand, skipped


def _no_trials() -> pd.DataFrame:
    return pd.DataFrame(columns=["unit", "mode", "trial", "latency_ms", "energy_per_token_j"])


def _units_without_reference(cand, ref, reference_of, c: Constraints) -> dict:
    """Units whose reference mode has no rows or no latency: nothing to compare with,
    so an error (the oracle does not guess), or with ``on_incomplete="skip"``
    unit -> why, for the caller to drop them."""
    skipped = {}
    for unit in cand["unit"].unique():
        problem = None
        if unit not in ref.index:
            problem = f"no rows for its reference mode {reference_of.get(unit)!r}"
        elif pd.isna(ref.loc[unit, "latency_ms"]):
            problem = f"its reference mode {ref.loc[unit, 'mode']!r} has no latency"
        if problem:
            if c.on_incomplete != "skip":
                raise OracleError(
                    f"unit {unit!r}: {problem}; the oracle will not guess a label "
                    "(use on_incomplete=skip / --incomplete skip to skip such units)"
                )
            skipped[unit] = problem
    return skipped


def _check_some_left(skipped: dict, units: int) -> None:
    """With every unit skipped there is nothing to label: one error saying why (the
    first few units' reasons), not an empty table that breaks whatever reads it next
    (an import of a file without its reference mode's rows, as the published A100
    hybrid stress file is, skips every unit)."""
    if not skipped or len(skipped) < units:
        return
    shown = "; ".join(f"{u}: {why}" for u, why in list(skipped.items())[:3])
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    raise OracleError(f"nothing to label: every one of the {len(skipped)} units was skipped ({shown}{more}); "
                      "label them together with a profile of their reference mode")


def _add_ratios(cand, r):
    """Every mode against its unit's reference (``r``: the reference rows, aligned)."""
    cand["energy_ratio"] = cand["energy_per_token_j"].to_numpy() / r["energy_per_token_j"].to_numpy()
    cand["memory_ratio"] = cand["peak_memory_mb"].to_numpy() / r["peak_memory_mb"].to_numpy()
    cand["accuracy_delta_pp"] = (cand["accuracy"].to_numpy() - r["accuracy"].to_numpy()) * 100
    cand["rouge_vs_reference_delta"] = (
        cand["rouge_l_vs_reference"].to_numpy() - r["rouge_l_vs_reference"].to_numpy()
    )
    cand["speedup"] = r["latency_ms"].to_numpy() / cand["latency_ms"].to_numpy()


def _needed_signals(cand, r) -> dict:
    """metric -> per candidate, whether its unit has that signal at all: the reference
    has it (ROUGE vs the reference-mode output exists when any other mode of the unit
    has it). A signal the unit lacks is not checked; one it has must be measured."""
    has_rb = cand[~cand["is_reference"]].groupby("unit")["rouge_l_vs_baseline"].apply(
        lambda s: s.notna().any())
    return {
        "latency_ms": pd.Series(True, index=cand.index),
        "energy_per_token_j": r["energy_per_token_j"].notna().to_numpy(),
        "peak_memory_mb": r["peak_memory_mb"].notna().to_numpy(),
        "accuracy": r["accuracy"].notna().to_numpy(),
        "rouge_l_vs_reference": r["rouge_l_vs_reference"].notna().to_numpy(),
        "rouge_l_vs_baseline": cand["unit"].map(has_rb).eq(True).to_numpy(),
    }


def _missing_metrics(cand, needs: dict, c: Constraints) -> list[str]:
    """Per candidate, the needed metrics it lacks (comma-joined; "" for none). Missing
    data is never safe: an error, or with ``on_incomplete="skip"`` a rejection."""
    missing = []
    for i, row in enumerate(cand.itertuples(index=False)):
        if row.is_reference:
            missing.append("")
            continue
        gone = [m for m, need in needs.items() if m not in QUALITY_SIGNALS
                and bool(np.asarray(need)[i]) and pd.isna(getattr(row, m))]
        if gone and c.on_incomplete != "skip":
            raise OracleError(
                _fmt_missing(row.unit, row.mode, gone)
                + " although the reference has it; the oracle will not treat it as safe "
                "(use on_incomplete=skip / --incomplete skip to reject such modes)"
            )
        missing.append(",".join(gone))
    return missing


def _quality_missing(cand, needs: dict) -> list[str]:
    """Per candidate, what quality evidence it lacks ("" for none): the unit's signals
    it has no value for, or "no quality evidence" where nothing can be compared with
    the reference at all. Judged by the ``missing_quality`` rule in the verdicts."""
    out = []
    has = {m: cand[m].notna().to_numpy() for m in QUALITY_SIGNALS}
    for i, ref in enumerate(cand["is_reference"].to_numpy()):
        if ref:
            out.append("")
            continue
        lacking = [m for m in QUALITY_SIGNALS if bool(np.asarray(needs[m])[i]) and not has[m][i]]
        checkable = [m for m in QUALITY_SIGNALS if bool(np.asarray(needs[m])[i]) and has[m][i]]
        if lacking:
            out.append(",".join(lacking) + " not measured")
        elif not checkable:
            out.append("no quality evidence")
        else:
            out.append("")
    return out


def _add_verdicts(cand, c: Constraints):
    """One ``violates_*`` column per constraint, their names in ``violations``, and
    ``safe``. A missing value violates nothing here (``missing`` rejects it); the
    reference is always safe."""
    # with trials, the interval's upper end must meet the limit (not one lucky median)
    energy = cand["energy_ratio"]
    if "energy_ratio_high" in cand:
        energy = cand["energy_ratio_high"].where(cand["energy_ratio_high"].notna(), energy)
    rouge, acc = family_rule.judged_figures(cand, c.quality_scope)
    floor = family_rule.at_floor(cand, c.lossless_at_floor)
    # a request the sweep did not measure, under the per-request rule: its predicted risk
    # is judged instead of figures interpolated from other requests (oracle.quality_risk)
    risk = cand[sweep_quality.RISK] if sweep_quality.RISK in cand else pd.Series(np.nan, index=cand.index)
    by_risk = risk.notna() & (c.quality_scope == "request")
    rouge, acc = rouge.where(~by_risk), acc.where(~by_risk)
    cand["judged_rouge_l"], cand["judged_accuracy_delta_pp"] = rouge, acc
    # the per-request view, named for what it is: not a violation under the family rule
    cand["diverges"] = (cand["rouge_l_vs_baseline"] < c.min_rouge_vs_baseline - EPS) & ~cand["is_reference"]
    cand["at_floor"] = floor & ~cand["is_reference"]
    viol = {
        "energy": energy > c.max_energy_ratio + EPS,
        "memory": cand["memory_ratio"] > c.max_memory_ratio + EPS,
        "quality_accuracy": (acc < -c.max_accuracy_drop_pp - EPS) & ~floor,
        "quality_rouge_vs_baseline": (rouge < c.min_rouge_vs_baseline - EPS) & ~cand["is_reference"] & ~floor,
        "quality_rouge_vs_reference": (
            cand["rouge_vs_reference_delta"] < -c.max_rouge_vs_reference_drop - EPS
        ),
        "quality_missing": (cand["quality_missing"] != "") & (c.missing_quality == "unsafe"),
        "quality_risk": by_risk & (risk > c.max_quality_risk + EPS) & ~floor,
    }
    for k, v in viol.items():
        cand[f"violates_{k}"] = v.fillna(False).astype(bool) & ~cand["is_reference"]
    cand["violations"] = [
        ",".join(k for k in viol if row[f"violates_{k}"]) for _, row in cand.iterrows()
    ]
    cand["safe"] = cand["is_reference"] | ((cand["violations"] == "") & (cand["missing"] == ""))


def _choose(cand, c: Constraints) -> pd.Series:
    """unit -> the fastest safe mode, ties broken by energy, memory, the reference
    first, then the name: a total order, so row order never matters."""
    safe = cand[cand["safe"]].copy()
    best_lat = safe.groupby("unit")["latency_ms"].transform("min")
    safe["tied"] = safe["latency_ms"] <= best_lat * (1 + c.latency_tie_rel) + EPS * best_lat
    safe = safe[safe["tied"]]
    safe = safe.assign(
        _e=safe["energy_per_token_j"].fillna(np.inf),
        _m=safe["peak_memory_mb"].fillna(np.inf),
        _r=(~safe["is_reference"]).astype(int),
        _lat=safe["latency_ms"] if c.latency_tie_rel == 0 else 0.0,
    ).sort_values(["unit", "_lat", "_e", "_m", "_r", "mode"])
    return safe.groupby("unit", sort=False).head(1).set_index("unit")["mode"]


def _noise_reasons(cand, plain: pd.Series, chosen: pd.Series, info: pd.DataFrame):
    """Where the noise rule changed the pick, the reasons say so."""
    for i, row in cand.iterrows():
        u = row["unit"]
        if u not in info.index or plain.get(u) == chosen.get(u):
            continue
        if row["chosen"]:
            cand.at[i, "reason"] = f"chosen: {info.loc[u, 'noise_rule']}"
        elif row["mode"] == plain.get(u):
            spread = _spread_words(row)
            cand.at[i, "reason"] = (f"fastest by median, but not beyond {spread}: {chosen[u]} is "
                                    f"safer and within {spread}")


def _spread_words(row) -> str:
    """What an interval spans: trial noise, or an estimate's cross-validated error."""
    return "the estimate's error" if row.get("interval_basis") == "estimate error" else "noise"


def _label_latency(cand) -> pd.Series:
    return cand[cand["chosen"]].set_index("unit")["latency_ms"]


def _label_table(cand, chosen: pd.Series, ref_latency: pd.Series, reference_of) -> pd.DataFrame:
    labels = pd.DataFrame({"label": chosen})
    labels["label_latency_ms"] = _label_latency(cand).reindex(labels.index)
    labels["reference_mode"] = labels.index.map(reference_of)
    labels["reference_latency_ms"] = ref_latency.reindex(labels.index)
    labels["speedup"] = labels["reference_latency_ms"] / labels["label_latency_ms"]
    return labels


def _quality_signals(cand, needs: dict, units) -> pd.Series:
    """Per unit, the quality signals its label was checked against ("none": none)."""
    quality = list(QUALITY_SIGNALS)
    signals = pd.DataFrame({m: np.asarray(needs[m], dtype=bool) for m in quality})
    signals["unit"] = cand["unit"].to_numpy()
    per_unit = signals.groupby("unit")[quality].any()
    return per_unit.reindex(units).apply(
        lambda r: ",".join(m for m in quality if r[m]) or "none", axis=1)


def _rejections(cand, units) -> list[str]:
    """Per unit, each rejected mode with why ("mode: violations" or "missing ...")."""
    rejected: dict[str, list[str]] = {}
    for r_ in cand[~cand["safe"]].itertuples(index=False):
        why = r_.violations or f"missing {r_.missing}"
        rejected.setdefault(r_.unit, []).append(f"{r_.mode}: {why}")
    return ["; ".join(rejected.get(u, [])) for u in units]


def _reason(row, c: Constraints) -> str:
    if row["is_reference"] and row.get("chosen"):
        return "reference; no other mode is faster and safe"
    parts = []
    if row["missing"]:
        parts.append(f"not measured: {row['missing']}")
    if row["violates_energy"]:
        high = row.get("energy_ratio_high")
        if high is not None and high == high and row["energy_ratio"] <= c.max_energy_ratio + EPS:
            parts.append(f"energy/token {row['energy_ratio']:.3f}x, but up to {high:.3f}x within "
                         f"{_spread_words(row)} > {c.max_energy_ratio:.2f}x")
        else:
            parts.append(f"energy/token {row['energy_ratio']:.3f}x > {c.max_energy_ratio:.2f}x "
                         f"(over by {row['energy_ratio'] - c.max_energy_ratio:.3f})")
    if row["violates_memory"]:
        parts.append(f"peak memory {row['memory_ratio']:.4f}x > {c.max_memory_ratio:.2f}x "
                     f"(over by {row['memory_ratio'] - c.max_memory_ratio:.4f})")
    scope = _scope_words(row, c)
    if row["violates_quality_accuracy"]:
        acc = row["judged_accuracy_delta_pp"]
        parts.append(f"accuracy{scope} {acc:+.2f} pp < -{c.max_accuracy_drop_pp} pp "
                     f"(short by {-c.max_accuracy_drop_pp - acc:.2f})")
    if row["violates_quality_rouge_vs_baseline"]:
        rouge = row["judged_rouge_l"]
        parts.append(f"ROUGE-L vs reference output{scope} {rouge:.3f} < "
                     f"{c.min_rouge_vs_baseline:.2f} (short by {c.min_rouge_vs_baseline - rouge:.3f})")
    if row["violates_quality_risk"]:
        parts.append(f"predicted risk of failing the quality rule {row[sweep_quality.RISK]:.3f} > "
                     f"{c.max_quality_risk:.3f} (not swept; oracle.quality_risk)")
    if row["violates_quality_missing"]:
        parts.append(f"quality: {row['quality_missing']} (missing-quality rule: unsafe)")
    if row["violates_quality_rouge_vs_reference"]:
        parts.append(f"ROUGE-L vs gold {row['rouge_vs_reference_delta']:+.3f} < "
                     f"-{c.max_rouge_vs_reference_drop:.2f} "
                     f"(short by {-c.max_rouge_vs_reference_drop - row['rouge_vs_reference_delta']:.3f})")
    if parts:
        return "rejected: " + "; ".join(parts)
    note = ""
    if row.get("diverges") and row.get("at_floor"):
        note = " (its output diverges here; a lossless mode's divergence is the reference's floor)"
    elif row.get("diverges"):
        note = " (its output diverges here, but its family's mean meets the rule)"
    if row["chosen"]:
        return "chosen: fastest mode that meets every constraint" + note
    return "safe, but not the fastest" + note


def _scope_words(row, c: Constraints) -> str:
    """How the judged quality figure was pooled, for the reason text."""
    n = row.get("group_units")
    if c.quality_scope == "family" and n is not None and n == n:
        return f" (mean over {int(n)} measured of {row['quality_group']})"
    return ""


def _with_units(labels, cells: Cells):
    info = cells.units[["workload", "family", "condition", "prompt_tokens",
                        "expected_output_tokens", "shared_prefix_tokens", "memory_pressure"]]
    out = labels.join(info, how="left")
    out["label_source"] = "measured"
    out["estimate_basis"] = "measured cell"
    return out


def label_profile(profile: pd.DataFrame, constraints: Constraints | None = None, source=None):
    """Label every measured unit of a profile. Returns (labels, candidates, skipped)."""
    constraints = constraints or Constraints()
    cells = summarise(profile, source)
    groups, table = _family_inputs(cells)
    labels, cand, skipped = decide(cells.metrics, cells.units["reference_mode"], constraints,
                                   trials=cells.trials, groups=groups, family_table=table)
    return _with_units(labels, cells), cand, skipped


def _family_inputs(cells: Cells, requests: pd.DataFrame | None = None):
    """(unit -> quality group, the per-(group, mode) table from the measured units)."""
    measured = family_rule.group_of(cells.units)
    table = family_rule.family_quality(cells.metrics, measured, cells.units["reference_mode"])
    if requests is None:
        return measured, table
    return family_rule.group_of(requests.set_index("id")), table


def label_requests(profile: pd.DataFrame, requests: pd.DataFrame,
                   constraints: Constraints | None = None, source=None, costmodel=None,
                   quality: pd.DataFrame | None = None, risk_features: pd.DataFrame | None = None):
    """Label requests (a DataFrame of Request fields) from a profile, estimating
    metrics at each request's features where it was not measured itself (with a
    :class:`~modeswitch.oracle.costmodel.CostModel`, from it where it validated better).
    ``latency_basis`` says where the label's latency came from. ``quality``: a quality
    sweep's table (:func:`modeswitch.engine.quality_sweep.read_sweep`), whose per-request quality
    replaces the estimate's and whose family means the rule judges
    (:mod:`modeswitch.oracle.sweep_quality`); ``quality_basis`` says which each request has."""
    constraints = constraints or Constraints()
    cells = summarise(profile, source)
    est, basis = estimate(cells, requests, costmodel=costmodel)
    est, basis = sweep_quality.apply(est, basis, quality)
    groups, table = _family_inputs(cells, requests)
    table = sweep_quality.family_table(quality, requests, table)
    risk_info = None
    if (quality is not None and not quality.empty and risk_features is not None
            and constraints.quality_scope == "request" and constraints.quality_risk != "off"):
        from modeswitch.oracle import quality_risk  # scikit-learn: only when a risk model is fitted

        est, risk_info = quality_risk.attach(est, basis, quality, risk_features, groups, constraints)
    residuals, estimated = None, set(basis.index[basis["label_source"] == "estimated"])
    if constraints.noise_aware and estimated:
        residuals = estimate_error.residuals(profile, costmodel=costmodel)
    labels, cand, skipped = decide(est, basis["reference_mode"], constraints, trials=cells.trials,
                                   groups=groups, family_table=table, estimate_residuals=residuals,
                                   estimated=estimated)
    req = requests.set_index("id")
    cols = [c for c in ("workload", "family", "benchmark_suite", "prompt_tokens",
                        "expected_output_tokens", "shared_prefix_tokens",
                        "concurrent_requests", "memory_pressure") if c in req.columns]
    labels = labels.join(req[cols]).join(basis[["condition", "label_source", "estimate_basis", "quality_basis"]])
    chosen = cand[cand["chosen"]].set_index("unit")["latency_basis"]
    labels["latency_basis"] = chosen.reindex(labels.index)
    if risk_info is not None:
        labels.attrs["quality_risk"] = risk_info
    if residuals is not None:
        labels.attrs["estimate_error"] = estimate_error.summary(
            residuals, constraints.confidence_level).to_dict(orient="records")
    return labels, cand, skipped
