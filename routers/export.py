"""Export a trained router to the MLflow registry as a ``pyfunc`` model, and load it back.

The package wraps everything a serving decision needs: feature extraction from
raw request fields, the predictor (compiled on load unless ``compiled=False``),
the safety guard and its fallback. Its metadata records the modes it can choose
and the backend its training profiles came from, so a server lacking one of those
modes refuses it with a clear message instead of failing on the first request.

    modeswitch export --run RUN_ID            # a training run's router
    modeswitch export --best latency_capture  # best router of the latest scoring run

Both register a new version under ``--name`` (default ``modeswitch-router``) and
point the alias ``champion`` at it.

Safe loading. The router is stored with skops (``router.skops``), a format that
rebuilds objects of listed types instead of running pickle's arbitrary code. skops
trusts its own curated types (primitives, numpy arrays and dtypes, scikit-learn's
estimators); every other type the file names must be one of :func:`allowed_types`,
an explicit list of exact class names: the registered router families' classes
(plug-ins included), the estimator internals in :data:`ESTIMATOR_TYPES`, and the exact
names in ``$MODESWITCH_TRUSTED_TYPES``. A name is never matched by prefix, and each must
resolve to a class: skops *calls* whatever a reduce node names, so a function such as
``numpy.testing._private.utils.runstring`` in a file would run code with arguments
from the file. Export records the exact list (``meta.json``'s ``trusted_types``); the
loader refuses a file that names anything else, naming it, before skops builds a
single object. Then every fitted tree is checked (:mod:`modeswitch.routers.compiler.tree_checks`:
no cycle, children and features in range, thresholds finite) before anything walks it.

The SHA-256 of ``router.skops`` and of ``meta.json`` are recorded in the registry
(tags on the model version), written in the same transaction that creates the
version, so no version is visible without them; a registered version without them
(an export killed mid-way by an older release) is refused. That is an integrity check, not authentication: the
tags live in the same store as the artifacts, so they catch a changed or torn
artifact, not someone who can write the whole store (for ``runs:/`` URIs and folders
the hash is only checked against ``meta.json`` beside the file). :func:`load_router`,
which ``serve``, ``/admin/reload`` and the pyfunc's ``load_context`` use, never
unpickles, and refuses an older joblib export unless ``trust_pickle=True``
(``serve --trust-pickle``). MLflow's own ``mlflow.pyfunc.load_model`` still unpickles
the pyfunc wrapper (``python_model.pkl``): use it (or ``mlflow models serve``) only on
stores you trust.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import tempfile
import warnings
from pathlib import Path

import mlflow
import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.models import infer_signature

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import features_frame, reads_content
from modeswitch.dataset.io import sha256_file
from modeswitch.dataset.requests import Request
from modeswitch.routers.compiler.tree_checks import check_fitted_trees
from modeswitch.routers.registry import ROUTERS
from modeswitch.routers.scoring.overhead import decision_function
from modeswitch.routers.training.tracking import git_commit, setup, tracking_uri

DEFAULT_NAME = "modeswitch-router"
ALIAS = "champion"
#: raw request fields the exported model takes (its signature)
INPUT_COLUMNS = ("prompt_tokens", "expected_output_tokens", "shared_prefix_tokens",
                 "concurrent_requests", "memory_pressure", "family", "benchmark_suite")
#: classes inside the project's routers that skops does not trust by itself (exact names);
#: the routers' own classes come from the registry, more from $MODESWITCH_TRUSTED_TYPES
ESTIMATOR_TYPES = ("modeswitch.routers.families.cost._Constant", "modeswitch.routers.families.cost._RatioRisk",
                   "modeswitch.routers.families.cost._CalibratedRisk",
                   "modeswitch.routers.certified.CertifiedRouter",
                   "modeswitch.routers.adaptive.AdaptiveThresholdRouter", "modeswitch.routers.adaptive.ThresholdTracker",
                   "sklearn.frozen._frozen.FrozenEstimator",
                   "modeswitch.routers.risk_control.Calibration", "sklearn.tree._tree.Tree", "lightgbm.basic.Booster",
                   "lightgbm.sklearn.LGBMClassifier", "lightgbm.sklearn.LGBMRegressor", "collections.OrderedDict")
TRUSTED_TYPES_ENV = "MODESWITCH_TRUSTED_TYPES"
LOWER_IS_BETTER = ("overhead_p50_us", "overhead_p99_us", "energy_ratio", "memory_ratio",
                   "mean_regret", "fallback_rate")


class RouterPyfunc(mlflow.pyfunc.PythonModel):
    """The exported router. ``route(request)`` is the serving path (the router's compiled
    form when it has one), ``modes_`` what it can answer, ``path_`` which decision path
    it takes; ``predict`` takes a frame of raw request fields (MLflow's pyfunc
    interface, whose signature differs from the estimators' ``predict(X)``)."""

    def load_context(self, context):
        self.meta_ = read_meta(Path(context.artifacts["meta"]))
        self.router_ = load_router_file(Path(context.artifacts["router"]), self.meta_.get("sha256"),
                                        trust_pickle=os.environ.get("MODESWITCH_TRUST_PICKLE") == "1",
                                        recorded_types=self.meta_.get("trusted_types"))
        self.use_compiled(True)

    def use_compiled(self, on: bool = True):
        """Route through the compiled predictor (default) or the scikit-learn pipeline
        (also when the router cannot be compiled, e.g. one with a safety guard)."""
        self.route, path, _ = decision_function(self.router_, on)
        self.path_ = "compiled" if path.startswith("compiled") else "pipeline"
        if callable(getattr(self.router_, "observe", None)):  # a router that adapts online takes feedback here
            self.observe, self.state = self.router_.observe, self.router_.state
        return self

    @property
    def modes_(self) -> list[str]:
        return list(self.meta_["modes"])


    def explain(self, X) -> list[tuple[str, str]]:
        return self.router_.explain(X)

    def predict(self, context, model_input, params=None):  # noqa: D102 - pyfunc interface
        frame = pd.DataFrame(model_input)
        reqs = [Request(id=str(i), prompt_tokens=int(r.prompt_tokens),
                        expected_output_tokens=int(r.expected_output_tokens),
                        shared_prefix_tokens=int(getattr(r, "shared_prefix_tokens", 0) or 0),
                        concurrent_requests=int(getattr(r, "concurrent_requests", 1) or 1),
                        memory_pressure=float(getattr(r, "memory_pressure", 0.0) or 0.0),
                        family=_cat(getattr(r, "family", None)),
                        benchmark_suite=_cat(getattr(r, "benchmark_suite", None)),
                        prompt_token_ids=_token_ids(getattr(r, "prompt_token_ids", None)))
                for i, r in enumerate(frame.itertuples(index=False))]
        # feature set B's frame carries set A's columns too: every router reads its own
        fs = _inner(self.router_).get_params().get("feature_set") or "A"
        if reads_content(fs):  # and a router reading the prompt, the content columns of set C as well
            return list(self.router_.predict(features_frame(reqs, fs, content=_inner(self.router_).content_table())))
        return list(self.router_.predict(features_frame(reqs, "B")))


def _token_ids(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else tuple(int(t) for t in v)


def _inner(router):
    """The router whose features a wrapper (a certified router) decides on: its fitted
    inner router, else the one it was given, else the router itself."""
    return getattr(router, "router_", getattr(router, "router", router))


def content_check(router) -> str | None:
    """A router reading the prompt: its content table, built or read from the cache now
    (an error naming the checkpoint when it cannot be: a server must not fall back to
    the reference on every request); its table's hash. None for other routers."""
    inner = _inner(router)
    if not reads_content(inner.get_params().get("feature_set") or "A"):
        return None
    return hashlib.sha256(inner.content_table().rows.tobytes()).hexdigest()[:16]


def allowed_types() -> frozenset[str]:
    """The allow-list, exact fully qualified class names: every registered router family's
    class (built-in and plug-in), :data:`ESTIMATOR_TYPES`, and the comma-separated names in
    ``$MODESWITCH_TRUSTED_TYPES`` (e.g. a plug-in router's helper class)."""
    families = {f"{f.factory.__module__}.{f.factory.__qualname__}" for _, f in ROUTERS.items()
                if isinstance(f.factory, type)}
    extra = {t.strip() for t in os.environ.get(TRUSTED_TYPES_ENV, "").split(",") if t.strip()}
    return frozenset(families | set(ESTIMATOR_TYPES) | extra)


def _is_class(name: str) -> bool:
    """Whether an allow-listed ``module.QualName`` names a class (importing only modules the
    allow-list itself names, never one a file names)."""
    module, _, qual = name.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
            break
        except ImportError:  # a nested class: module.Outer.Inner
            module, _, outer = module.rpartition(".")
            qual = f"{outer}.{qual}"
    else:
        return False
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return isinstance(obj, type)


def _vetted_types(types, where: str = "the router") -> list[str]:
    """The types skops would not load by itself, each an allow-listed class, or a refusal
    naming every one that is not."""
    allowed = allowed_types()
    outside = sorted(t for t in types if t not in allowed)
    if outside:
        raise InputError(f"{where} holds types outside the trusted list: {', '.join(outside)}; a stored "
                         "router may hold only its own classes and their estimators' (exact names; add a "
                         f"plug-in's own class with ${TRUSTED_TYPES_ENV})")
    not_classes = sorted(t for t in types if not _is_class(t))
    if not_classes:
        raise InputError(f"{where} names {', '.join(not_classes)}, which is not a class; refusing to "
                         "load it (only classes are allowed)")
    return sorted(types)



def load_router_file(path: Path, expected_sha256: str | None, trust_pickle: bool = False,
                     recorded_types=None):
    """A stored router: a skops file whose hash matches, whose types are all allow-listed
    classes (and, with ``recorded_types``, all among those recorded at export) and whose
    trees are trees; a pickle (joblib) file only with ``trust_pickle``."""
    path = Path(path)
    if expected_sha256 is not None or path.suffix == ".skops":
        got = sha256_file(path)
        if got != expected_sha256:
            raise InputError(f"{path}: its SHA-256 {got[:16]}... does not match the one recorded at export "
                             f"({(expected_sha256 or 'none')[:16]}...): the file was changed; refusing to load it")
    if path.suffix == ".skops":
        import skops.io as sio  # lazy: skops pulls scikit-learn

        try:
            named = sio.get_untrusted_types(file=path)
        except Exception as exc:  # noqa: BLE001 - a torn or foreign file: skops raises many kinds
            raise InputError(f"{path}: not a readable skops file ({type(exc).__name__}: {exc})") from None
        trusted = _vetted_types(named, str(path))
        if recorded_types is not None and set(named) - set(recorded_types):
            raise InputError(f"{path} names {', '.join(sorted(set(named) - set(recorded_types)))}, which "
                             "the export did not record (meta.json's trusted_types); refusing to load it")
        router = sio.load(path, trusted=trusted)
        check_fitted_trees(router)
        return router
    if not trust_pickle:
        raise InputError(f"{path}: a pickle file (an export made before skops): loading it runs whatever code "
                         "it holds; re-export the router, or pass --trust-pickle if you trust this store")
    import joblib  # lazy: joblib comes with scikit-learn

    return joblib.load(path)


def _cat(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) or v in ("", "none") else str(v)


def export_router(router, *, name: str = DEFAULT_NAME, mlruns: str = "mlruns", source_run_id=None,
                  backend: str = "unknown", extra: dict | None = None) -> dict:
    """Log ``router`` as a pyfunc model, register a new version and alias it ``champion``."""
    setup(Path(mlruns), "modeswitch-export")
    meta = {"modes": list(router.modes_), "backend": backend,
            "router": type(router).__name__, "feature_set": _inner(router).get_params().get("feature_set"),
            "source_run_id": source_run_id, "git_commit": git_commit(), **(extra or {})}
    # numbers as doubles: integer token counts convert to them safely, not the reverse
    example = pd.DataFrame([{"prompt_tokens": 512.0, "expected_output_tokens": 64.0,
                             "shared_prefix_tokens": 0.0, "concurrent_requests": 1.0,
                             "memory_pressure": 0.0, "family": "none", "benchmark_suite": "none"}])
    if reads_content(meta["feature_set"] or "A"):  # a router reading the prompt takes its token ids too
        example["prompt_token_ids"] = [[1, 2, 3]]
        meta["content_model"] = _inner(router).get_params().get("content_model")
        meta["content_table_sha256"] = content_check(router)
    import skops.io as sio  # lazy: skops pulls scikit-learn

    with tempfile.TemporaryDirectory() as tmp:
        rpath, mpath = Path(tmp) / "router.skops", Path(tmp) / "meta.json"
        sio.dump(router, rpath)
        meta["format"] = "skops"
        meta["trusted_types"] = _vetted_types(sio.get_untrusted_types(file=rpath))
        meta["sha256"] = sha256_file(rpath)
        mpath.write_text(json.dumps(meta, indent=1))
        meta_sha = sha256_file(mpath)
        wrapper = RouterPyfunc()
        wrapper.router_, wrapper.meta_ = router, meta
        signature = infer_signature(example, [str(wrapper.predict(None, example)[0])])
        with mlflow.start_run(run_name=f"export-{name}") as run, warnings.catch_warnings():
            # MLflow suggests type hints on predict; the explicit signature covers it
            warnings.filterwarnings("ignore", message=".*type hints to the `predict` method.*")
            mlflow.set_tags({"source_run_id": str(source_run_id), "backend": backend,
                             "modes": ",".join(meta["modes"])})
            info = mlflow.pyfunc.log_model(
                name="router", python_model=RouterPyfunc(),
                artifacts={"router": str(rpath), "meta": str(mpath)},
                signature=signature, input_example=example, metadata=meta,
                pip_requirements=["scikit-learn", "lightgbm", "pandas", "numpy", "skops"])
    # the registry's own record of the files' hashes (a changed artifact no longer matches),
    # written with the version in one transaction: no version is ever visible (/latest, /N)
    # without them, however the export is interrupted; the alias moves only after that
    mv = mlflow.register_model(info.model_uri, name, tags={"router_sha256": meta["sha256"],
                                                           "meta_sha256": meta_sha})
    version = mv.version
    mlflow.MlflowClient().set_registered_model_alias(name, ALIAS, version)
    return {"name": name, "version": version, "uri": f"models:/{name}@{ALIAS}",
            "model_uri": info.model_uri, "run_id": run.info.run_id, "meta": meta}


_URI_FORMS = ("models:/NAME@ALIAS, models:/NAME/VERSION, runs:/RUN_ID/PATH or a local model folder")


def check_router_uri(uri: str) -> None:
    """Refuse a malformed router URI before MLflow turns it into an internal error."""
    if re.fullmatch(r"models:/[^/@\s]+(@[\w.-]+|/\d+|/latest)", uri) or re.fullmatch(r"runs:/[0-9a-fA-F]+/\S+", uri):
        return
    if "://" not in uri and ":" not in uri.split("/", 1)[0] and Path(uri).is_dir():
        return
    raise InputError(f"router {uri!r}: not a model URI this can load; use {_URI_FORMS}")


def _registry_sha256(uri: str) -> dict:
    """The hashes the registry recorded for a ``models:/`` URI's version: {"router_sha256",
    "meta_sha256"} (empty for other URIs); a version without both is refused."""
    if not uri.startswith("models:/"):
        return {}
    name, _, ref = uri[len("models:/"):].partition("@")
    client = mlflow.MlflowClient()
    if ref:
        mv = client.get_model_version_by_alias(name, ref)
    else:
        name, _, version = name.partition("/")
        if version == "latest":
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise InputError(f"router {uri}: no registered model {name!r}")
            version = str(max(int(v.version) for v in versions))
        mv = client.get_model_version(name, version)
    recorded = {k: mv.tags[k] for k in ("router_sha256", "meta_sha256") if k in mv.tags}
    if len(recorded) < 2:
        raise InputError(f"router {uri}: version {mv.version} of {mv.name!r} has no recorded hashes (an export "
                         "interrupted before it finished, or one made before exports were hashed); export "
                         "the router again")
    return recorded


def read_meta(path: Path, uri: str | None = None) -> dict:
    """A stored router's ``meta.json``, or an error naming it when it is not a JSON object."""
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeError) as exc:
        raise InputError(f"{uri or path}: {path.name} is not valid JSON ({exc}); the artifacts were changed "
                         "or torn: export the router again") from None
    if not isinstance(meta, dict):
        raise InputError(f"{uri or path}: {path.name} holds a {type(meta).__name__}, not a router's metadata")
    return meta


def load_router(uri: str, mlruns: str = "mlruns", available_modes=None, compiled: bool = True,
                trust_pickle: bool = False):
    """Load an exported router (``models:/NAME@champion`` or any model URI) without
    unpickling anything: see "Safe loading" above; ``trust_pickle`` also accepts an
    older joblib export.

    With ``available_modes`` (the serving engine's), a router that can choose a
    mode the engine lacks is refused with the list of missing modes.
    """
    check_router_uri(uri)
    mlflow.set_tracking_uri(tracking_uri(Path(mlruns)))
    try:
        recorded = _registry_sha256(uri)
        local = Path(uri) if Path(uri).is_dir() else Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise InputError(f"router {uri}: {exc.message} (in the store {tracking_uri(Path(mlruns))})") from None
        raise
    meta_path = local / "artifacts" / "meta.json"
    if not meta_path.exists():
        raise InputError(f"{uri} is not a router exported by `modeswitch export` (no artifacts/meta.json)")
    if "meta_sha256" in recorded and sha256_file(meta_path) != recorded["meta_sha256"]:
        raise InputError(f"{uri}: meta.json differs from the one recorded at export: the artifacts were changed")
    meta = read_meta(meta_path, uri)
    name = {"skops": "router.skops"}.get(meta.get("format"), "router.joblib")
    if not (local / "artifacts" / name).exists():
        raise InputError(f"{uri}: artifacts/{name} (the format meta.json names) is missing")
    model = RouterPyfunc()
    model.meta_ = meta
    model.router_ = load_router_file(local / "artifacts" / name, recorded.get("router_sha256", meta.get("sha256")),
                                     trust_pickle=trust_pickle, recorded_types=meta.get("trusted_types"))
    # the modes it can answer: from the router itself, not from a file beside it
    model.meta_["modes"] = list(model.router_.modes_)
    table = content_check(model.router_)  # before compiling: a missing table is an error, not a fallback
    if table is not None and meta.get("content_table_sha256") not in (None, table):
        raise InputError(f"{uri}: the content table of {meta.get('content_model')} differs from the one the router "
                         "was exported with (another checkpoint or tokenizer at that path)")
    model.use_compiled(compiled)
    if available_modes is not None:
        check_available_modes(model, uri, available_modes)
    return model


def check_available_modes(model: RouterPyfunc, uri: str, available_modes) -> None:
    """Refuse a loaded router that can choose a mode the serving engine lacks, listing them."""
    missing = sorted(set(model.modes_) - set(available_modes))
    if missing:
        raise InputError(
            f"router {uri} was trained for backend {model.meta_.get('backend')!r} and can choose "
            f"{', '.join(missing)}, which this engine does not offer (it offers "
            f"{', '.join(sorted(available_modes))}); export a router trained on this engine's profiles")


def best_from_scoring(metric: str, mlruns: str = "mlruns", max_violation_rate: float | None = None):
    """(router name, training run id, value) of the best learned router in the latest scoring run."""
    setup(Path(mlruns), "modeswitch-score")
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name("modeswitch-score")
    runs = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=200)
    runs = [r for r in runs if "mlflow.parentRunId" not in r.data.tags][:1]  # not a per-router child
    if not runs:
        raise InputError(f"no scoring run in {mlruns}; run `modeswitch score` first or use --run")
    run = runs[0]
    cands = {k.split(".", 1)[1]: v for k, v in run.data.tags.items() if k.startswith("router_run.")}
    # each router's figures: its child run's metrics (older scoring runs: the parent's
    # metrics prefixed by router name)
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    figures = {c.data.tags.get("router"): c.data.metrics for c in children}
    for name in cands:
        if name not in figures:
            figures[name] = {k.split(".", 1)[1]: v for k, v in run.data.metrics.items()
                             if k.startswith(f"{name}.")}
    scored = {}
    for name in cands:
        got = figures[name]
        if metric not in got or got[metric] != got[metric]:  # absent or NaN
            raise InputError(f"scoring run {run.info.run_id} has no metric {metric!r} for {name}; "
                             f"known: {sorted(k for k, v in got.items() if v == v)}")
        if max_violation_rate is not None:
            rates = [got.get(f"violation_rate_{k}", 0.0) for k in ("quality", "energy", "memory", "unmeasured")]
            viol = sum(r for r in rates if r is not None and r == r)  # NaN: the figure does not apply
            if viol > max_violation_rate:
                continue
        scored[name] = got[metric]
    if not scored:
        raise InputError("no learned router in the latest scoring run passes the violation limit")
    lower = metric in LOWER_IS_BETTER or metric.startswith("violation")
    best = min(scored, key=scored.get) if lower else max(scored, key=scored.get)
    return best, cands[best], scored[best], run.info.run_id
