"""A stored router is data, never code: exact allow-listed classes only, and trees that are
trees (routers/export.py, routers/compiler/tree_checks.py).

The payloads are the ones a prefix allow-list ("numpy.", "sklearn.") let through: each
test first shows the crafted file really runs its code when skops is told to trust what
it names, then that the project's loader refuses it by name with the code not run."""

import os
import time
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio

from modeswitch.dataset.io import sha256_file
from modeswitch.routers import get_router
from modeswitch.routers.compiler.tree_checks import check_fitted_trees
from modeswitch.routers.export import export_router, load_router, load_router_file
from tests.helpers import CODE_RUNNERS, crafted_skops, synthetic_table

FAMILIES = ["short_prompt_short_output", "batch_pressure", "long_prompt_short_output"]


@pytest.fixture(scope="module")
def table():
    return synthetic_table(FAMILIES, 30)


def _fit(name, table, **params):
    return get_router(name, **params).fit(table, table["label"].astype(str))


def _marker_code(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('ran')"


@pytest.mark.parametrize("function", sorted(CODE_RUNNERS))
def test_a_code_running_payload_is_refused_by_name_and_never_runs(tmp_path, table, function):
    data = sio.dumps(_fit("dt", table))
    marker = tmp_path / "ran"
    path = tmp_path / "router.skops"
    path.write_bytes(crafted_skops(data, function, _marker_code(marker)))
    with pytest.raises(ValueError, match=f"outside the trusted list: {function.replace('.', '[.]')}"):
        load_router_file(path, sha256_file(path))
    assert not marker.exists()
    # listing it by its exact name does not help: it is not a class
    os.environ["MODESWITCH_TRUSTED_TYPES"] = function
    try:
        with pytest.raises(ValueError, match="which is not a class"):
            load_router_file(path, sha256_file(path))
    finally:
        del os.environ["MODESWITCH_TRUSTED_TYPES"]
    assert not marker.exists()
    # the payload is live: skops told to trust what the file names runs it
    with pytest.raises(Exception):  # noqa: B017 - skops fails only after the call
        sio.load(path, trusted=sio.get_untrusted_types(file=path))
    assert marker.read_text() == "ran"


def test_a_payload_in_the_registry_with_matching_hashes_is_refused_through_every_uri(tmp_path, table):
    """The attack as tried: the registry's recorded hashes rewritten to match the crafted
    file, loaded as `serve` loads it (models:/ alias, /latest, the version's folder)."""
    import mlflow

    from modeswitch.routers.training.tracking import tracking_uri

    mlruns = tmp_path / "mlruns"
    info = export_router(_fit("dt", table), mlruns=str(mlruns), source_run_id="r", backend="transformers")
    [stored] = list(mlruns.rglob("router.skops"))
    marker = tmp_path / "ran"
    stored.write_bytes(crafted_skops(stored.read_bytes(), "numpy.testing._private.utils.runstring",
                                     _marker_code(marker)))
    [meta] = list(mlruns.rglob("artifacts/meta.json"))
    meta.write_text(meta.read_text().replace(info["meta"]["sha256"], sha256_file(stored)))
    mlflow.set_tracking_uri(tracking_uri(mlruns))
    client = mlflow.MlflowClient()
    client.set_model_version_tag(info["name"], info["version"], "router_sha256", sha256_file(stored))
    client.set_model_version_tag(info["name"], info["version"], "meta_sha256", sha256_file(meta))
    for uri in (info["uri"], f"models:/{info['name']}/latest", str(meta.parent.parent)):
        with pytest.raises(ValueError, match="numpy.testing._private.utils.runstring"):
            load_router(uri, str(mlruns))
    assert not marker.exists()


def test_a_type_the_export_did_not_record_is_refused(tmp_path, table):
    path = tmp_path / "router.skops"
    sio.dump(_fit("lgbm", table, n_estimators=5), path)
    with pytest.raises(ValueError, match="did not record"):
        load_router_file(path, sha256_file(path), recorded_types=["modeswitch.routers.families.lgbm.LightGBMRouter"])


def _cyclic_tree_router(table):
    est = _fit("dt", table)
    tr = est.pipeline_.named_steps["clf"].tree_
    internal = np.flatnonzero(tr.children_left >= 0)
    assert len(internal) >= 2
    tr.children_left[internal[-1]] = 0  # the deepest split points back to the root
    assert tr.children_left[internal[-1]] == 0  # the arrays are views of the tree's nodes
    return est


def test_a_cyclic_tree_is_refused_on_load_and_by_the_compiler_within_a_second(tmp_path, table):
    from modeswitch.routers.compiler import compile

    est = _cyclic_tree_router(table)
    path = tmp_path / "router.skops"
    sio.dump(est, path)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="outside 1..|child of two splits"):
        load_router_file(path, sha256_file(path))
    with pytest.raises(ValueError, match="outside 1..|child of two splits"):
        compile(est)
    assert time.perf_counter() - t0 < 1.0


