"""``modeswitch score``: trained routers from MLflow vs the rule baseline, offline and live.

Which routers: the latest training run per router family for this training
table (experiment ``modeswitch-train-<table hash>``), or the runs named. Which
requests: the held-out part of the run's own split (same split kind, test size
and seed as in training), so no router is scored on requests it was fitted on.
The rule baseline, the reference-only router and the oracle are scored on the
same requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dataset.errors import InputError
from oracle.training_table import frame_hash, table_meta
from routers.reference import FixedModeRouter, OracleRouter
from routers.rule_baseline import RuleBaselineRouter
from routers.scoring.offline import requests_from_table
from routers.training.splits import split_indices

#: live requests per family by default (the study's issue: at least six)
LIVE_PER_FAMILY = 6


@dataclass
class ScoreConfig:
    mlruns: str = "mlruns"
    #: MLflow tracking store; None: $MLFLOW_TRACKING_URI, else SQLite in ``mlruns``
    tracking_uri: str | None = None
    run_ids: list[str] = field(default_factory=list)
    compiled: bool = True
    decisions: int = 20_000
    pipeline_decisions: int = 300
    live: bool = False
    #: live stream size; None: ``LIVE_PER_FAMILY`` requests per family of the held-out part
    live_requests: int | None = None
    #: live requests per held-out family when ``live_requests`` is None
    live_per_family: int = LIVE_PER_FAMILY
    #: interleaved trials per (request, mode) live; medians and intervals over them
    live_trials: int = 3
    #: the engines' threads live; None: the profile's (recorded in the training table),
    #: else 1 on CPU (two OpenMP threads on a small machine slow up to 18x when anything
    #: else takes a core; see engine.noise), the backend's own choice on CUDA
    live_threads: int | None = None
    #: times a contended live trial is measured again
    live_max_remeasure: int = 2
    #: None: the default model (engine.models.resolve.default_model)
    model: str | None = None
    draft_model: str | None = None
    device: str = "cpu"
    backend: str = "transformers"
    seed: int = 0
    name: str | None = None
    #: score on all rows or only measured labels (as the routers were trained: `train --labels`)
    labels: str = "all"


def live_threads(cfg: ScoreConfig, meta: dict) -> tuple[int | None, str]:
    """(the engines' threads for the live check, where the choice comes from): as asked,
    else the profile's single thread count, else 1 on CPU; None (the backend's choice)
    on CUDA. A table built before tables recorded it says nothing, so the report says
    the choice was not the profile's."""
    if cfg.live_threads:
        return int(cfg.live_threads), "--live-threads"
    recorded = meta.get("threads") or []
    if len(recorded) == 1:
        return int(recorded[0]), "the profile's"
    why = "the table does not record the profile's" if not recorded else f"the profile mixed {recorded}"
    if cfg.device.startswith("cuda"):
        return None, f"the backend's ({why})"
    return 1, f"the CPU default ({why})"


@dataclass
class TrainedRouter:
    name: str
    run_id: str
    model_uri: str
    estimator: object
    split: str
    test_size: float
    seed: int
    feature_set: str
    #: trained with regret weights (a refit per fold needs them too)
    regret_weights: bool = False
    unsafe_penalty: float = 1.0


def find_runs(table: pd.DataFrame, mlruns: str, run_ids=()) -> list[dict]:
    """Training runs to score: the named ones, or the latest per family for this table."""
    import mlflow

    from routers.training.tracking import setup

    thash = frame_hash(table.reset_index(drop=True))
    setup(Path(mlruns), f"modeswitch-train-{thash}")
    client = mlflow.MlflowClient()
    if run_ids:
        runs = [client.get_run(r) for r in run_ids]
    else:
        exp = client.get_experiment_by_name(f"modeswitch-train-{thash}")
        if exp is None:
            raise InputError(f"no training runs for this table (hash {thash}) in {mlruns}; "
                              "run `modeswitch train --data ...` first")
        found = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'",
                                   order_by=["attributes.start_time DESC"], max_results=500)
        latest = {}
        for r in found:
            fam = r.data.tags.get("router_family")
            if fam and "mlflow.parentRunId" not in r.data.tags and fam not in latest:
                latest[fam] = r
        runs = list(latest.values())
    if not runs:
        raise InputError(f"no finished training runs for this table in {mlruns}")
    out = []
    for r in runs:
        tags, params = r.data.tags, r.data.params
        if tags.get("training_table_hash") not in (None, thash):
            raise InputError(f"run {r.info.run_id} was trained on another table "
                             f"({tags.get('training_table_hash')}, this one is {thash})")
        out.append({"run_id": r.info.run_id, "family": tags["router_family"],
                    "split": tags.get("split", "group"), "feature_set": tags.get("feature_set", "A"),
                    "test_size": float(params.get("test_size", 0.25)), "seed": int(params.get("seed", 42)),
                    "model_uri": tags.get("model_uri"),
                    "regret_weights": params.get("regret_weights", "False") == "True",
                    "unsafe_penalty": float(tags.get("unsafe_penalty", 1.0))})
    return out


