"""The study folder's README: the opening table, computed findings, the study's own
facts (label sources, cost-model error, live estimate error, noise), step timings,
and one MLflow run (experiment ``modeswitch-study``) holding the same table."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pandas as pd

from modeswitch.dataset.io import atomic_path
from modeswitch.routers.risk_control import min_calibration, upper_bound
from modeswitch.routers.training.tracking import git_commit, setup
from modeswitch.study.beside import BESIDE_PROFILE, same_backend_elsewhere, side_by_side_section
from modeswitch.study.capture_section import capture_section
from modeswitch.study.markdown import md_table as _md
from modeswitch.study.modes_section import beside_section, modes_section
from modeswitch.study.table import figures, findings, generalisation_table, opening_table

#: the issue's targets, checked in the report against the measured figures
TARGET_ORACLE_LIVE_VIOLATIONS = 0.05
TARGET_LIVE_ESTIMATE_ERROR_PCT = 15.0
#: the oracle's live rate is judged by its one-sided (1 - this) upper bound
LIVE_BOUND_DELTA = 0.05


def _write(path: Path, text: str):
    """Atomic; replaces only what an interrupted report step of the same study left."""
    with atomic_path(path, overwrite=True) as tmp:
        Path(tmp).write_text(text)


def _csv(path: Path, df: pd.DataFrame):
    with atomic_path(path, overwrite=True) as tmp:
        df.to_csv(tmp, index=False)


def targets(study, fig: pd.DataFrame) -> list[str]:
    """The issue's two live targets, per split, against what was measured."""
    lines = []
    kinds = functools.cache(lambda: _profile_kinds(study))  # read only where a line needs it, once
    for split in study.cfg.splits:
        o = fig[(fig["split"] == split) & (fig["router"] == "oracle")]
        v, vb, k, n = (_first(o, f"live_{c}") for c in ("violation_rate_any", "violation_rate_beyond_noise",
                                                         "violations_beyond_noise", "requests"))
        out = study.outputs(f"score:{split}")
        err, basis = _table_error(out)
        ok_e = "not measured" if not math.isfinite(err) else \
            ("met" if err <= TARGET_LIVE_ESTIMATE_ERROR_PCT else "not met")
        lines.append(f"- {split}: the oracle's live picks violate a constraint on {v:.0%} of requests "
                     f"({vb:.0%} beyond noise; target <= {TARGET_ORACLE_LIVE_VIOLATIONS:.0%} beyond noise: "
                     f"{_oracle_verdict(vb, k, n)}{_other_kind(o, kinds)}); "
                     f"the table's latency against live medians is off by {err:.1f} % on average "
                     f"{basis} (target <= {TARGET_LIVE_ESTIMATE_ERROR_PCT:.0f} %: {ok_e})")
    return lines


def _first(rows: pd.DataFrame, col: str) -> float:
    return float(rows[col].iloc[0]) if len(rows) and col in rows else math.nan


def _oracle_verdict(rate: float, k: float, n: float) -> str:
    """The oracle's live target judged on its beyond-noise violations (the issue's "beyond
    the self-consistency floor"), counted over the live requests (``k`` of ``n``), by their
    exact one-sided 95 % upper bound (Clopper-Pearson, :func:`routers.risk_control.upper_bound`;
    the clean requests it takes: :func:`~routers.risk_control.min_calibration`): a rate under 5 % on a few requests is not shown to
    be under it (0 of 6 leaves up to 39 %), so the verdict is "met" only when the bound is
    under the target, "not shown" when only ``k / n`` is, with the number of live
    requests it would take where none violated. ``rate`` (family-weighted) gives the count
    for a report written before it was kept (``rate * n``: the live stream draws as many
    requests from each family), and decides alone where ``n`` is unknown too."""
    if not math.isfinite(rate):
        return "not measured"
    if not (math.isfinite(n) and n > 0):  # a report without the live requests' number
        return "met" if rate <= TARGET_ORACLE_LIVE_VIOLATIONS else "not met"
    if not math.isfinite(k):  # a report from before the count: the rate over equal families
        k = round(rate * n)
    k, n = int(k), int(n)
    ub = upper_bound(k, n, LIVE_BOUND_DELTA)
    counted = f"{k} of {n}, 95 % upper bound {ub:.1%}"
    if ub <= TARGET_ORACLE_LIVE_VIOLATIONS:
        return f"met ({counted})"
    if k / n <= TARGET_ORACLE_LIVE_VIOLATIONS:
        need = (f"; {min_calibration(TARGET_ORACLE_LIVE_VIOLATIONS, LIVE_BOUND_DELTA)} live requests with none beyond noise "
                "would show it, [score] live_per_family sets how many") if k == 0 else ""
        return f"not shown ({counted}{need})"
    return f"not met ({counted})"