def test_a_cycle_below_the_root_and_bad_splits_are_refused():
    from modeswitch.routers.compiler.tree_checks import check_tree_arrays

    ok = dict(feature=[0, 1, -2, -2, -2], threshold=[0.5, 1.5, -2, -2, -2],
              left=[1, 3, -1, -1, -1], right=[2, 4, -1, -1, -1])
    check_tree_arrays(**ok, n_features=2, where="t")
    cases = {"child of two splits": dict(ok, left=[1, 1, -1, -1, -1]),  # 1 -> 1: a self loop
             "outside 1..": dict(ok, right=[2, 9, -1, -1, -1]),
             "one child only": dict(ok, right=[2, -1, -1, -1, -1]),
             "feature outside": dict(ok, feature=[0, 7, -2, -2, -2]),
             "not finite": dict(ok, threshold=[0.5, np.nan, -2, -2, -2])}
    for says, arrays in cases.items():
        with pytest.raises(ValueError, match=says):
            check_tree_arrays(**arrays, n_features=2, where="t")


def test_a_cyclic_lightgbm_booster_is_refused_before_anything_walks_it(table):
    import lightgbm

    est = _fit("lgbm", table, n_estimators=5)
    booster = est.pipeline_.named_steps["clf"].booster_
    assert check_fitted_trees(est) >= 1
    lines = booster.model_to_string().split("\n")
    # the first split node (past the root) whose left child is leaf 0 ("-1") points back to
    # the root instead ("00": same length, as the header holds the tree sizes)
    for i, line in enumerate(lines):
        kids = line.partition("left_child=")[2].split() if line.startswith("left_child=") else []
        j = next((k for k in range(1, len(kids)) if kids[k] == "-1"), None)
        if j is not None:
            kids[j] = "00"
            lines[i] = "left_child=" + " ".join(kids)
            break
    else:
        pytest.fail("no tree with a leaf-0 left child past the root to rewire")
    bad = lightgbm.Booster(model_str="\n".join(lines))
    est.pipeline_.named_steps["clf"]._Booster = bad
    with pytest.raises(ValueError, match="child of two splits|outside"):
        check_fitted_trees(est)


@pytest.mark.parametrize("name", ["rule", "dt", "rf", "lr", "lgbm", "cost_linear", "cost_lgbm"])
def test_every_family_round_trips_through_the_exact_allow_list(tmp_path, table, name):
    params = {"n_estimators": 5} if name in ("rf", "lgbm") else {}
    est = _fit(name, table, **params)
    path = tmp_path / "router.skops"
    sio.dump(est, path)
    back = load_router_file(path, sha256_file(path), recorded_types=sio.get_untrusted_types(file=path))
    X = table.drop(columns=["label"]).head(20)
    assert list(back.predict(X)) == list(est.predict(X))
    if name in ("dt", "rf", "lgbm", "cost_lgbm"):
        assert check_fitted_trees(back) >= 1


def test_a_torn_or_garbage_skops_file_is_one_clear_error(tmp_path, table):
    path = tmp_path / "router.skops"
    sio.dump(_fit("dt", table), path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="not a readable skops file"):
        load_router_file(path, sha256_file(path))
