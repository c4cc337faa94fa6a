"""Train the learned routers: splits, Optuna tuning, MLflow tracking.

Per router family: an Optuna study (TPE sampler, median pruner) minimises the
validation objective of :mod:`modeswitch.routers.training.costs` (mean latency regret + penalty per
unsafe pick) over inner folds of the training part, reporting after each fold
so that poor trials are pruned. The best parameters are refit on the training
part and scored on the held-out part next to the rule baseline on the same
requests. MLflow gets one parent run per family (params, metrics, tags,
confusion matrix, feature importance, label distribution, the fitted model with
its signature) and one nested run per trial (optuna-integration's callback).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import socket
import tempfile
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import ConfusionMatrixDisplay
from threadpoolctl import threadpool_limits

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import reads_content
from modeswitch.routers.certificates import CERTIFICATES
from modeswitch.routers.certified import CertifiedRouter, has_risk_score
from modeswitch.routers.registry import (
    check_router_params,
    get_family,
    get_router,
    learned_families,
)
from modeswitch.routers.rule_baseline import RuleBaselineRouter
from modeswitch.routers.training import parallel
from modeswitch.routers.training.costs import OBJECTIVES, UNSAFE_PENALTY, objective_metrics
from modeswitch.routers.training.first_trial import carried_trial, default_trial
from modeswitch.routers.training.served import served_decision
from modeswitch.routers.training.splits import LOFO_TUNING, inner_folds
from modeswitch.routers.training.table import TrainingTable
from modeswitch.routers.training.tracking import (
    FOLD_PARAMS,
    git_commit,
    log_table_input,
    setup,
    tracking_uri,
    use_tracking_uri,
)
from modeswitch.routers.training.transfer import best_trial, family_excess, set_constraints

#: The study's learned-router setup (arXiv 2605.23057): random 75/25 split, seed 42,
#: scaler + one-hot pipeline, fixed hyperparameters.
PAPER_PRESET = {
    "split": "random", "test_size": 0.25, "seed": 42, "feature_set": "B",
    "params": {
        "dt": dict(max_depth=5, min_samples_leaf=3, class_weight="balanced"),
        "rf": dict(n_estimators=300, max_depth=10, min_samples_leaf=2, class_weight="balanced"),
        "lr": dict(max_iter=3000, class_weight="balanced"),
        "lgbm": dict(class_weight="balanced"),
    },
}




@dataclass
class TrainConfig:
    #: router families to train (default: every registered learned family)
    routers: list[str] = field(default_factory=learned_families)
    feature_set: str = "A"
    split: str = "group"
    trials: int = 30
    seed: int = 42
    test_size: float = 0.25
    unsafe_penalty: float = UNSAFE_PENALTY
    #: Optuna storage URL; None: SQLite in ``mlruns``. Several processes or machines
    #: tuning one study together: a PostgreSQL URL (see routers.training.parallel)
    storage: str | None = None
    #: local processes tuning each family's study together
    workers: int = 1
    mlruns: str = "mlruns"
    #: MLflow tracking store (e.g. an ``mlflow server``); None: $MLFLOW_TRACKING_URI, else
    #: SQLite in ``mlruns``
    tracking_uri: str | None = None
    preset: str | None = None
    safety_threshold: float | None = None
    fallback: str = "rule"
    #: train and score on every row ("all") or only on labels from the requests' own
    #: measurements ("measured"), not estimated ones
    labels: str = "all"
    #: tuning scores each fold model as it serves: its compiled (or distilled) picks, and
    #: its measured decision p50 added to every request's latency (routers.training.served);
    #: False: the scikit-learn predictions at no cost (the study's original objective)
    decision_cost: bool = True
    #: routers with a certifiable safety threshold (the cost-predicting ones; the
    #: classifiers when ``safety_threshold`` is set) calibrate it on held-out training
    #: rows so that new requests violate a constraint at most this often, with
    #: probability 1 - delta (Learn then Test); 0: no calibration, the tuned threshold
    target_violation_rate: float = 0.01
    #: what the certificate bounds (routers.certified): "pooled" (the calibration rows'
    #: rate), "per-family" (every family's, small ones pooled), "family-held-out" (pooled,
    #: each row decided by a clone that never saw its family) or "per-family-held-out" (both);
    #: "family-cross-fit" / "per-family-cross-fit": the same on every training row, each
    #: decided by a clone fitted on the other families (routers.certified, calibrate_on)
    certificate: str = "pooled"
    #: fixed parameters per router family, beside the tuned ones (and over them where
    #: both name one), e.g. {"cost_lgbm": {"risk_score": "margin", "cost_features": "shape"}}
    router_params: dict = field(default_factory=dict)
    #: what Optuna minimises for the families whose trials are scored as certified
    #: (routers.training.costs.OBJECTIVES; :func:`objective_of`): "regret" (mean latency
    #: regret + the unsafe penalty per pick) or "capture" (1 - the pooled share of the
    #: oracle's saving kept + the penalty times the violation rate, the report's figure).
    #: The other families always minimise regret
    tuning_objective: str = "regret"
    #: leaving one family out, where the parameters are tuned (:data:`LOFO_TUNING`):
    #: "nested", one Optuna study per fold on its training families only, so no held-out
    #: family's outcomes choose the parameters it is scored with; "pooled", one study
    #: on every row (7x cheaper with 7 families, but the held-out family's outcomes
    #: take part in choosing its parameters: a selection effect)
    lofo_tuning: str = "nested"

    def __post_init__(self):
        if self.workers < 1:
            raise InputError(f"--workers {self.workers}: must be at least 1")
        check_router_params(self.router_params)
        if not 0 <= self.target_violation_rate < 1:
            raise InputError(f"--target-violation-rate {self.target_violation_rate}: must lie in "
                             "[0, 1) (0: no certification)")
        if self.certificate not in CERTIFICATES:
            raise InputError(f"--certificate {self.certificate!r}: choose one of {', '.join(CERTIFICATES)}")
        if self.tuning_objective not in OBJECTIVES:
            raise InputError(f"--tuning-objective {self.tuning_objective!r}: choose one of {', '.join(OBJECTIVES)}")
        if self.lofo_tuning not in LOFO_TUNING:
            raise InputError(f"--lofo-tuning {self.lofo_tuning!r}: choose one of {', '.join(LOFO_TUNING)}")
        self._warn_research()

    def _warn_research(self) -> None:
        """One ExperimentalWarning per research choice: a certificate beyond the pooled one,
        the capture objective, pooled leave-one-family-out tuning (modeswitch.experimental)."""
        chosen = [f"--certificate {self.certificate}" if self.certificate != "pooled" else None,
                  "--tuning-objective capture" if self.tuning_objective == "capture" else None,
                  "--lofo-tuning pooled" if self.lofo_tuning == "pooled" else None]
        if any(chosen):
            # behind the experimental boundary: loaded only when a research option is chosen
            from modeswitch.experimental import warn_experimental

            for feature in filter(None, chosen):
                warn_experimental(feature, stacklevel=4)

    def apply_preset(self) -> TrainConfig:
        if self.preset is None:
            return self
        if self.preset != "modeswitch-paper":
            raise InputError(f"unknown preset {self.preset!r}; known: modeswitch-paper")
        self.split, self.test_size = PAPER_PRESET["split"], PAPER_PRESET["test_size"]
        self.seed, self.feature_set = PAPER_PRESET["seed"], PAPER_PRESET["feature_set"]
        return self


def _router(family, params, cfg: TrainConfig, content_model=None):
    """The family's unfitted router as training builds it: the trial's ``params``, the
    guard's settings where the family takes them, the content model where given, and
    the config's fixed parameters over all of them."""
    extra = {k: v for k, v in params.items() if k != "regret_weights"}
    for name, value in (("safety_threshold", cfg.safety_threshold), ("fallback", cfg.fallback)):
        if _accepts(family, name):  # the guard is the mode classifiers' own
            extra[name] = value
    if content_model is not None:
        extra["content_model"] = content_model
    extra.update(cfg.router_params.get(family, {}))
    return get_router(family, feature_set=cfg.feature_set, **extra)


