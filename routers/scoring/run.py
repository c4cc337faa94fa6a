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

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import FEATURE_SET_C
from modeswitch.engine.hardware import hardware_string, other_kinds, recorded_hardware
from modeswitch.engine.models.resolve import resolve_models
from modeswitch.engine.profiler.plan import check_plan, profiled_units
from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.training_table import frame_hash
from modeswitch.routers.reference import FixedModeRouter, OracleRouter
from modeswitch.routers.rule_baseline import RuleBaselineRouter
from modeswitch.routers.scoring import overhead as oh
from modeswitch.routers.scoring import report
from modeswitch.routers.scoring.capture import envelope, router_points
from modeswitch.routers.scoring.coverage import (
    coverage,
    measurement_sources,
    new_family_breaks,
    risk_by_family,
    risk_table,
    split_headlines,
)
from modeswitch.routers.scoring.live import (
    run_live,
    score_live,
    stratified,
    summarise_live,
)
from modeswitch.routers.scoring.offline import (
    aggregate_scores,
    offline_intervals,
    requests_from_table,
    score_offline,
)
from modeswitch.routers.training.splits import split_indices
from modeswitch.routers.training.table import TrainingTable
from modeswitch.routers.training.tracking import FOLD_PARAMS, setup, use_tracking_uri

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
    #: else 1 on CPU (two OpenMP threads on a small machine slow manyfold when anything
    #: else takes a core; see engine.noise), the backend's own choice on CUDA
    live_threads: int | None = None
    #: times a contended live trial is measured again
    live_max_remeasure: int = 2
    #: None: the default model (engine.models.resolve.default_model)
    model: str | None = None
    draft_model: str | None = None
    device: str = "cpu"
    backend: str = "transformers"
    #: weights per format live (``EngineSettings.checkpoints``: vLLM's pre-quantized
    #: checkpoints, llama.cpp's GGUF types); empty: the profile plan's, as it was measured
    checkpoints: dict = field(default_factory=dict)
    seed: int = 0
    name: str | None = None
    #: score on all rows or only measured labels (as the routers were trained: `train --labels`)
    labels: str = "all"
    #: compute the split's capture / violation ceiling and plot the routers beside it
    frontier: bool = True
    #: replay each certified router over the held-out requests with its threshold adapted
    #: online by every pick's outcome (routers.scoring.adaptive)
    adaptive: bool = True
    #: the profile's plan (:class:`modeswitch.engine.profiler.ProfileSpec` as a dict): live, each
    #: measured request runs with the prompts the profiler built for it (a study passes
    #: it); None: rebuilt from the table's row, whose prompts may differ
    profile_plan: dict | None = None


def live_checkpoints(cfg: ScoreConfig) -> dict:
    """The weights per format the live engines load: as asked, else the profile plan's
    (the live check measures what the table measured)."""
    return dict(cfg.checkpoints or (cfg.profile_plan or {}).get("checkpoints") or {})


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
    #: leave one family out, tuned per fold (``lofo_tuning="nested"``): each fold's
    #: parameters and regret weights, by held-out family (the run's ``fold_params.json``);
    #: None: every fold refits with the logged model's
    fold_params: dict | None = None


def find_runs(table: pd.DataFrame, mlruns: str, run_ids=()) -> list[dict]:
    """Training runs to score: the named ones, or the latest per family for this table."""
    import mlflow  # lazy: MLflow is slow to import

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
                    "unsafe_penalty": float(tags.get("unsafe_penalty", 1.0)),
                    "nested": params.get("lofo_tuning") == "nested"})
    return out


def load_routers(table, mlruns, run_ids=()) -> list[TrainedRouter]:
    import mlflow  # lazy: MLflow is slow to import
    import mlflow.sklearn  # lazy: MLflow is slow to import

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
        folds = _fold_params(r["run_id"]) if r["nested"] else None
        out.append(TrainedRouter(r["family"], r["run_id"], uri, est, r["split"], r["test_size"],
                                 r["seed"], r["feature_set"], r["regret_weights"], r["unsafe_penalty"], folds))
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


def _fold_params(run_id: str) -> dict:
    """A nested leave-one-family-out run's per-fold parameters (its ``fold_params.json``)."""
    import mlflow  # lazy: MLflow is slow to import

    try:
        return mlflow.artifacts.load_dict(f"runs:/{run_id}/{FOLD_PARAMS}")
    except Exception as exc:  # MLflow raises its own errors for a missing artifact
        raise InputError(f"run {run_id} was tuned per leave-one-family-out fold but its {FOLD_PARAMS} "
                         f"cannot be read ({type(exc).__name__}: {exc}); retrain it") from None


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