def _profile_kinds(study) -> str:
    """The machines the study's profile was measured on, as one line."""
    return "; ".join(str(h) for h in study._profile()["hardware"].dropna().unique()) or "unknown"


def _other_kind(oracle: pd.DataFrame, kinds) -> str:
    """Where the oracle's live violations include labels measured on another kind of
    machine than the live check's (``other_hardware``), how many, and the profile's
    machines (``kinds()``): a label is only as good as the machine it was measured on (a
    quantized mode's ratio to the reference follows the CPU's kernels), so the reader must see that the live check compared two machines,
    not a label with its own measurement."""
    col = "live_violations_other_hardware"
    n = oracle[col].iloc[0] if len(oracle) and col in oracle else math.nan
    if not (n == n and n > 0):
        return ""
    return f"; {int(n)} of them on labels the profile measured on another kind of machine: {kinds()}"


def _num(x) -> float:
    return math.nan if x is None else float(x)


def _table_error(out: dict) -> tuple[float, str]:
    """The live check of the table's latency: on the requests the profile measured (the
    same request measured twice: the measuring conditions are what is compared) where
    there are any, with the estimated requests' error beside it; else over all pairs."""
    measured = _num(out.get("live_estimate_mape_pct_measured"))
    n_m = int(out.get("live_estimate_pairs_measured") or 0)
    estimated = _num(out.get("live_estimate_mape_pct_estimated"))
    n_e = int(out.get("live_estimate_pairs_estimated") or 0)
    if n_m:
        signed = _num(out.get("live_estimate_median_signed_pct_measured"))
        tail = f"; {estimated:.1f} % on {n_e} estimated pairs" if n_e else ""
        return measured, (f"on {n_m} (request, mode) pairs the profile measured (median signed "
                          f"{signed:+.1f} %: the table {'slower' if signed > 0 else 'faster'} than live){tail}")
    return _num(out.get("live_estimate_mape_pct")), "over all pairs (none measured in the profile)"


def write_study_report(study) -> dict:
    cfg, out = study.cfg, study.out
    reports = {s: Path(study.outputs(f"score:{s}")["report"]) for s in cfg.splits}
    fig = figures(reports)
    table = opening_table(fig)
    _csv(out / "figures.csv", fig)
    _csv(out / "opening_table.csv", table)
    general = generalisation_table(fig)
    _csv(out / "generalisation_table.csv", general)
    steps = pd.DataFrame([{"step": k, "seconds": v["seconds"], "finished": v["finished"]}
                          for k, v in study.state["steps"].items()])
    _csv(out / "step_timings.csv", steps)

    model = study.outputs("model")
    modes_md, modes = modes_section(study._profile(), cfg.constraint_set(), out,
                                    model.get("target"), model.get("draft"))
    beside = _beside(study, modes, fig)
    ds, cm, prof = study.outputs("dataset"), study.outputs("costmodel"), study.outputs("profile")
    lat = pd.Series(cm.get("latency_mape") or {}, dtype=float)
    cm_line = (f"- cost model latency MAPE (5-fold, grouped by request): median {lat.median():.1%}, "
               f"worst {lat.idxmax()} {lat.max():.1%}" if len(lat) else
               f"- cost model: not fitted ({cm.get('not_fitted')}); every estimate is interpolated")
    md = [f"# Study {cfg.name}", "",
          "Every figure below is read from the split reports linked at the end; speedup and energy "
          "are vs the reference mode, family-weighted, with 95 % bootstrap intervals (requests "
          "resampled within families); violations: share of held-out requests whose pick breaks a "
          "constraint (an unmeasured pick counts); oracle capture: share of the oracle's latency "
          "gain the router keeps; overhead: one decision from a raw request, p50 / p99.", "",
          "## Opening table", "", _md(table), "",
          "## Findings (computed from the table)", "", *[f"- {x}" for x in findings(fig, reports)], "",
          "## Against the issue's live targets", "", *targets(study, fig), "",
          *capture_section(reports),
          *_adaptive_lines(reports),
          *modes_md, *beside,
          "## Inside the training data's ranges, and certified targets", "",
          "Held-out requests whose every feature lies inside the range its training part "
          "spans (the others are extrapolated: see each split report's "
          "`extrapolation_ranges.csv`); the target is the violation rate a router's "
          "threshold was certified for (Learn then Test, 90 % confidence).", "",
          _md(general), "",
          "## The study's data", "",
          f"- profile: {prof['units']} units x {prof['modes']} modes, {prof['rows']} rows "
          f"({cfg.trials} interleaved trials each, contended share "
          f"{(prof['contended_share'] or 0.0):.1%}); "
          f"{cfg.requests_per_family} requests per family, lengths x {cfg.length_scale}, conditions drawn "
          f"per request: {json.dumps(cfg.condition_draw().to_dict())}",
          "- noise floor (median latency CV over a unit's clean trials) per family: "
          + ", ".join(f"{k} {v:.1%}" if math.isfinite(v) else f"{k} - (one trial)"
                      for k, v in prof["noise_floor_median_cv"].items()),
          f"- training table: {ds['n']} requests; label source "
          + ", ".join(f"{k} {v}" for k, v in ds["label_source"].items())
          + "; labels " + ", ".join(f"{k} {v}" for k, v in ds["labels"].items()),
          cm_line, *_memory_line(study),
          "", "## Step timings", "", _md(steps.assign(minutes=(steps["seconds"] / 60).round(1))), "",
          f"Total: {steps['seconds'].sum() / 60:.1f} min.", "",
          "## Split reports", "", *[f"- {s}: [{p}]({p.relative_to(out) if p.is_relative_to(out) else p}/README.md)"
                                    for s, p in reports.items()], ""]
    _write(out / "README.md", "\n".join(md) + "\n")
    run_id = _log(study, fig, table, steps)
    return {"readme": str(out / "README.md"), "mlflow_run_id": run_id}


