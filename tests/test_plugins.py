"""Adding a router family or a backend is one file, with no other edit.

Each test writes one module into a temporary package, loads it through
``$MODESWITCH_PLUGINS`` (as the CLI would) and runs the pipeline's steps on it through the
same functions the CLI calls. The plug-ins are removed from the registries after.
"""

import sys
import textwrap
from contextlib import contextmanager

import pytest

from modeswitch.dataset.registry import PLUGINS_ENV, import_plugins
from tests.helpers import http, start, synthetic_profile

ROUTER_PLUGIN = '''
"""Extremely randomised trees: a router family from outside the project."""
from sklearn.ensemble import ExtraTreesClassifier

from modeswitch.routers.families.classifier import ModeClassifier
from modeswitch.routers.families.readers import sklearn_trees
from modeswitch.routers.registry import RouterFamily, register_router


class ExtraTreesRouter(ModeClassifier):
    def __init__(self, *, n_estimators=20, max_depth=6, **shared):  # the shared ones: the base's
        super().__init__(**shared)
        self.n_estimators = n_estimators
        self.max_depth = max_depth

    def _make_estimator(self):
        return ExtraTreesClassifier(n_estimators=self.n_estimators, max_depth=self.max_depth,
                                    class_weight=self.class_weight, random_state=self.random_state)

    @classmethod
    def _search_space(cls, trial):
        return dict(n_estimators=trial.suggest_int("n_estimators", 5, 30, step=5),
                    max_depth=trial.suggest_int("max_depth", 2, 8))

    def _estimator_state(self, clf):  # its trees as plain data: the compiler needs no edit
        return sklearn_trees(clf.estimators_, len(self.classes_))


register_router(RouterFamily("plugin_et", ExtraTreesRouter, "extra trees (a plug-in)"))
'''

BACKEND_PLUGIN = '''
"""A backend from outside the project: transformers, offering two modes only."""
from modeswitch.engine.backends.base import BackendCapabilities
from modeswitch.engine.backends.registry import Backend, register_backend
from modeswitch.engine.backends.transformers_backend import TransformersEngine, capabilities

MODES = ("fp16_baseline", "int8_quant")


def lite_capabilities(settings):
    full = capabilities(settings.device)
    return BackendCapabilities("plugin_lite", full.reference_mode, full.reference_precision,
                               {m: full.support(m) for m in MODES})


class LiteEngine(TransformersEngine):
    backend = "plugin_lite"


register_backend(Backend("plugin_lite", "transformers with two modes (a plug-in)",
                         capabilities=lite_capabilities,
                         engine=lambda mode, s: LiteEngine(mode, s.model_path, s.draft_path, s.device,
                                                           threads=s.threads)))
'''


@contextmanager
def _plugin(tmp_path, monkeypatch, package, module, source, registry, entry):
    """Write ``package/module.py``, load it the way the CLI does (``$MODESWITCH_PLUGINS``),
    and remove ``entry`` from ``registry`` afterwards."""
    pkg = tmp_path / package
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / f"{module}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLUGINS_ENV, f"{package}.{module}")
    import_plugins()
    try:
        yield sys.modules[f"{package}.{module}"]
    finally:
        registry.unregister(entry)
        for name in (f"{package}.{module}", package):
            sys.modules.pop(name, None)


@pytest.fixture
def router_plugin(tmp_path, monkeypatch):
    from modeswitch.routers.registry import ROUTERS

    with _plugin(tmp_path, monkeypatch, "myrouters", "extra_trees", ROUTER_PLUGIN, ROUTERS, "plugin_et") as mod:
        yield mod


@pytest.fixture
def backend_plugin(tmp_path, monkeypatch):
    from modeswitch.engine.backends.registry import BACKENDS

    with _plugin(tmp_path, monkeypatch, "mybackends", "lite", BACKEND_PLUGIN, BACKENDS, "plugin_lite") as mod:
        yield mod