def held_out_family_routers(table: TrainingTable, trained: list[TrainedRouter]) -> dict:
    """Per trained router, a :class:`HeldOutFamilyRouter` refitted on every
    leave-one-family-out fold (as training fitted it: :meth:`TrainingTable.refit`, with
    the fold's own parameters where training tuned each fold)."""
    folds = table.folds(*_split_of(trained))
    out = {}
    for t in trained:
        by_family = {}
        for tr, te in folds:
            fam = table.held_out_family(te)
            if t.fold_params is None:
                by_family[fam] = table.refit(t.estimator, tr, t.regret_weights, t.unsafe_penalty)
                continue
            if fam not in t.fold_params:
                raise InputError(f"run {t.run_id} ({t.name}) was tuned per fold, but not for a fold holding "
                                 f"{fam!r} out (it has {', '.join(sorted(t.fold_params))})")
            fold = t.fold_params[fam]
            by_family[fam] = table.refit(t.estimator, tr, bool(fold["regret_weights"]), t.unsafe_penalty,
                                         params=fold["params"])
        out[t.name] = HeldOutFamilyRouter(by_family)
    return out


def baselines(modes: list[str]) -> dict:
    """The routers every scoring sets the learned ones beside: the reference mode alone,
    and the rule baseline over the table's modes."""
    return {"reference": FixedModeRouter().fit(),
            "rule": RuleBaselineRouter(available_modes=modes, unavailable="reference").fit()}


@dataclass
class Scoring:
    """What the steps of :func:`score_routers` hand on: the table, the trained routers,
    the held-out rows and requests, every router scored and, step by step, the figures."""

    table: TrainingTable
    trained: list[TrainedRouter]
    test: pd.DataFrame
    requests: list
    #: ``requests`` as routers see them: with their prompts' token ids where the table has
    #: them (routers reading the prompt need them; the engines run ``requests``)
    routed: list
    #: the baselines and the trained routers, as loaded (what the overhead timer runs)
    routers: dict
    #: the routers scored offline: leave-one-family-out, each family's own fold
    scored: dict = field(default_factory=dict)
    functions: dict = field(default_factory=dict)
    overhead: dict = field(default_factory=dict)
    per_request: pd.DataFrame | None = None
    marks: pd.DataFrame | None = None
    ranges: object = None
    per_family: pd.DataFrame | None = None
    overall: pd.DataFrame | None = None
    #: the capture / violation ceiling of the split (routers.scoring.frontier), if computed
    frontier: object = None
    #: the same ceiling with safety predicted from shape and content (feature set C), where
    #: the table has content columns
    content_frontier: object = None
    #: each certified router's capture / violations with its threshold swept over the
    #: held-out requests (routers.scoring.threshold_sweep), and what its certificate costs
    router_curves: pd.DataFrame | None = None
    certificate_price: pd.DataFrame | None = None
    certificate_refusals: pd.DataFrame | None = None
    #: each certified router replayed with its threshold adapted online, pooled and per family
    adaptive: pd.DataFrame | None = None
    adaptive_family: pd.DataFrame | None = None

    @property
    def p50(self) -> dict:
        return {k: v.p50_us for k, v in self.overhead.items()}


@dataclass
class LiveScores:
    """The live check's results (all None when it did not run)."""

    per: pd.DataFrame | None = None
    summary: pd.DataFrame | None = None
    family: pd.DataFrame | None = None
    estimate: pd.DataFrame | None = None
    figures: dict = field(default_factory=dict)
    #: every live trial as run (output tokens, TTFT, CPU share, contention): what the
    #: medians above come from, kept so a miss against the table can be traced
    runs: pd.DataFrame | None = None


def load_scoring(table, cfg: ScoreConfig, say) -> Scoring:
    """The routers to score (from MLflow) beside the baselines, and the held-out rows of
    their split."""
    use_tracking_uri(cfg.tracking_uri)
    table = TrainingTable.of(table, cfg.labels)
    say("loading trained routers from MLflow")
    trained = load_routers(table.frame, cfg.mlruns, cfg.run_ids)
    test = table.rows(held_out_rows(table.frame, trained)).frame
    routers = {**baselines(table.modes), **{t.name: t.estimator for t in trained}}
    return Scoring(table, trained, test, requests_from_table(test), requests_from_table(test, token_ids=True),
                   routers)


