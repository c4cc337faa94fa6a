"""The per-mode cost model: recovers known coefficients, validates on grouped folds,
round-trips through its file, and feeds the oracle only where it validated better."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from modeswitch.oracle.costmodel import CostModel, design, fit_structural, grouped_folds, validate
from tests.helpers import PROV, profile, request_shapes

REF = "fp16_baseline"
#: latency terms: constant, prefill, prefill^2, decode per token, decode x context
TRUE = {REF: [40.0, 300.0, 20.0, 9000.0, 400.0], "int8_quant": [30.0, 200.0, 10.0, 6000.0, 300.0]}


def _shapes(n, seed, family="short_prompt_short_output"):
    return request_shapes(n, seed, family)


def synthetic(n=30, trials=3, noise=0.01, seed=0):
    """Per-trial rows whose latency follows TRUE exactly, up to relative noise."""
    rng = np.random.default_rng(seed + 1)
    shapes = _shapes(n, seed)
    rows = []
    for mode, coef in TRUE.items():
        lat = design(shapes, mode, "latency_ms") @ np.asarray(coef)
        ttft = design(shapes, mode, "ttft_ms") @ np.asarray(coef[:3] + [0, 0])
        for i, s in shapes.iterrows():
            for t in range(trials):
                f = 1 + rng.normal(0, noise)
                rows.append({
                    "workload": s["family"], "family": s["family"], "request_id": s["id"],
                    "mode": mode, "trial": t, "attempt": 0, "is_aggregate": False,
                    "prompt_tokens": s["prompt_tokens"],
                    "expected_output_tokens": s["expected_output_tokens"],
                    "shared_prefix_tokens": 0.0, "concurrent_requests": 1.0, "memory_pressure": 0.0,
                    "latency_ms": lat[i] * f, "ttft_ms": ttft[i] * f,
                    "energy_per_token_j": 0.004 * lat[i] * f / s["expected_output_tokens"],
                    "peak_memory_mb": 30 + 0.01 * (s["prompt_tokens"] + s["expected_output_tokens"]),
                    "rouge_l_vs_baseline": 1.0 if mode == REF else 0.9,
                    "output_tokens": s["expected_output_tokens"], **PROV,
                })
    return profile(rows)


def test_structural_fit_recovers_known_coefficients():
    shapes = _shapes(60, 3)
    X = design(shapes, REF, "latency_ms")
    y = X @ np.asarray(TRUE[REF])
    coef = fit_structural(X, y)
    np.testing.assert_allclose(coef, TRUE[REF], rtol=0.02)


def test_fit_on_a_profile_recovers_coefficients_through_trial_medians():
    df = synthetic(n=40, trials=3, noise=0.005)
    # one trial of one request is 10x slow and flagged contended: left out of the median
    i = df.index[(df["mode"] == REF) & (df["trial"] == 1)][0]
    df.loc[i, "latency_ms"] *= 10
    df["contended"] = pd.array([False] * len(df), dtype="boolean")
    df.loc[i, "contended"] = True
    cm = CostModel.fit(df)
    g = cm.groups[(REF, "plain", "latency_ms")]
    assert g.form == "structural" and g.n == 40
    np.testing.assert_allclose(g.coef, TRUE[REF], rtol=0.10)
    assert g.train_mape < 0.02


def test_grouped_folds_keep_each_requests_trials_on_one_side():
    df = synthetic(n=20, trials=3)
    seen = []
    for train, test in grouped_folds(df, k=5, seed=1):
        assert not set(train) & set(test)
        assert set(train) | set(test) == set(df["request_id"])
        seen += test
    assert sorted(seen) == sorted(set(df["request_id"]))  # each request held out once


def test_validation_table_beside_the_interpolation():
    df = synthetic(n=30, trials=2, noise=0.01)
    table, preds = validate(df, k=5)
    lat = table[table["metric"] == "latency_ms"].set_index("mode")
    assert set(lat.index) == set(TRUE)
    assert (lat["n"] == 30).all()
    # the true form is structural: the cost model is within noise, the interpolator is not
    assert (lat["mape_costmodel"] < 0.03).all()
    assert (lat["mape_costmodel"] < lat["mape_interpolation"]).all()
    assert (lat["within10_costmodel"] == 1.0).all()
    # every held-out prediction is for a request outside its fold's training set
    assert set(preds.groupby("unit")["fold"].nunique()) == {1}


def test_save_load_round_trip_and_prefers(tmp_path):
    df = synthetic(n=25, trials=2)
    from modeswitch.oracle.costmodel import fit_validated

    cm = fit_validated(df, k=5)
    path = cm.save(tmp_path / "cm.json")
    assert path.with_suffix(".validation.csv").exists()
    back = CostModel.load(path)
    q = _shapes(5, 9)
    pd.testing.assert_frame_equal(cm.predict(q), back.predict(q))
    assert back.prefers(REF, "latency_ms")
    with pytest.raises(FileExistsError):
        cm.save(path)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    from modeswitch.dataset.errors import InputFileError

    with pytest.raises(InputFileError, match="version"):
        CostModel.load(bad)


def test_oracle_uses_the_cost_model_where_it_validated_better():
    from modeswitch.oracle import label_requests
    from modeswitch.oracle.costmodel import fit_validated

    df = synthetic(n=30, trials=2)
    cm = fit_validated(df, k=5)
    q = _shapes(6, 42)
    labels, cand, _ = label_requests(df, q, costmodel=cm)
    assert (labels["latency_basis"] == "costmodel").all()
    assert labels["estimate_basis"].str.contains("cost model for 2/2 modes").all()
    # with the cost model's estimates the labels follow the true costs: int8 is faster
    assert (labels["label"] == "int8_quant").all()
    truth = design(q, "int8_quant", "latency_ms") @ np.asarray(TRUE["int8_quant"])
    got = cand[cand["mode"] == "int8_quant"].set_index("unit").loc[q["id"], "latency_ms"]
    np.testing.assert_allclose(got.to_numpy(), truth, rtol=0.05)
    # without it, the interpolation is the basis
    labels, _, _ = label_requests(df, q)
    assert (labels["latency_basis"] == "interpolation").all()


def test_costmodel_cli_fit_validate_and_label(tmp_path):
    """`costmodel validate` prints both methods' errors, `fit` writes the model with its
    validation table and logs it to MLflow, and `label --costmodel` uses the file."""
    from typer.testing import CliRunner

    from modeswitch.cli import app

    runner = CliRunner()
    prof = tmp_path / "p.parquet"
    synthetic(n=20, trials=2).to_parquet(prof)
    res = runner.invoke(app, ["costmodel", "validate", "-p", str(prof), "-o", str(tmp_path / "v.csv")])
    assert res.exit_code == 0, res.output
    assert "latency_ms: cost-model MAPE <= 10% for 2/2 modes" in res.output
    v = pd.read_csv(tmp_path / "v.csv")
    assert {"mape_costmodel", "mape_interpolation", "within10_costmodel"} <= set(v.columns)
    assert (tmp_path / "v.predictions.csv").exists()

    model = tmp_path / "cm.json"
    res = runner.invoke(app, ["costmodel", "fit", "-p", str(prof), "-o", str(model),
                              "--mlruns", str(tmp_path / "mlruns")])
    assert res.exit_code == 0, res.output
    assert model.exists() and model.with_suffix(".validation.csv").exists()
    import mlflow

    from modeswitch.routers.training.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri(tmp_path / "mlruns"))
    runs = mlflow.search_runs(experiment_names=["costmodel"])
    assert len(runs) == 1
    assert runs["metrics.mape_costmodel.latency_ms.fp16_baseline"].iloc[0] < 0.03

    reqs = tmp_path / "reqs.csv"
    _shapes(4, 7).drop(columns=["benchmark_suite"]).to_csv(reqs, index=False)
    res = runner.invoke(app, ["label", "-p", str(prof), "--requests", str(reqs), "--costmodel", str(model),
                              "-o", str(tmp_path / "labels.parquet")])
    assert res.exit_code == 0, res.output
    labels = pd.read_parquet(tmp_path / "labels.parquet")
    assert (labels["latency_basis"] == "costmodel").all()
    res = runner.invoke(app, ["label", "-p", str(prof), "--requests", str(reqs), "--costmodel", "none"])
    assert res.exit_code == 0, res.output


def test_profiled_requests_get_measured_labels_and_training_can_keep_only_them():
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle.training_table import build_training_table, profiled_requests, table_meta
    from modeswitch.routers.training.table import select_labels

    df = synthetic(n=8, trials=3)
    prof = profiled_requests(df)
    assert sorted(r.id for r in prof) == sorted(df["request_id"].unique())
    drawn = get_workload("short_prompt_short_output").sample(5, seed=3)
    table = build_training_table(df, drawn + prof)
    src = table.set_index("request_id")["label_source"]
    assert (src[[r.id for r in prof]] == "measured").all()
    assert (src[[r.id for r in drawn]] == "estimated").all()
    assert table_meta(table)["label_sources"] == {"measured": 8, "estimated": 5}
    # a measured label is the median of the request's own trials
    rid = prof[0].id
    med = df[(df["request_id"] == rid) & (df["mode"] == REF)]["latency_ms"].median()
    assert table.set_index("request_id").loc[rid, f"latency_ms__{REF}"] == pytest.approx(med)
    only = select_labels(table, "measured")
    assert len(only) == 8 and table_meta(only) == table_meta(table)
    from modeswitch.dataset.errors import InputError

    with pytest.raises(InputError, match="no measured labels"):
        select_labels(table[table["label_source"] == "estimated"], "measured")


def test_a_request_sharing_a_measured_units_id_but_not_its_shape_is_an_error():
    from modeswitch.oracle import OracleError, label_requests

    df = synthetic(n=6, trials=2)
    q = _shapes(6, 0).iloc[:1].copy()  # the synthetic profile's first request...
    labels, _, _ = label_requests(df, q)
    assert labels["label_source"].tolist() == ["measured"]
    q["prompt_tokens"] += 100  # ...its id with another shape
    with pytest.raises(OracleError, match="has the id of a measured unit but another shape"):
        label_requests(df, q)