def _fit(family, params, cfg: TrainConfig, table: TrainingTable, idx, use_weights, certify=True,
         transfer=False):
    """One router fitted on rows ``idx``. ``certify``: with the config's target, a router
    with a risk score is wrapped in :class:`~modeswitch.routers.certified.CertifiedRouter`, its
    threshold certified on held-out rows of ``idx`` (the final and cross-fitted fits;
    ``transfer``: also each family's picks at the threshold certified without it);
    Optuna's inner folds fit without it, so tuning compares the models (with their
    tuned ``max_risk``), not folds too small to certify anything."""
    content_model = None
    if reads_content(cfg.feature_set) and _accepts(family, "content_model"):
        content_model = table.meta.get("content_model")
        if content_model is None:
            raise InputError(f"feature set {cfg.feature_set} reads the prompt's content; this training table has "
                             "no content columns (build it with `dataset build --content-model PATH`)")
    est = _router(family, params, cfg, content_model)
    if certify and cfg.target_violation_rate and has_risk_score(est):
        est = CertifiedRouter(est, target_violation_rate=cfg.target_violation_rate, family_transfer=transfer,
                              **CERTIFICATES[cfg.certificate])
    return table.fit(est, idx, use_weights, cfg.unsafe_penalty)


def _tuning_key(family: str, cfg: TrainConfig, search_space: int | None = None) -> str:
    """What else the trials' scores depend on, as a suffix of the Optuna study's name
    (empty at the defaults, so studies named before it resume): a changed test share,
    labels, penalty, decision cost, objective or fixed parameters start a new study instead of
    mixing their trials with the old ones; so does a family's changed search space
    (its ``search_space_version``; ``search_space``: the key another version had)."""
    version = search_space or getattr(get_family(family).factory, "search_space_version", 1)
    d = {"test_size": cfg.test_size, "labels": cfg.labels, "unsafe_penalty": cfg.unsafe_penalty,
         "decision_cost": cfg.decision_cost, "params": cfg.router_params.get(family, {}),
         "safety_threshold": cfg.safety_threshold, "fallback": cfg.fallback,
         "search_space": version,
         "objective": objective_of(family, cfg)}
    defaults = {"test_size": 0.25, "labels": "all", "unsafe_penalty": UNSAFE_PENALTY, "decision_cost": True,
                "params": {}, "safety_threshold": None, "fallback": "rule", "search_space": 1,
                "objective": "regret"}
    if _tunes_certified(family, cfg):  # its trials score other picks: their own study
        # judged on the families its certificate did not see (routers.training.transfer)
        d["certified"] = {"target": cfg.target_violation_rate, "certificate": cfg.certificate,
                          "judged": "family-transfer"}
    changed = {k: v for k, v in d.items() if v != defaults.get(k)}
    if not changed:
        return ""
    return "-" + hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _tunes_certified(family: str, cfg: TrainConfig) -> bool:
    """Whether Optuna scores a family's trials by their certified picks: where the router
    has a risk score and the certificate calibrates on every row by family cross-fitting
    (``family-cross-fit``, ``per-family-cross-fit``). Each trial is then one certified fit
    on the tuning rows, scored by the objective on each family's picks at the threshold
    certified *without* that family, made by a clone that never saw it, and constrained
    to keep every family's rate there within target + slack
    (:mod:`modeswitch.routers.training.transfer`). Why: tuned on inner folds
    without the certificate, the models that win are the ones bold at their tuned
    ``max_risk``, which the certificate then reins in; scored as certified, a trial is
    judged on what it will serve, with no extra fold. (Its
    decision cost is not timed per trial; the score step times the final router.)"""
    if not cfg.target_violation_rate or CERTIFICATES[cfg.certificate].get("calibrate_on") != "all":
        return False
    return has_risk_score(_router(family, {}, cfg))  # a guarded mode classifier has one too


