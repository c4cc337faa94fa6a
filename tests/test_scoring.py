"""Scoring arithmetic on hand-built tables: overhead in the speedup, violations by
type, equal family weights vs request weights, oracle capture, and the live path."""

import json

import numpy as np
import pandas as pd
import pytest

from modeswitch.routers.reference import FixedModeRouter, OracleRouter
from modeswitch.routers.scoring.offline import aggregate_scores, score_offline, score_requests


def table(rows):
    """A training table with modes ref (fp16_baseline) and fast."""
    df = pd.DataFrame(rows)

    def default(col, value):
        df[col] = df[col].fillna(value) if col in df else value

    df["reference_mode"] = "fp16_baseline"
    for k in ("quality", "energy", "memory"):
        df[f"violates_{k}__fp16_baseline"] = False
        default(f"violates_{k}__fast", False)
        df[f"violates_{k}__fast"] = df[f"violates_{k}__fast"].astype(bool)
    df["safe__fp16_baseline"] = True
    df["safe__fast"] = ~df[[f"violates_{k}__fast" for k in ("quality", "energy", "memory")]].any(axis=1)
    for m in ("fp16_baseline", "fast"):
        default(f"energy_ratio__{m}", 1.0)
        default(f"memory_ratio__{m}", 1.0)
        default(f"rouge_l_vs_baseline__{m}", 1.0)
    df.attrs["modeswitch"] = json.dumps({"modes": ["fast", "fp16_baseline"], "constraints": {},
                                         "profile_hash": "x", "skipped": {}})
    return df


def base_rows():
    # family a: 3 requests, fast is 2x faster; family b: 1 request, fast 4x faster
    return [
        {"request_id": f"a{i}", "family": "a", "label": "fast", "latency_ms__fp16_baseline": 10.0,
         "latency_ms__fast": 5.0, "energy_ratio__fast": 0.5} for i in range(3)
    ] + [{"request_id": "b0", "family": "b", "label": "fast", "latency_ms__fp16_baseline": 8.0,
          "latency_ms__fast": 2.0, "energy_ratio__fast": 0.25}]


def test_overhead_is_charged_in_speedup():
    t = table(base_rows()[:1])
    free = score_requests(t, ["fast"], overhead_us=0.0)
    costly = score_requests(t, ["fast"], overhead_us=5000.0)  # 5 ms of routing
    assert free["speedup"].item() == pytest.approx(2.0)
    assert costly["speedup"].item() == pytest.approx(10.0 / (5.0 + 5.0))
    assert costly["regret"].item() == pytest.approx(1.0)


def test_equal_family_weights_differ_from_request_weights():
    t = table(base_rows())
    fam, overall = aggregate_scores(score_offline(t, {"always_fast": FixedModeRouter("fast").fit()}))
    f = fam.set_index("family")
    assert f.loc["a", "speedup"] == pytest.approx(2.0) and f.loc["b", "speedup"] == pytest.approx(4.0)
    o = overall.set_index("weighting")
    assert o.loc["families", "speedup"] == pytest.approx(3.0)  # mean of family speedups
    assert o.loc["requests", "speedup"] == pytest.approx(38.0 / 17.0)  # summed latencies
    assert o.loc["families", "energy_ratio"] == pytest.approx((0.5 + 0.25) / 2)
    assert o.loc["requests", "energy_ratio"] == pytest.approx((1.5 + 0.25) / 4)