def measure_overhead(s: Scoring, cfg: ScoreConfig, say) -> None:
    """Each router's decision cost on the held-out requests (its compiled form by default)."""
    say("measuring routing overhead")
    s.functions = oh.decision_functions(s.routers, cfg.compiled)
    s.overhead = oh.measure(s.routers, s.routed, cfg.decisions, cfg.pipeline_decisions, cfg.compiled,
                            progress=say, functions=s.functions,
                            frame=s.test)


def score_offline_step(s: Scoring, say) -> None:
    """Every router's picks on the held-out rows against the oracle's, marked by whether
    the row lies outside the training part's feature ranges."""
    say("offline scoring")
    s.scored = dict(s.routers)
    split, test_size, seed = _split_of(s.trained)
    if split == "lofo":
        say("refitting every router on each leave-one-family-out fold")
        s.scored.update(held_out_family_routers(s.table, s.trained))
    s.scored["oracle"] = OracleRouter().fit(s.test)
    per_request = score_offline(s.test, s.scored, s.p50)
    folds = s.table.folds(split, test_size, seed)
    s.marks, s.ranges = coverage(s.table.frame, folds if split == "lofo" else folds[:1])
    s.per_request = per_request.merge(s.marks, on="request_id", how="left")
    s.per_family, s.overall = aggregate_scores(s.per_request)


def frontier_step(s: Scoring, say) -> None:
    """The split's measured ceiling: the best share of the oracle's saving at each
    violation rate for a router that knows every latency and predicts safety from the
    request's shape (routers.scoring.frontier), beside which the report plots the routers.
    A research add-on the score runs by default (``--no-frontier`` leaves it out), so it
    does not warn."""
    # behind the experimental boundary: loaded only when the step runs
    from modeswitch.experimental import run_by_default
    from modeswitch.routers.scoring.frontier import frontier

    split, test_size, seed = _split_of(s.trained)
    say(f"frontier: safety predicted out of fold on the {split} split")
    try:
        with run_by_default():
            s.frontier = frontier(s.table.frame, split, "A", "lgbm", True, test_size, seed)
            if all(c in s.table.frame for c in FEATURE_SET_C):
                say("frontier: again with content features (feature set C)")
                s.content_frontier = frontier(s.table.frame, split, "C", "lgbm", True, test_size, seed)
    except (ValueError, KeyError) as exc:  # a table without per-mode safety: no ceiling to draw
        say(f"frontier: not computed ({exc})")


def certificate_price_step(s: Scoring, say) -> None:
    """Each certified router's threshold swept over the held-out requests, and its
    certified point set beside the curve's best at its target (hindsight) and the
    ceiling's (routers.scoring.threshold_sweep). Runs with the frontier, without warning."""
    # behind the experimental boundary: loaded only when the step runs
    from modeswitch.experimental import run_by_default
    from modeswitch.routers.scoring.refusals import certificate_refusals
    from modeswitch.routers.scoring.threshold_sweep import (
        certificate_price,
        certified_parts,
        router_curves,
        targets_of,
    )

    targets = targets_of(s.scored)
    if not targets:
        return
    say("sweeping the certified routers' thresholds over the held-out requests (hindsight, a diagnostic)")
    with run_by_default():
        s.router_curves = router_curves({k: s.scored[k] for k in targets}, s.test, s.marks)
        ceiling = s.content_frontier if s.content_frontier is not None else s.frontier
        env = envelope(ceiling.curve) if ceiling is not None and len(ceiling.curve) else None
        own = ceiling.curve[ceiling.curve["rule"] == "threshold"] if env is not None else None  # the routers' rule
        s.certificate_price = certificate_price(s.router_curves, router_points(s.per_request), targets, env,
                                                envelope(own) if own is not None and len(own) else None)
        s.certificate_refusals = certificate_refusals({k: certified_parts(s.scored[k]) for k in targets},
                                                      s.table.frame)