def objective_of(family: str, cfg: TrainConfig) -> str:
    """What Optuna minimises for ``family``: ``cfg.tuning_objective`` where its trials are
    scored as certified (:func:`_tunes_certified`), else mean regret. Why: capture alone
    rewards any fast pick, safe or not, and only a certificate holds the violations to a
    target; tuned on capture without one, the per-request study's decision tree reached
    39 % violations on the group split (against 10-16 % tuned on regret)."""
    return cfg.tuning_objective if _tunes_certified(family, cfg) else "regret"


def _accepts(family: str, param: str) -> bool:
    """Does the family's estimator take ``param``?"""
    return param in inspect.signature(get_family(family).factory).parameters


def tune(family, cfg: TrainConfig, table: TrainingTable, train_idx, study_name, callbacks=(),
         worker: int = 0, parent_run_id: str | None = None, earlier: tuple[str, ...] | list[str] = ()):
    """Optuna search over the family's space, until the study holds ``cfg.trials``
    finished trials (whoever ran them); returns the study. Worker 0 with
    ``cfg.workers > 1`` starts the other workers on the same study first
    (:mod:`modeswitch.routers.training.parallel`). A new study's first trial is the family's
    defaults; its second, the best of the first study in ``earlier`` (the same study
    under an earlier search space) holding a finished trial (:mod:`first_trial`)."""
    import optuna  # heavy: only when tuning
    from optuna.study import MaxTrialsCallback  # lazy: Optuna is slow to import

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if cfg.storage is None:
        Path(cfg.mlruns).mkdir(parents=True, exist_ok=True)
    url = cfg.storage or f"sqlite:///{(Path(cfg.mlruns).resolve() / 'optuna.db')}"
    # shared: other processes may tune this study too (an explicit storage, or workers here)
    shared = cfg.storage is not None or cfg.workers > 1
    study = optuna.create_study(
        study_name=study_name, storage=parallel.optuna_storage(url, shared), direction="minimize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=parallel.sampler_seed(cfg.seed, worker, shared)),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0),
    )
    train = table.rows(train_idx)
    folds = inner_folds(train.frame, cfg.split, cfg.seed)
    space = get_family(family).factory.search_space
    worker_id = f"{socket.gethostname()}:{os.getpid()}"

    certified_tuning = _tunes_certified(family, cfg)

    def objective(trial):
        if shared:  # which process ran it
            trial.set_user_attr("worker", worker_id)
        params = space(trial)
        use_w = trial.suggest_categorical("regret_weights", [False, True])
        if certified_tuning:  # the trial as it will serve, certified, judged on families it did not see
            est = _fit(family, params, cfg, train, np.arange(len(train)), use_w, transfer=True)
            trial.set_user_attr("certified_threshold", est.threshold_)
            rows = train.frame.iloc[est.calibration_rows_]
            excess = family_excess(rows, est.transfer_picks_, train.modes, cfg.target_violation_rate,
                                   est.calibration_["delta"])
            set_constraints(trial, excess)
            own = objective_metrics(rows, est.calibration_picks_, train.modes, cfg.unsafe_penalty,
                                    objective=objective_of(family, cfg))
            trial.set_user_attr("certificate_rows_objective", own["objective"])  # what it was judged on before
            return objective_metrics(rows, est.transfer_picks_, train.modes, cfg.unsafe_penalty,
                                     objective=objective_of(family, cfg))["objective"]
        scores, overhead_ms = [], 0.0
        for step, (tr, va) in enumerate(folds):
            est = _fit(family, params, cfg, train, tr, use_w, certify=False)
            valid = train.frame.iloc[va]
            if cfg.decision_cost and step == 0:
                # the first fold's model as it serves: compiled (distilled where it would be)
                # picks and its measured decision cost, which the later folds' models share
                # (the cost follows the hyperparameters, not the fold; compiling every fold
                # made tuning ten times slower)
                picks, overhead_ms = served_decision(est, valid)
                trial.set_user_attr("decision_p50_us", overhead_ms * 1e3)
            else:
                picks = est.predict(valid)
            scores.append(objective_metrics(valid, picks, train.modes, cfg.unsafe_penalty,
                                            overhead_ms)["objective"])
            trial.report(float(np.mean(scores)), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return float(np.mean(scores))

    states = parallel.finished_states()
    remaining = max(0, cfg.trials - len(study.get_trials(deepcopy=False, states=states)))
    if worker == 0 and remaining:  # the family's defaults first, once per study (first_trial)
        fresh = not study.get_trials(deepcopy=False)
        study.enqueue_trial(default_trial(family), skip_if_exists=True)
        best = _earlier_best(url, earlier) if fresh else None
        if best is not None:  # then the best its earlier space found
            study.enqueue_trial(carried_trial(family, best), skip_if_exists=True)
    procs = []
    if worker == 0 and cfg.workers > 1 and remaining:
        job = {"cfg": cfg, "family": family, "table": table, "train_idx": train_idx, "study_name": study_name}
        procs = parallel.tune_in_workers(cfg.workers, worker_main, job, parent_run_id)
    # several local processes: each keeps to its share of the cores (threads_per_worker)
    limits = threadpool_limits(parallel.threads_per_worker(cfg.workers)) if cfg.workers > 1 else nullcontext()
    try:
        with limits:
            study.optimize(objective, n_trials=remaining,
                           callbacks=[MaxTrialsCallback(cfg.trials, states=states), *callbacks])
    except BaseException:
        parallel.stop_workers(procs)
        raise
    parallel.join_workers(procs)
    return study


def _earlier_best(url: str, names) -> dict | None:
    """The best finished trial's parameters of the first study of ``names`` in the
    storage that has one; None where none has."""
    import optuna  # heavy: only when tuning

    known = {s.study_name for s in optuna.get_all_study_summaries(url, include_best_trial=False)}
    for name in names:
        if name not in known:
            continue
        try:  # feasible first, where its trials were constrained
            return dict(best_trial(optuna.load_study(study_name=name, storage=url), warn=False).params)
        except ValueError:  # no finished trial
            continue
    return None


def worker_main(job: dict, worker: int, parent_run_id: str | None) -> None:
    """One extra tuning process (:func:`modeswitch.routers.training.parallel.tune_in_workers` starts
    it): the same study, objective and stop rule as the main one; its trials nested
    under ``parent_run_id`` in MLflow."""
    cfg = job["cfg"]
    callbacks = []
    if parent_run_id is not None:
        import mlflow  # heavy: only in a worker that logs

        use_tracking_uri(cfg.tracking_uri)
        mlflow.set_tracking_uri(tracking_uri(Path(cfg.mlruns)))
        mlflow.set_experiment(experiment_id=mlflow.MlflowClient().get_run(parent_run_id).info.experiment_id)
        # MLflow's nesting is this tag (the callback passes no parent_run_id on)
        callbacks.append(mlflow_callback(cfg, {"tags": {"mlflow.parentRunId": parent_run_id}}))
    tune(job["family"], cfg, job["table"], job["train_idx"], job["study_name"], callbacks, worker=worker)


def _plots(out: Path, family, y_true, y_pred, est) -> list[Path]:
    import matplotlib  # heavy: only for the plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is heavy

    paths = []
    labels = sorted(set(y_true) | set(y_pred))
    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(labels), 1.0 + 0.6 * len(labels)))
    ConfusionMatrixDisplay.from_predictions(y_true, y_pred, labels=labels, ax=ax,
                                            xticks_rotation="vertical", colorbar=False)
    ax.set_title(f"{family}: oracle label (rows) vs prediction")
    paths.append(out / f"confusion_matrix_{family}.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    try:
        imp = est.feature_importances().head(15)
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(imp) + 1.2))
        imp[::-1].plot.barh(ax=ax)
        ax.set_title(f"{family}: feature importance")
        paths.append(out / f"feature_importance_{family}.png")
        fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    except (AttributeError, ValueError):
        pass
    return paths