def test_violations_are_counted_by_type_and_unknown_modes_are_unmeasured():
    rows = base_rows()
    rows[0]["violates_quality__fast"] = True
    rows[1]["violates_energy__fast"] = True
    rows[2]["violates_memory__fast"] = True
    rows[2]["violates_energy__fast"] = True
    t = table(rows)
    per = score_requests(t, ["fast", "fast", "fast", "never_measured"], router="r")
    assert per["violates_quality"].tolist() == [True, False, False, False]
    assert per["violates_energy"].tolist() == [False, True, True, False]
    assert per["violates_memory"].tolist() == [False, False, True, False]
    assert per["violates_unmeasured"].tolist() == [False, False, False, True]
    _, overall = aggregate_scores(per)
    req = overall.set_index("weighting").loc["requests"]
    assert req["violations_energy"] == 2 and req["violation_rate_energy"] == pytest.approx(0.5)
    assert req["violations_any"] == 4
    eq = overall.set_index("weighting").loc["families"]
    # family a: 3/3 violate something; family b: 1/1 (unmeasured)
    assert eq["violation_rate_any"] == pytest.approx(1.0)
    assert eq["violation_rate_quality"] == pytest.approx((1 / 3 + 0) / 2)


def test_oracle_capture_and_match():
    t = table(base_rows())
    per = score_offline(t, {"ref": FixedModeRouter().fit(), "oracle": OracleRouter().fit(t),
                            "half": FixedModeRouter("fast").fit()}, {"half": 0.0})
    _, overall = aggregate_scores(per)
    o = overall[overall["weighting"] == "requests"].set_index("router")
    assert o.loc["oracle", "latency_capture"] == pytest.approx(1.0)
    assert o.loc["ref", "latency_capture"] == pytest.approx(0.0)
    assert o.loc["oracle", "oracle_match"] == 1.0 and o.loc["ref", "oracle_match"] == 0.0
    assert o.loc["ref", "speedup"] == pytest.approx(1.0)


def test_live_scores_compare_each_pick_with_the_reference_run():
    from modeswitch.dataset.requests import Request
    from modeswitch.oracle.constraints import Constraints
    from modeswitch.routers.scoring.live import score_live, stratified, summarise_live

    stream = [Request(id="r1", prompt_tokens=10, expected_output_tokens=4, family="a"),
              Request(id="r2", prompt_tokens=10, expected_output_tokens=4, family="b")]
    runs = pd.DataFrame([
        {"request_id": "r1", "mode": "fp16_baseline", "latency_ms": 100.0, "energy_per_token_j": 1.0, "rouge_l_vs_baseline": 1.0},
        {"request_id": "r1", "mode": "fast", "latency_ms": 50.0, "energy_per_token_j": 1.2, "rouge_l_vs_baseline": 0.5},
        {"request_id": "r2", "mode": "fp16_baseline", "latency_ms": 40.0, "energy_per_token_j": 1.0, "rouge_l_vs_baseline": 1.0},
    ])
    per, _, _ = score_live(runs, stream, {"r": ["fast", "fp16_baseline"]}, {"r": 1000.0}, Constraints())
    assert per["speedup"].tolist() == pytest.approx([100 / 51, 40 / 41])
    assert per["violates_quality"].tolist() == [True, False]
    assert per["violates_energy"].tolist() == [True, False]
    s = summarise_live(per).set_index("router").loc["r"]
    assert s["violation_rate_quality"] == pytest.approx(0.5)
    fams = {r.family for r in stratified(stream * 3, 2)}
    assert fams == {"a", "b"}