def adaptive_step(s: Scoring, say) -> None:
    """Each certified router served to the held-out requests as a stream, its threshold
    moved by every pick's outcome (routers.adaptive), beside its certified threshold. A
    research add-on the score runs by default (``--no-adaptive`` leaves it out), so it
    does not warn."""
    # behind the experimental boundary: loaded only when the step runs
    from modeswitch.experimental import run_by_default
    from modeswitch.routers.scoring.adaptive import adaptive_replay

    say("replaying the certified cost routers with their thresholds adapted online")
    with run_by_default():
        s.adaptive, s.adaptive_family = adaptive_replay(s.scored, s.test, s.marks, seed=s.trained[0].seed)


def report_context(s: Scoring, cfg: ScoreConfig, out: Path) -> dict:
    """What the report's header says: the table, the split, the runs scored."""
    meta = s.table.meta
    return {
        "name": cfg.name or out.name, "training_table_hash": s.table.hash,
        "profile_hash": meta["profile_hash"], "held_out_requests": len(s.test),
        "families": ", ".join(sorted(s.test["family"].astype(str).unique())),
        "split": s.trained[0].split, "constraints": json.dumps(meta["constraints"]),
        "decision_path": "compiled" if cfg.compiled else "pipeline (--no-compile)",
        "router_runs": ", ".join(f"{t.name}={t.run_id}" for t in s.trained),
        **({"tuning": _tuning_said(s.trained)} if s.trained[0].split == "lofo" else {}),
    }


def _tuning_said(trained: list[TrainedRouter]) -> str:
    """Leaving one family out: where each router's parameters were tuned."""
    nested = [t.name for t in trained if t.fold_params is not None]
    pooled = [t.name for t in trained if t.fold_params is None]
    said = []
    if nested:
        said.append(f"{', '.join(nested)}: one Optuna study per fold, on its training families only (nested)")
    if pooled:
        said.append(f"{', '.join(pooled)}: one study on every row, the held-out family's among them (pooled)")
    return "; ".join(said)


def live_decisions(s: Scoring, stream: list) -> dict:
    """Each router's pick for each live request (leave-one-family-out: the family's own
    fold; the oracle: the profile's pick)."""
    routed = {r.id: r for r in s.routed}
    seen = [routed.get(r.id, r) for r in stream]  # with token ids where the table has them
    decisions = {name: [str(fn(r)) for r in seen] for name, (fn, _, _) in s.functions.items()}
    for name, router in s.scored.items():
        if isinstance(router, HeldOutFamilyRouter):
            decisions[name] = [str(router.route(r)) for r in seen]
    decisions["oracle"] = [s.scored["oracle"].route(r) for r in stream]
    return decisions


def profile_hardware(meta: dict) -> list[str]:
    """The hardware lines the table's profile ran on: recorded in the table (``hardware``),
    else read from its profile file where that is still there; [] where unknown."""
    if meta.get("hardware"):
        return [str(h) for h in meta["hardware"]]
    source = meta.get("profile_source")
    return recorded_hardware(source) if source and Path(source).is_file() else []


def score_live_step(s: Scoring, cfg: ScoreConfig, context: dict, say) -> LiveScores:
    """Run the routers' picks on the engines for a stratified stream of held-out requests."""
    n_live = cfg.live_requests or cfg.live_per_family * len({r.family for r in s.requests})
    measured = set(s.test.loc[s.test["label_source"] == "measured", "request_id"].astype(str)) \
        if "label_source" in s.test else set()
    stream = stratified(s.requests, n_live, cfg.seed, prefer=measured)
    decisions = live_decisions(s, stream)
    target, draft, _ = resolve_models(cfg.model, cfg.draft_model, None, None, lambda *a: None)
    threads, threads_from = live_threads(cfg, s.table.meta)
    if not threads_from.startswith(("the profile's", "--live")):
        say(f"live: engine threads {threads}: {threads_from}")
    replay = {k: v for k, v in profiled_units(cfg.profile_plan).items() if k in {r.id for r in stream}}
    check_plan(stream, {k: members[0] for k, (members, _) in replay.items()}, "live")
    if measured and cfg.profile_plan is None:
        say("live: no profile plan given: measured requests run with prompts rebuilt from the "
            "table's rows, which may differ from the profiled ones")
    runs = run_live(stream, decisions, target, draft, cfg.device, progress=say, backend=cfg.backend,
                    trials=cfg.live_trials, threads=threads, max_remeasure=cfg.live_max_remeasure,
                    replay=replay, checkpoints=live_checkpoints(cfg))
    here, profiled = hardware_string(cfg.device), profile_hardware(s.table.meta)
    other = bool(other_kinds(here, profiled))
    if other:
        say(f"live: this machine ({here}) is not the kind the profile ran on ({'; '.join(profiled)}): "
            "a measured label's live violation is counted as other_hardware")
    per, estimate, figures = score_live(runs, stream, decisions, s.p50,
                                        Constraints(**dict(s.table.meta["constraints"])), s.test,
                                        other_hardware=other)
    context.update(live_requests=len(stream), live_trials=cfg.live_trials,
                   live_threads=f"{threads}: {threads_from}", live_model=str(target), live_hardware=here,
                   live_replayed_as_profiled=len(replay),
                   profile_hardware="; ".join(profiled) or "unknown",
                   live_on_the_profile_kind=("unknown" if not profiled else not other))
    return LiveScores(per, summarise_live(per), summarise_live(per, by_family=True), estimate, figures,
                      runs=runs)