def trusted_types(est) -> list[str]:
    """Types in a router's skops serialisation. The object was just trained in this
    process by this code, so its own types are trusted for MLflow's skops format."""
    import skops.io  # heavy: only when logging a model

    return skops.io.get_untrusted_types(data=skops.io.dumps(est))


def _progress_callback(progress, task, family):
    def callback(study, trial):
        try:
            best = f", best {best_trial(study, warn=False).value:.3f}"
        except ValueError:  # every trial so far was pruned
            best = ""
        # a nested fold's study is named after the family it holds out
        fold = study.study_name.partition("-without-")[2].split("-")[0]
        where = f" without {fold}" if fold else ""
        progress.update(task, advance=1, description=f"tuning {family}{where}: trial {trial.number}{best}")

    return callback


@dataclass
class TrainingData:
    """The training table and its outer folds, read once per :func:`train` call.

    ``folds``: the outer (train, test) splits; every row is held out by exactly
    one of them, so cross-fitting predicts each held-out row with a model that
    never saw it. The table's hash names the MLflow experiment and the Optuna
    studies, so reruns on the same table resume them.
    """

    table: TrainingTable
    folds: list

    @property
    def experiment(self) -> str:
        return f"modeswitch-train-{self.table.hash}"


@dataclass
class Tuned:
    """A family's chosen hyperparameters: Optuna's best, or the preset's (then no
    validation objective)."""

    params: dict
    use_weights: bool
    best_value: float | None