@pytest.mark.slow  # the whole pipeline for one plugin (make test-slow)
def test_a_router_family_in_one_file_trains_scores_exports_and_serves(router_plugin, tmp_path,
                                                                        tiny_models):
    import mlflow

    from modeswitch.dataset.features import features_frame
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.engine.serving import ServerConfig, create_app
    from modeswitch.oracle.training_table import build_training_table
    from modeswitch.routers import learned_families, list_routers
    from modeswitch.routers.export import export_router, load_router
    from modeswitch.routers.scoring.run import ScoreConfig, score_routers
    from modeswitch.routers.training.trainer import TrainConfig, train

    assert "plugin_et" in list_routers() and "plugin_et" in learned_families()
    reqs = [r for i, n in enumerate(["short_prompt_short_output", "long_prompt_long_output",
                                     "shared_prefix_chat", "batch_pressure"])
            for r in get_workload(n).sample(30, seed=i)]
    table = build_training_table(synthetic_profile(), reqs)
    mlruns = str(tmp_path / "mlruns")

    # train: tuned with its own search space, tracked in MLflow
    res = train(table, TrainConfig(routers=["plugin_et"], trials=2, split="random", mlruns=mlruns))
    run_id = res["run_id"].item()
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.tags["router_family"] == "plugin_et"
    assert {"param_n_estimators", "param_max_depth"} <= set(run.data.params)

    # score: beside the rule baseline, the reference and the oracle
    out = score_routers(table, ScoreConfig(mlruns=mlruns, decisions=100, pipeline_decisions=50), tmp_path / "report")
    head = out["headline"]
    assert {"plugin_et", "rule", "reference", "oracle"} <= set(head.index)
    assert 0.0 <= head.loc["plugin_et", "oracle_match"] <= 1.0
    assert out["overhead"]["plugin_et"].path == "compiled"  # its trees, described, compile as they are

    # export and load back: the same decisions
    est = mlflow.sklearn.load_model(run.data.tags["model_uri"])
    info = export_router(est, mlruns=mlruns, source_run_id=run_id, backend="transformers")
    loaded = load_router(info["uri"], mlruns)
    assert loaded.path_ == "compiled"
    assert [loaded.route(r) for r in reqs[:20]] == list(est.predict(features_frame(reqs[:20], "B")))
    held = [r for n in ("short_prompt_long_output", "long_prompt_short_output")
            for r in get_workload(n).sample(40, seed=99)]
    assert [est.compile().route(r) for r in held] == list(est.predict(features_frame(held, "A")))

    # serve: the server routes with it and runs the chosen mode's engine
    # the budget is not under test here (a busy test machine): give the decision time
    cfg = ServerConfig(model_path=str(tiny_models.target), draft_path=str(tiny_models.draft),
                       route_budget_us=1e6)
    srv, th, port = start(create_app(lambda: loaded, cfg))
    try:
        prompt = " ".join(["word"] * 40)
        status, headers, text = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                                     {"prompt": prompt, "max_tokens": 4})
        assert status == 200, text
        assert headers["x-modeswitch-mode"] in est.modes_  # the plug-in's pick, not a fallback
        assert '"fallback": null' in text.replace('"fallback":null', '"fallback": null')
    finally:
        srv.should_exit = True
        th.join(timeout=30)


def test_a_plugin_family_passes_the_scikit_learn_checks_and_compiles_as_it_predicts(router_plugin):
    """Every registered family, plug-ins included, is a scikit-learn estimator; a plug-in
    of trees compiles from its description alone (no compiler edit)."""
    from modeswitch.dataset.features import features_frame
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle.training_table import build_training_table
    from modeswitch.routers import api, learned_families
    from tests.test_routers_learned import family_estimator_checks

    assert "plugin_et" in learned_families()
    family_estimator_checks("plugin_et", {"check_class_weight_classifiers": (
        "20 extra trees of depth 6 underfit the check's synthetic data")})
    reqs = [r for i, n in enumerate(["short_prompt_short_output", "long_prompt_long_output", "batch_pressure"])
            for r in get_workload(n).sample(40, seed=i)]
    est = api.fit("plugin_et", build_training_table(synthetic_profile(), reqs), feature_set="B")
    held = [r for n in ("shared_prefix_chat", "long_prompt_short_output") for r in get_workload(n).sample(40, seed=7)]
    fast = est.compile()
    assert fast is not None and fast.region_nodes_ > 0
    assert [fast.route(r) for r in held] == list(est.predict(features_frame(held, "B")))


@pytest.mark.slow
def test_a_backend_in_one_file_is_profiled_and_live_scored(backend_plugin, tmp_path, tiny_models):
    from modeswitch.dataset.requests import Request
    from modeswitch.engine.backends.registry import backend_names
    from modeswitch.engine.profiler import Profiler, ProfileSpec
    from modeswitch.routers.scoring.live import run_live

    assert "plugin_lite" in backend_names()
    spec = ProfileSpec(model=str(tiny_models.target), backend="plugin_lite",
                       workloads=["short_prompt_short_output", "long_prompt_short_output"], requests=1)
    prof = Profiler(spec, tiny_models.target, None, tmp_path / "p.parquet").run()
    assert set(prof["mode"]) == {"fp16_baseline", "int8_quant"}  # what the plug-in offers
    assert set(prof["backend"]) == {"plugin_lite"}
    assert (prof["latency_ms"] > 0).all()

    stream = [Request(id="a", prompt_tokens=40, expected_output_tokens=4, family="short_prompt_short_output"),
              Request(id="b", prompt_tokens=200, expected_output_tokens=4, family="long_prompt_short_output")]
    runs = run_live(stream, {"r": ["int8_quant", "fp16_baseline"]}, tiny_models.target,
                    backend="plugin_lite")
    assert set(zip(runs["request_id"], runs["mode"])) == {("a", "fp16_baseline"), ("a", "int8_quant"),
                                                          ("b", "fp16_baseline")}
    assert (runs["latency_ms"] > 0).all()
    with pytest.raises(ValueError, match="cannot run"):
        run_live(stream, {"r": ["prefix_caching", "fp16_baseline"]}, tiny_models.target,
                 backend="plugin_lite")