@pytest.mark.slow
def test_score_offline_and_live_on_the_tiny_model(tiny_models, tmp_path):
    """Train two routers on measured tiny-model profiles, then score offline and live."""
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.engine.profiler import Profiler, ProfileSpec
    from modeswitch.oracle.constraints import Constraints
    from modeswitch.oracle.training_table import build_training_table
    from modeswitch.routers.scoring.run import ScoreConfig, score_routers
    from modeswitch.routers.training.trainer import TrainConfig, train

    target = tiny_models.target
    fams = ["short_prompt_short_output", "batch_pressure", "shared_prefix_chat"]
    spec = ProfileSpec(model=str(target), modes=["fp16_baseline", "prefix_caching", "continuous_batching"],
                       workloads=fams, requests=1, batch_size=2)
    prof = Profiler(spec, target, None, tmp_path / "p.parquet").run()
    reqs = [r for i, f in enumerate(fams) for r in get_workload(f).sample(20, seed=i)]
    reqs = [r if r.concurrent_requests == 1 else __import__("dataclasses").replace(r, concurrent_requests=2)
            for r in reqs]
    tab = build_training_table(prof, reqs, Constraints(on_incomplete="skip"))
    mlruns = tmp_path / "mlruns"
    # measured labels may come out as one class on so small a profile: tree routers take that
    train(tab, TrainConfig(routers=["dt", "rf"], trials=2, split="random", mlruns=str(mlruns)))
    res = score_routers(tab, ScoreConfig(mlruns=str(mlruns), decisions=500, live=True, live_requests=3, live_trials=2,
                                 model=str(target)), tmp_path / "report")
    head = res["headline"]
    assert {"rule", "reference", "dt", "rf", "oracle"} <= set(head.index)
    assert np.isfinite(head.loc["rule", "overhead_p50_us"]) and head.loc["dt", "overhead_p50_us"] > 0
    live = res["live_summary"].set_index("router")
    assert {"rule", "dt", "rf", "oracle", "reference"} <= set(live.index)
    assert live.loc["reference", "speedup"] == pytest.approx(1.0, rel=0.05)  # overhead only
    assert (live["speedup_low"] <= live["speedup_high"]).all()
    assert (res["live_per"]["trials"] == 2).all()
    assert np.isfinite(res["live_figures"]["estimate_mape_pct"])
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "## Findings (computed from the tables below)" in readme and "Live, " in readme
    files = {p.name for p in (tmp_path / "report").rglob("*")}
    assert {"README.md", "headline.csv", "live_summary.csv", "live_per_family.csv",
            "routing_overhead.png", "pareto.png",
            "violations.png", "per_family_speedup.png", "confusion_dt.png", "live_runs.csv",
            "capture_vs_violations.png", "frontier.csv"} <= files
    runs = pd.read_csv(tmp_path / "report" / "live_runs.csv")  # every live trial, as run
    assert {"output_tokens", "ttft_ms", "cpu_share", "contended", "trial"} <= set(runs.columns)
    import mlflow

    run = mlflow.MlflowClient().get_run(res["mlflow_run_id"])
    assert "router_run.dt" in run.data.tags
    child = {c.data.tags["router"]: c for c in mlflow.MlflowClient().search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")}
    assert np.isfinite(child["rule"].data.metrics["speedup"])
    assert np.isfinite(child["dt"].data.metrics["live_speedup"])
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(res["mlflow_run_id"], "report/plots")}
    assert "report/plots/routing_overhead.png" in arts
    with pytest.raises(FileExistsError):
        score_routers(tab, ScoreConfig(mlruns=str(mlruns), decisions=100), tmp_path / "report")


def test_an_unmeasured_pick_is_charged_the_reference_cost_and_cannot_win():
    """The A100 group-split case: a router picking a mode with no numbers for most
    requests scored 3x the oracle because the missing latencies dropped out of one
    side of the ratio. Now each such pick is a violation and pays the reference's cost."""
    t = table(base_rows())
    ghost = ["ghost_mode", "ghost_mode", "ghost_mode", "fast"]
    per = score_requests(t, ghost, router="ghost")
    assert per["violates_unmeasured"].tolist() == [True, True, True, False]
    assert per["charged"].tolist() == [True, True, True, False]
    assert per["latency_ms"].tolist() == [10.0, 10.0, 10.0, 2.0]  # the reference's latency
    assert per["energy_ratio"].tolist() == [1.0, 1.0, 1.0, 0.25]
    _, overall = aggregate_scores(pd.concat([per, score_requests(
        t, t["label"].to_numpy(), router="oracle")]))
    o = overall[overall["weighting"] == "requests"].set_index("router")
    assert o.loc["ghost", "speedup"] == pytest.approx(38.0 / 32.0)
    assert o.loc["ghost", "speedup"] < o.loc["oracle", "speedup"] == pytest.approx(38.0 / 17.0)
    assert o.loc["ghost", "charged_rate"] == pytest.approx(0.75)
    assert o.loc["ghost", "violation_rate_unmeasured"] == pytest.approx(0.75)
    # a NaN latency in the table is unmeasured too, not skipped
    t2 = t.copy()
    t2.loc[0, "latency_ms__fast"] = np.nan
    per2 = score_requests(t2, ["fast"] * 4)
    assert per2["charged"].tolist() == [True, False, False, False]
    assert np.isfinite(per2["effective_latency_ms"]).all()