@dataclass
class HeldOut:
    """Cross-fitted predictions on the held-out ``rows``; ``model`` is the first
    fold's, the one plotted and logged."""

    model: object
    preds: np.ndarray
    rows: np.ndarray


def train(table: pd.DataFrame | TrainingTable, cfg: TrainConfig, progress=None) -> pd.DataFrame:
    """Tune, fit, score and log every requested router family; one result row each."""
    import mlflow  # heavy: only when training

    cfg.apply_preset()
    data = _training_data(table, cfg)
    use_tracking_uri(cfg.tracking_uri)
    setup(Path(cfg.mlruns), data.experiment)
    task = None
    if progress is not None:
        studies = len(data.folds) if _nested(cfg) else 1
        total = len(cfg.routers) * (0 if cfg.preset else cfg.trials * studies)
        task = progress.add_task("tuning", total=max(total, 1))
    results = []
    for family in cfg.routers:
        on_trial = _progress_callback(progress, task, family) if task is not None else None
        # a failure ends the run FAILED (MLflow's context manager) with the reason as a tag,
        # so no half-written run looks finished to `score` or the UI
        with mlflow.start_run(run_name=f"{family}-{cfg.split}-{cfg.feature_set}") as parent:
            try:
                results.append({"router": family, "split": cfg.split, "feature_set": cfg.feature_set,
                                "run_id": parent.info.run_id,
                                **_train_family(family, cfg, data, on_trial)})
            except BaseException as exc:
                mlflow.set_tag("failure_reason", f"{type(exc).__name__}: {exc}"[:500])
                raise
    return pd.DataFrame(results)