def load_routers(table, mlruns, run_ids=()) -> list[TrainedRouter]:
    import mlflow
    import mlflow.sklearn

    out = []
    for r in find_runs(table, mlruns, run_ids):
        uri = r["model_uri"]
        if not uri:
            models = mlflow.search_logged_models(filter_string=f"source_run_id = '{r['run_id']}'",
                                                 output_format="list")
            if not models:
                raise InputError(f"run {r['run_id']} has no logged router model")
            uri = f"models:/{models[0].model_id}"
        est = mlflow.sklearn.load_model(uri)
        out.append(TrainedRouter(r["family"], r["run_id"], uri, est, r["split"], r["test_size"],
                                 r["seed"], r["feature_set"], r["regret_weights"], r["unsafe_penalty"]))
    return out


def held_out_rows(table: pd.DataFrame, trained: list[TrainedRouter]) -> np.ndarray:
    """The test rows of the routers' split (which must agree): the first fold's, or,
    leaving one family out, every row (each is held out by its family's fold)."""
    split, test_size, seed = _split_of(trained)
    folds = split_indices(table, split, test_size, seed)
    if split == "lofo":
        return np.sort(np.concatenate([te for _, te in folds]))
    return np.sort(folds[0][1])


def _split_of(trained: list[TrainedRouter]) -> tuple:
    keys = {(t.split, t.test_size, t.seed) for t in trained}
    if len(keys) > 1:
        raise InputError("the routers to score were trained with different splits "
                         f"({sorted(keys)}); name runs of one split with --run")
    return next(iter(keys))


class HeldOutFamilyRouter:
    """Evaluation only (leave one family out): a request of family F is routed by the
    router refitted without F, so every held-out family is scored by a model that
    never saw it. The MLflow run's own model is the first fold's; its routing
    overhead stands for all folds (same family, same hyperparameters)."""

    def __init__(self, by_family: dict):
        self.by_family = by_family

    def _for(self, family):
        try:
            return self.by_family[str(family)]
        except KeyError:
            raise InputError(f"no leave-one-family-out fold holds family {family!r} out") from None

    def predict_with_fallback(self, X) -> tuple[np.ndarray, np.ndarray]:
        fam = X["family"].astype(str).to_numpy()
        picks = np.empty(len(X), dtype=object)
        fell = np.zeros(len(X), dtype=bool)
        for f in np.unique(fam):
            m = fam == f
            p, fb = self._for(f).predict_with_fallback(X[m])
            picks[m], fell[m] = p, fb
        return picks, fell

    def predict(self, X) -> np.ndarray:
        return self.predict_with_fallback(X)[0]

    def route(self, request) -> str:
        return self._for(request.family).route(request)


def held_out_family_routers(table: pd.DataFrame, trained: list[TrainedRouter]) -> dict:
    """Per trained router, a :class:`HeldOutFamilyRouter` refitted on every
    leave-one-family-out fold."""
    from routers.training.trainer import refit

    split, test_size, seed = _split_of(trained)
    folds = split_indices(table, split, test_size, seed)
    out = {}
    for t in trained:
        by_family = {}
        for tr, te in folds:
            fam = str(table["family"].iloc[te[0]])
            by_family[fam] = refit(t.estimator, table, tr, t.regret_weights, t.unsafe_penalty)
        out[t.name] = HeldOutFamilyRouter(by_family)
    return out


def baselines(modes: list[str]) -> dict:
    """The routers every scoring sets the learned ones beside: the reference mode alone,
    and the rule baseline over the table's modes."""
    return {"reference": FixedModeRouter().fit(),
            "rule": RuleBaselineRouter(available_modes=modes, unavailable="reference").fit()}