def test_live_trials_give_medians_intervals_and_violation_causes():
    from modeswitch.dataset.requests import Request
    from modeswitch.oracle.constraints import Constraints
    from modeswitch.routers.scoring.live import score_live, summarise_live

    stream = [Request(id=f"{f}{i}", prompt_tokens=10, expected_output_tokens=4, family=f)
              for f in "ab" for i in range(4)]
    rows = []
    for r in stream:
        for t in range(3):
            rows.append({"request_id": r.id, "mode": "fp16_baseline", "trial": t, "latency_ms": 100.0 + t,
                         "energy_per_token_j": 1.0, "rouge_l_vs_baseline": 1.0})
            # fast: 2x faster; energy 1.02x on a's requests in every trial (beyond noise),
            # on b's 0.97 / 1.04 / 1.01 (median over the limit, but within noise)
            e = [1.02] * 3 if r.family == "a" else [0.97, 1.04, 1.01]
            rows.append({"request_id": r.id, "mode": "fast", "trial": t, "latency_ms": 50.0 + t,
                         "energy_per_token_j": e[t], "rouge_l_vs_baseline": 1.0})
    runs = pd.DataFrame(rows)
    table = pd.DataFrame({"request_id": [r.id for r in stream],
                          "label_source": ["measured"] * 2 + ["estimated"] * 6,
                          "safe__fast": [True] * 8})
    per, est, _ = score_live(runs, stream, {"r": ["fast"] * 8}, {"r": 0.0}, Constraints(), table)
    assert per["latency_ms"].tolist() == [51.0] * 8 and (per["trials"] == 3).all()
    assert per["violates_energy"].all()
    assert per["cause"].tolist() == ["measurement_wrong"] * 2 + ["estimate_wrong"] * 2 + ["within_noise"] * 4
    assert (~per["violates_any_beyond_noise"][4:]).all()
    s = summarise_live(per).set_index("router").loc["r"]
    assert s["speedup"] == pytest.approx(101 / 51)
    assert s["speedup_low"] <= s["speedup"] <= s["speedup_high"]
    assert s["violation_rate_any"] == 1.0 and s["violation_rate_beyond_noise"] == pytest.approx(0.5)
    assert s["violations_within_noise"] == 4 and s["violations_estimate_wrong"] == 2
    fam = summarise_live(per, by_family=True).set_index("family")
    assert fam.loc["b", "violation_rate_beyond_noise"] == 0.0
    assert len(est) == 16  # one row per (request, mode), medians over trials
    # the table measured on another kind of machine: its measured labels' violations say so
    other, _, _ = score_live(runs, stream, {"r": ["fast"] * 8}, {"r": 0.0}, Constraints(), table,
                             other_hardware=True)
    assert other["cause"].tolist() == ["other_hardware"] * 2 + ["estimate_wrong"] * 2 + ["within_noise"] * 4
    assert summarise_live(other).set_index("router").loc["r", "violations_other_hardware"] == 2


def test_the_profile_hardware_comes_from_the_table_else_its_profile_file(tmp_path):
    from modeswitch.routers.scoring.run import profile_hardware

    assert profile_hardware({"hardware": ["A (2 cores)"]}) == ["A (2 cores)"]
    path = tmp_path / "profile.parquet"
    pd.DataFrame({"hardware": ["B (2 cores)", "B (2 cores)", None]}).to_parquet(path)
    assert profile_hardware({"hardware": [], "profile_source": str(path)}) == ["B (2 cores)"]
    assert profile_hardware({"profile_source": str(tmp_path / "gone.parquet")}) == []
    pd.DataFrame({"x": [1]}).to_parquet(path)
    assert profile_hardware({"profile_source": str(path)}) == []  # an older profile without the column