def _training_data(table, cfg: TrainConfig) -> TrainingData:
    table = TrainingTable.of(table, cfg.labels)
    folds = table.folds(cfg.split, cfg.test_size, cfg.seed)
    for tr, te in folds:
        if cfg.split != "random":
            assert not set(table.frame["family"].iloc[tr]) & set(table.frame["family"].iloc[te])
    return TrainingData(table, folds)


def _train_family(family, cfg: TrainConfig, data: TrainingData, on_trial=None) -> dict:
    """One family inside its (open) MLflow parent run: tags, tuning, params, held-out
    metrics next to the rule baseline's, plots, the model. Returns its result columns.
    Tuned per fold (:func:`_nested`), the params logged are the first fold's (its model is
    the one logged) and ``fold_params.json`` holds every fold's, by held-out family."""
    import mlflow  # heavy: only when training

    mlflow.set_tags(_tags(family, cfg, data))
    log_table_input(data.table.frame, "training")
    per_fold = _tune_per_fold(family, cfg, data, on_trial)
    tuned = per_fold[0]
    fixed = cfg.router_params.get(family, {})
    mlflow.log_params({**{f"param_{k}": v for k, v in {**tuned.params, **fixed}.items()},
                       **{f"fixed_{k}": v for k, v in fixed.items()},
                       "regret_weights": tuned.use_weights, "trials": cfg.trials,
                       "safety_threshold": cfg.safety_threshold, "fallback": cfg.fallback,
                       "test_size": cfg.test_size, "seed": cfg.seed,
                       "target_violation_rate": cfg.target_violation_rate,
                       "tuning_objective": objective_of(family, cfg),
                       **({"lofo_tuning": cfg.lofo_tuning} if cfg.split == "lofo" else {})})
    if _nested(cfg):
        log_fold_params(data, per_fold, fixed)
    best = [t.best_value for t in per_fold if t.best_value is not None]
    mean_best = float(np.mean(best)) if best else None  # pooled: every fold's is the one study's
    if mean_best is not None:
        mlflow.log_metric("best_validation_objective", mean_best)
    held = _cross_fit(family, per_fold, cfg, data)
    metrics, rule_metrics = _held_out_metrics(held, cfg, data, objective_of(family, cfg))
    mlflow.log_metrics({f"test_{k}": v for k, v in metrics.items()})
    mlflow.log_metrics({f"rule_test_{k}": v for k, v in rule_metrics.items()})
    _log_artifacts(family, held, data)
    model_uri = _log_model(held.model, data)
    return {
        "model_uri": model_uri, "best_validation_objective": mean_best,
        **{f"test_{k}": v for k, v in metrics.items()},
        **{f"rule_{k}": v for k, v in rule_metrics.items()},
        "n_test": len(held.rows), "params": json.dumps({**tuned.params, **fixed}, default=str),
    }