def _beside(study, modes: pd.DataFrame, fig: pd.DataFrame) -> list[str]:
    """Another study set beside this one: its mode and live tables where it has them (a
    study folder), and both backends' modes on the same requests where the ``beside``
    step measured this backend on the other's requests (:mod:`modeswitch.study.beside`)."""
    other = Path(study.beside) if getattr(study, "beside", None) else None
    if other is None:
        return []
    md = []
    if (other / "modes.csv").exists() or not (other / "profile.parquet").exists():
        md += beside_section(modes, fig, other)
    if (study.out / BESIDE_PROFILE).exists():
        md += side_by_side_section(pd.read_parquet(study.out / BESIDE_PROFILE), other,
                                   study.cfg.constraint_set(), study.out)
    elif same_backend_elsewhere(study.cfg, other):
        md += side_by_side_section(study._profile(), other, study.cfg.constraint_set(), study.out)
    return md


def _adaptive_lines(reports: dict) -> list[str]:
    """Each split's certified routers with their thresholds adapted online over the
    held-out stream (the split report's ``adaptive_replay.csv``; nothing where none has one)."""
    # an experimental add-on's summary (modeswitch.experimental): loaded where a replay exists
    from modeswitch.routers.scoring.adaptive import summary_line

    lines = []
    for split, path in reports.items():
        f = path / "adaptive_replay.csv"
        if not f.exists():
            continue
        lines += [f"- {split}, {r.router}: {summary_line(r)}" for r in pd.read_csv(f).itertuples()]
    if not lines:
        return []
    return ["## Thresholds adapted online (the held-out requests as a stream, every outcome fed back)", "",
            *lines, ""]


def _memory_line(study) -> list[str]:
    """How the profile's peak memory was measured (the memory step), or nothing for a
    study from before that step."""
    if not study.done("memory"):
        return []
    mem = study.outputs("memory")
    if not mem.get("memory"):
        return ["- peak memory: measured with the profile (what the engine holds + the request's own "
                "RSS growth; docs/models-and-profiling.md, \"Memory on CPU\")"]
    ratio = mem.get("median_ratio") or {}
    return [f"- peak memory: measured again apart ({mem['replaced']} profile rows measured it the old way: "
            "weights + RSS growth that depended on the run's history; docs/models-and-profiling.md, "
            "\"Memory on CPU\"); median peak vs the reference: "
            + ", ".join(f"{m} {r:.2f}x" for m, r in ratio.items())]


def _log(study, fig: pd.DataFrame, table: pd.DataFrame, steps: pd.DataFrame) -> str:
    import mlflow  # the tracking store: loaded when the report is logged, not when the study is read

    cfg = study.cfg
    setup(Path(cfg.mlruns), "modeswitch-study")
    with mlflow.start_run(run_name=cfg.name) as run:
        flat = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in cfg.to_dict().items()}
        mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})
        mlflow.set_tags({"git_commit": git_commit(), "study_identity": cfg.identity(),
                         **{f"score_run.{s}": study.outputs(f"score:{s}")["mlflow_run_id"]
                            for s in cfg.splits}})
        for r in fig.to_dict(orient="records"):
            mlflow.log_metrics({f"{r['split']}.{r['router']}.{k}": float(v) for k, v in r.items()
                                if k not in ("split", "router") and isinstance(v, (int, float))
                                and math.isfinite(v)})
        mlflow.log_metrics({f"step_seconds.{s.replace(':', '.')}": float(x)
                            for s, x in zip(steps["step"], steps["seconds"])})
        mlflow.log_table(data=table, artifact_file="opening_table.json")
        for name in ("README.md", "opening_table.csv", "generalisation_table.csv", "figures.csv",
                     "step_timings.csv", "modes.csv", "floor.csv"):
            mlflow.log_artifact(str(study.out / name))
        return run.info.run_id