def test_offline_headline_carries_family_weighted_intervals():
    from modeswitch.routers.scoring.offline import offline_intervals
    from modeswitch.routers.scoring.report import headline_table

    rows = base_rows()
    rows[1]["latency_ms__fast"] = 8.0  # family a's requests now differ: 2x, 1.25x, 2x
    t = table(rows)
    per = score_offline(t, {"fast": FixedModeRouter("fast").fit(), "ref": FixedModeRouter().fit()})
    _, overall = aggregate_scores(per)
    iv = offline_intervals(per, n_boot=500)
    head = headline_table(overall, {}, intervals=iv)
    f = head.loc["fast"]
    assert f["speedup_low"] <= f["speedup"] <= f["speedup_high"] and f["speedup_low"] < f["speedup_high"]
    assert head.loc["ref", "speedup_low"] == head.loc["ref", "speedup_high"] == pytest.approx(1.0)
    cols = list(head.columns)
    assert cols.index("speedup_low") == cols.index("speedup") + 1


def test_findings_are_computed_from_the_tables():
    from modeswitch.routers.scoring.findings import findings

    def r(speedup, lo, hi, viol, vlo, vhi, p50=0.5):
        return {"speedup": speedup, "speedup_low": lo, "speedup_high": hi,
                "violation_rate_any": viol, "violation_rate_any_low": vlo,
                "violation_rate_any_high": vhi, "oracle_match": 0.8, "latency_capture": 0.9,
                "overhead_p50_us": p50, "overhead_p99_us": 2 * p50}

    head = pd.DataFrame({
        "rule": r(1.3, 1.2, 1.4, 0.5, 0.4, 0.6), "oracle": r(1.8, 1.7, 1.9, 0, 0, 0),
        "fastbutunsafe": r(2.0, 1.9, 2.1, 0.3, 0.25, 0.35), "safe": r(1.5, 1.45, 1.55, 0.02, 0.0, 0.05),
        "alsosafe": r(1.4, 1.35, 1.45, 0.04, 0.01, 0.07)}).T
    text = findings(head)
    assert "among those as safe as the safest (safe, alsosafe of 3" in text[0]
    assert "is safe: speedup 1.50x [1.45, 1.55]" in text[0]
    assert "does not overlap" in text[1]  # 1.45-1.55 vs the oracle's 1.7-1.9
    assert "9,000-100,000x" in text[2]  # 4.5 ms and 50 ms over 0.5 us, two significant figures
    live = pd.DataFrame({"safe": {"speedup": 1.4, "speedup_low": 1.3, "speedup_high": 1.6,
                                  "violation_rate_beyond_noise": 0.05, "violation_rate_any": 0.1},
                         "oracle": {"speedup": 1.5, "speedup_low": 1.4, "speedup_high": 1.7,
                                    "violation_rate_beyond_noise": 0.0, "violation_rate_any": 0.0},
                         "rule": {"speedup": 1.2, "speedup_low": 1.1, "speedup_high": 1.3,
                                  "violation_rate_beyond_noise": 0.4, "violation_rate_any": 0.5}}).T
    live.index.name = "router"
    text = findings(head, live.reset_index())
    assert "the intervals overlap" in text[3] and "on 5.0% and 0.0%" in text[3]
    assert "rule baseline runs at 1.20x [1.10, 1.30], violating on 50.0%" in text[4]
    # one trial of a few requests: point "intervals" a rounding apart are not compared
    live.loc["safe", ["speedup", "speedup_low", "speedup_high"]] = 2.1512
    live.loc["oracle", ["speedup", "speedup_low", "speedup_high"]] = 2.1478
    text = findings(head, live.reset_index())
    assert "too few requests for an interval" in text[3] and "overlap" not in text[3]