def _nested(cfg: TrainConfig) -> bool:
    """Whether each leave-one-family-out fold is tuned on its own training families."""
    return cfg.split == "lofo" and cfg.lofo_tuning == "nested" and not cfg.preset


def log_fold_params(data: TrainingData, per_fold: list[Tuned], fixed: dict) -> None:
    """Every fold's parameters as ``fold_params.json`` in the open run, by held-out
    family (what the score step refits each fold with), and each fold's best validation
    objective as ``best_validation_objective.<family>`` (their mean, without the suffix,
    is logged by :func:`_train_family`)."""
    import mlflow  # heavy: only when training

    folds = {}
    for (_, te), t in zip(data.folds, per_fold):
        fam = data.table.held_out_family(te)
        folds[fam] = {"params": {**t.params, **fixed}, "regret_weights": t.use_weights,
                      "best_validation_objective": t.best_value}
        if t.best_value is not None:
            mlflow.log_metric(f"best_validation_objective.{fam}", t.best_value)
    mlflow.log_dict(json.loads(json.dumps(folds, default=str)), FOLD_PARAMS)


def _tags(family, cfg: TrainConfig, data: TrainingData) -> dict:
    """What a run was trained on and how: enough to find it again and to tell
    whether two runs are comparable (same table, constraints and backends)."""
    meta = data.table.meta
    return {
        "router_family": family, "split": cfg.split, "feature_set": cfg.feature_set,
        "git_commit": git_commit(), "profile_hash": meta["profile_hash"],
        "training_table_hash": data.table.hash, "constraints": json.dumps(meta["constraints"]),
        "preset": cfg.preset or "none", "unsafe_penalty": cfg.unsafe_penalty,
        "backends": ",".join(meta.get("backends", [])) or "unknown",
    }


def _tune_per_fold(family, cfg: TrainConfig, data: TrainingData, on_trial=None) -> list[Tuned]:
    """The parameters each outer fold is fitted with. Leaving one family out with
    ``lofo_tuning="nested"``: one study per fold, on that fold's training rows only,
    so the held-out family's outcomes never choose its own parameters (nested
    cross-validation, Varma and Simon, BMC Bioinformatics 7:91, 2006). Why: tuned once
    on every row, each trial's score includes the family later held out (a selection
    effect), and its certificate is cross-fitted over all families, while each fold's
    certificate has one family fewer, with deciders fitted on one fewer again: a
    trial's score then answers another question than the fold's. Otherwise one tuning
    serves every fold."""
    if _nested(cfg):
        return [_tune_or_preset(family, cfg, data, on_trial, tr, data.table.held_out_family(te))
                for tr, te in data.folds]
    return [_tune_or_preset(family, cfg, data, on_trial)] * len(data.folds)


def _tune_or_preset(family, cfg: TrainConfig, data: TrainingData, on_trial=None, train_idx=None,
                    held_out: str | None = None) -> Tuned:
    """A preset fixes the parameters; otherwise Optuna tunes them, one nested MLflow
    run per trial, on ``train_idx`` (default: the outer split's training part; leaving
    one family out, whose folds each train on different rows, every row; its inner
    folds still hold whole families out). ``held_out``: the family a nested fold holds
    out, which names its study."""
    import mlflow  # heavy: only when training

    if cfg.preset:
        return Tuned(dict(PAPER_PRESET["params"].get(family, {})), False, None)
    cbs = [mlflow_callback(cfg, {"nested": True})] + ([on_trial] if on_trial is not None else [])
    stem = f"{data.experiment}-{family}-{cfg.split}-{cfg.feature_set}-s{cfg.seed}"
    if held_out is not None:
        stem += f"-without-{held_out}"
    study_name = stem + _tuning_key(family, cfg)
    version = getattr(get_family(family).factory, "search_space_version", 1)
    # the same study under the family's earlier search spaces, latest first (first_trial)
    earlier = [stem + _tuning_key(family, cfg, v) for v in range(version - 1, 0, -1)]
    if train_idx is None:
        train_idx = data.folds[0][0] if cfg.split != "lofo" else np.arange(len(data.table))
    study = tune(family, cfg, data.table, train_idx, study_name, cbs,
                 parent_run_id=mlflow.active_run().info.run_id, earlier=earlier)
    best = best_trial(study)  # the best feasible, where trials are constrained
    params = dict(best.params)
    use_w = bool(params.pop("regret_weights", False))
    return Tuned(params, use_w, best.value)