def score_routers(table: pd.DataFrame, cfg: ScoreConfig, out: Path, progress=None) -> dict:
    """Run the whole scoring; returns the tables and figures (the report is written to ``out``)."""
    from routers.scoring import overhead as oh
    from routers.scoring import report
    from routers.scoring.offline import aggregate_scores, score_offline

    def say(msg):
        if progress:
            progress(msg)

    from routers.training.tracking import use_tracking_uri
    from routers.training.trainer import select_labels

    use_tracking_uri(cfg.tracking_uri)
    table = select_labels(table, cfg.labels)
    meta = table_meta(table)
    modes = meta["modes"]
    say("loading trained routers from MLflow")
    trained = load_routers(table, cfg.mlruns, cfg.run_ids)
    test = table.iloc[held_out_rows(table, trained)].reset_index(drop=True)
    test.attrs = table.attrs
    routers = baselines(modes)
    routers.update({t.name: t.estimator for t in trained})
    requests = requests_from_table(test)
    say("measuring routing overhead")
    functions = oh.decision_functions(routers, cfg.compiled)
    overhead = oh.measure(routers, requests, cfg.decisions, cfg.pipeline_decisions, cfg.compiled,
                          progress=say, functions=functions)
    say("offline scoring")
    scored = dict(routers)
    if trained[0].split == "lofo":
        say("refitting every router on each leave-one-family-out fold")
        scored.update(held_out_family_routers(table, trained))
    with_oracle = {**scored, "oracle": OracleRouter().fit(test)}
    per_request = score_offline(test, with_oracle, {k: v.p50_us for k, v in overhead.items()})
    # which held-out requests lie outside the training part's feature ranges
    from routers.scoring.coverage import coverage, risk_table, split_headlines

    split, test_size, seed = _split_of(trained)
    folds = split_indices(table, split, test_size, seed)
    marks, ranges = coverage(table, folds if split == "lofo" else folds[:1])
    per_request = per_request.merge(marks, on="request_id", how="left")
    per_family, overall = aggregate_scores(per_request)
    context = {
        "name": cfg.name or out.name, "training_table_hash": frame_hash(table),
        "profile_hash": meta["profile_hash"], "held_out_requests": len(test),
        "families": ", ".join(sorted(test["family"].astype(str).unique())),
        "split": trained[0].split, "constraints": json.dumps(meta["constraints"]),
        "decision_path": "compiled" if cfg.compiled else "pipeline (--no-compile)",
        "router_runs": ", ".join(f"{t.name}={t.run_id}" for t in trained),
    }
    live_per = live_summary = live_family = estimate = None
    live_figures = {}
    if cfg.live:
        from engine.models.resolve import resolve_models
        from oracle.constraints import Constraints
        from routers.scoring.live import run_live, score_live, stratified, summarise_live

        n_live = cfg.live_requests or cfg.live_per_family * len({r.family for r in requests})
        stream = stratified(requests, n_live, cfg.seed)
        decisions = {name: [str(fn(r)) for r in stream] for name, (fn, _, _) in functions.items()}
        for name, router in scored.items():  # leave-one-family-out: each family's own fold
            if isinstance(router, HeldOutFamilyRouter):
                decisions[name] = [str(router.route(r)) for r in stream]
        # the profile oracle's pick, run live
        decisions["oracle"] = [with_oracle["oracle"].route(r) for r in stream]
        target, draft, _ = resolve_models(cfg.model, cfg.draft_model, None, None, lambda *a: None)
        threads, threads_from = live_threads(cfg, meta)
        if not threads_from.startswith(("the profile's", "--live")):
            say(f"live: engine threads {threads}: {threads_from}")
        runs = run_live(stream, decisions, target, draft, cfg.device, progress=say, backend=cfg.backend,
                        trials=cfg.live_trials, threads=threads, max_remeasure=cfg.live_max_remeasure)
        live_per, estimate, live_figures = score_live(
            runs, stream, decisions, {k: v.p50_us for k, v in overhead.items()},
            Constraints(**{k: v for k, v in meta["constraints"].items()}), test)
        live_summary = summarise_live(live_per)
        live_family = summarise_live(live_per, by_family=True)
        context["live_requests"] = len(stream)
        context["live_trials"] = cfg.live_trials
        context["live_threads"] = f"{threads}: {threads_from}"
        context["live_model"] = str(target)
    from routers.scoring.offline import offline_intervals

    say("writing the report")
    intervals = offline_intervals(per_request)
    head = report.headline_table(overall, overhead, intervals=intervals)
    parts = split_headlines(per_request, overhead, marks)
    live_parts = {}
    if live_per is not None and "request_id" in live_per:
        ext = set(marks.loc[marks["extrapolated"], "request_id"])
        for name, part in (("inside", live_per[~live_per["request_id"].astype(str).isin(ext)]),
                           ("extrapolated", live_per[live_per["request_id"].astype(str).isin(ext)])):
            if len(part):
                live_parts[name] = summarise_live(part)
    coverage_info = {"ranges": ranges, "headlines": parts, "live": live_parts,
                     "extrapolated": int(marks["extrapolated"].sum()), "held_out": len(marks),
                     "risk": risk_table({t.name: scored.get(t.name, t.estimator) for t in trained},
                                        head, live_summary, held_out=len(marks),
                                        live_requests=context.get("live_requests", 0))}
    report.write_report(out, per_request=per_request, per_family=per_family, overall=overall,
                        overhead=overhead, context=context, live_per=live_per,
                        live_summary=live_summary, estimate=estimate, live_figures=live_figures,
                        live_family=live_family, intervals=intervals, coverage=coverage_info)
    run_id = report.log_to_mlflow(out, Path(cfg.mlruns), head, context,
                                  {t.name: t.run_id for t in trained}, live_summary, table=table)
    return {"headline": head, "overall": overall, "per_family": per_family, "overhead": overhead,
            "live_summary": live_summary, "live_family": live_family, "live_per": live_per, "live_figures": live_figures,
            "estimate": estimate,
            "mlflow_run_id": run_id, "trained": trained}