def coverage_info(s: Scoring, head: pd.DataFrame, live: LiveScores, context: dict) -> dict:
    """The report's coverage section: figures inside and outside the training ranges."""
    live_parts = {}
    if live.per is not None and "request_id" in live.per:
        ext = set(s.marks.loc[s.marks["extrapolated"], "request_id"])
        inside = live.per["request_id"].astype(str).isin(ext)
        for name, part in (("inside", live.per[~inside]), ("extrapolated", live.per[inside])):
            if len(part):
                live_parts[name] = summarise_live(part)
    certified = {t.name: s.scored.get(t.name, t.estimator) for t in s.trained}
    risk = risk_table(certified, head, live.summary,
                      held_out=len(s.marks), live_requests=context.get("live_requests", 0))
    family = risk_by_family(certified, s.per_request, measurement_sources(s.table.frame))
    return {"ranges": s.ranges, "headlines": split_headlines(s.per_request, s.overhead, s.marks),
            "live": live_parts, "extrapolated": int(s.marks["extrapolated"].sum()),
            "held_out": len(s.marks), "risk": risk,
            "risk_family": family, "new_family": new_family_breaks(family)}


def write_outputs(s: Scoring, cfg: ScoreConfig, out: Path, live: LiveScores, context: dict, say):
    """The report in ``out`` and its MLflow run; (headline table, the run's id)."""
    say("writing the report")
    intervals = offline_intervals(s.per_request)
    head = report.headline_table(s.overall, s.overhead, intervals=intervals)
    report.write_report(out, per_request=s.per_request, per_family=s.per_family, overall=s.overall,
                        overhead=s.overhead, context=context, live_per=live.per,
                        live_summary=live.summary, estimate=live.estimate, live_figures=live.figures,
                        live_family=live.family, live_runs=live.runs, intervals=intervals,
                        frontier=s.frontier, content_frontier=s.content_frontier,
                        router_curves=s.router_curves, certificate_price=s.certificate_price,
                        certificate_refusals=s.certificate_refusals, adaptive=s.adaptive,
                        adaptive_family=s.adaptive_family,
                        coverage=coverage_info(s, head, live, context))
    run_id = report.log_to_mlflow(out, Path(cfg.mlruns), head, context,
                                  {t.name: t.run_id for t in s.trained}, live.summary, table=s.table.frame)
    return head, run_id


def score_routers(table, cfg: ScoreConfig, out: Path, progress=None) -> dict:
    """Run the whole scoring (``table``: a training table, frame or :class:`TrainingTable`);
    returns the tables and figures (the report is written to ``out``)."""
    def say(msg):
        if progress:
            progress(msg)

    s = load_scoring(table, cfg, say)
    measure_overhead(s, cfg, say)
    score_offline_step(s, say)
    if cfg.frontier:
        frontier_step(s, say)
        certificate_price_step(s, say)
    if cfg.adaptive:
        adaptive_step(s, say)
    context = report_context(s, cfg, out)
    live = score_live_step(s, cfg, context, say) if cfg.live else LiveScores()
    head, run_id = write_outputs(s, cfg, out, live, context, say)
    return {"headline": head, "overall": s.overall, "per_family": s.per_family, "overhead": s.overhead,
            "live_summary": live.summary, "live_family": live.family, "live_per": live.per,
            "live_figures": live.figures, "estimate": live.estimate, "mlflow_run_id": run_id,
            "trained": s.trained}