def mlflow_callback(cfg: TrainConfig, mlflow_kwargs: dict):
    """optuna-integration's callback: one MLflow run per trial (``mlflow_kwargs``: nested
    under the open run, or tagged with its parent's id from a worker process)."""
    from optuna_integration.mlflow import MLflowCallback  # heavy: only when tuning

    with warnings.catch_warnings():
        # optuna 4.9+ flags the callback for a future move; it is the
        # integration the project is asked to use and still works
        warnings.simplefilter("ignore", FutureWarning)
        return MLflowCallback(tracking_uri=tracking_uri(Path(cfg.mlruns)), metric_name="objective",
                              create_experiment=False, mlflow_kwargs=mlflow_kwargs)


def _cross_fit(family, per_fold: list[Tuned], cfg: TrainConfig, data: TrainingData) -> HeldOut:
    """Refit per outer fold, with that fold's parameters, and predict its test part, so
    every held-out row is scored by a model that did not train on it."""
    preds = np.empty(len(data.table), dtype=object)
    rows = []
    model = None
    for (tr, te), tuned in zip(data.folds, per_fold):
        est = _fit(family, tuned.params, cfg, data.table, tr, tuned.use_weights)
        preds[te] = est.predict(data.table.frame.iloc[te])
        rows.extend(te)
        model = model if model is not None else est
    return HeldOut(model, preds, np.array(sorted(rows)))


def _held_out_metrics(held: HeldOut, cfg: TrainConfig, data: TrainingData,
                      objective: str = "regret") -> tuple[dict, dict]:
    """(router, rule baseline) objective metrics on the same held-out requests, the
    objective the family was tuned on (:func:`objective_of`)."""
    test, modes = data.table.frame.iloc[held.rows], data.table.modes
    metrics = objective_metrics(test, held.preds[held.rows], modes, cfg.unsafe_penalty, objective=objective)
    rule = RuleBaselineRouter(available_modes=modes, unavailable="reference").fit()
    return metrics, objective_metrics(test, rule.predict(test), modes, cfg.unsafe_penalty, objective=objective)


def _log_artifacts(family, held: HeldOut, data: TrainingData):
    """Confusion matrix and feature importance (``plots/``), and the label
    distribution of the whole table."""
    import mlflow  # heavy: only when training

    y = data.table.labels
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for p in _plots(tmp, family, y[held.rows], held.preds[held.rows], held.model):
            mlflow.log_artifact(str(p), artifact_path="plots")
        dist = pd.Series(y).value_counts().rename_axis("label").rename("requests")
        dist.to_csv(tmp / "label_distribution.csv")
        mlflow.log_artifact(str(tmp / "label_distribution.csv"))


def _log_model(est, data: TrainingData) -> str:
    return log_model(est, data.table.features)


def log_model(est, features: pd.DataFrame) -> str:
    """Log the fitted router in the open run with its signature and an input example (the
    first rows of ``features``); returns its URI (also tagged on the run, so the scorer
    can find the model from the run)."""
    import mlflow  # heavy: only when logging a model
    import mlflow.sklearn  # lazy: MLflow is slow to import
    from mlflow.models import infer_signature  # lazy: MLflow is slow to import

    example = features.iloc[:3]
    signature = infer_signature(example, est.predict(example))
    info = mlflow.sklearn.log_model(
        est, name="model", signature=signature, input_example=example,
        pip_requirements=["scikit-learn", "lightgbm", "pandas", "numpy"],
        skops_trusted_types=trusted_types(est),
    )
    mlflow.set_tag("model_uri", info.model_uri)
    return info.model_uri
