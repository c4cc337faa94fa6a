"""Import of the study's published A100 measurements (skips without ../shared)."""

import pandas as pd
import pytest

from modeswitch.dataset.errors import InputFileError
from modeswitch.dataset.importers import detect_importer, import_file, import_files
from modeswitch.oracle import Constraints, OracleError, label_profile


def test_trials_file_becomes_per_trial_rows(a100_dir):
    df = import_file(a100_dir / "profiles_a100_curated_sweep_trials.csv")
    raw = pd.read_csv(a100_dir / "profiles_a100_curated_sweep_trials.csv")
    assert len(df) == len(raw) == 84
    assert not df["is_aggregate"].any() and df["trial"].notna().all()
    assert df["latency_ms"].tolist() == raw["total_latency_ms"].tolist()
    assert df["peak_memory_mb"].tolist() == raw["peak_gpu_memory_mb"].tolist()
    assert set(df["reference_mode"]) == {"fp16_baseline"}
    assert set(df["energy_source"]) == {"published"}
    # not published -> stays missing
    assert df["energy_j"].isna().all() and df["rouge_l_vs_baseline"].isna().all()
    assert df["measured_at"].iloc[0] == "2026-04-22T22:29:18"
    mp = df[df["workload"] == "memory_pressure_long_context"].iloc[0]
    assert (mp["prompt_tokens"], mp["expected_output_tokens"], mp["memory_pressure"]) == (2048, 128, 0.5)
    sp = df[df["workload"] == "shared_prefix_chat_v0"].iloc[0]
    assert sp["family"] == "shared_prefix_chat" and sp["shared_prefix_tokens"] == 1024


def test_sweep_file_is_aggregates_not_fake_trials(a100_dir):
    df = import_file(a100_dir / "profiles_a100_curated_sweep.csv")
    assert len(df) == 42 and df["is_aggregate"].all() and df["trial"].isna().all()
    assert (df["n_trials"] == 2).all()
    row = df[(df["mode"] == "gptq_4bit") & (df["workload"] == "long_prompt_long_output")].iloc[0]
    assert row["latency_ms_p95"] == pytest.approx(1063.675791)
    assert row["rouge_l_vs_baseline"] == pytest.approx(0.228814)


def test_stress_files_keep_unpublished_cells_empty(a100_dir):
    single = import_file(a100_dir / "profiles_a100_stress_single.csv")
    hybrid = import_file(a100_dir / "profiles_a100_stress_hybrid.csv")
    assert len(single) == 12 and len(hybrid) == 10
    g = hybrid[hybrid["mode"] == "gptq_plus_continuous_batching"].iloc[0]
    assert pd.isna(g["latency_ms"]) and pd.isna(g["tokens_per_s"])
    assert "midpoint of published 95% CI" in g["source"]
    shared = single[single["workload"] == "shared4032_out64"].iloc[0]
    assert shared["family"] == "shared_prefix_long_context" and pd.isna(shared["shared_prefix_tokens"])
    assert shared["prompt_tokens"] == 4032 and shared["expected_output_tokens"] == 64


def test_unknown_format_and_unknown_workload_are_clear_errors(tmp_path, a100_dir):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(InputFileError, match="no importer recognises"):
        import_file(p)
    raw = pd.read_csv(a100_dir / "profiles_a100_curated_sweep_trials.csv")
    raw.loc[3, "workload_name"] = "mystery"
    bad = tmp_path / "bad.csv"
    raw.to_csv(bad, index=False)
    with pytest.raises(InputFileError) as exc:
        import_file(bad)
    assert (exc.value.row, exc.value.field) == (3, "workload_name")
    assert detect_importer(raw.columns).name == "modeswitch_a100_trials"


def test_labels_of_the_published_curated_sweep(a100_dir):
    trials = import_file(a100_dir / "profiles_a100_curated_sweep_trials.csv")
    # per-trial data alone has no quality signal: by the study's rule nothing but the
    # reference is shown safe; with --missing-quality pass energy and memory decide
    labels, _, _ = label_profile(trials)
    assert set(labels["quality_signals"]) == {"none"}
    assert (labels["label"] == labels["reference_mode"]).all()
    labels, cand, _ = label_profile(trials, Constraints(missing_quality="pass"))
    assert set(labels["quality_signals"]) == {"none"}
    assert labels.loc["shared_prefix_chat_v0", "label"] == "prefix_caching"
    assert labels.loc["long_prompt_long_output", "label"] == "gptq_4bit"
    kv = cand.set_index(["unit", "mode"]).loc[("long_prompt_long_output", "kv_cache_compression")]
    assert kv["violates_energy"] and not kv["safe"]

    both = import_files([a100_dir / "profiles_a100_curated_sweep_trials.csv",
                         a100_dir / "profiles_a100_curated_sweep.csv"])
    labels, cand, _ = label_profile(both)
    # with the sweep's ROUGE-L, 4-bit modes fail quality on generation workloads
    assert labels.loc["long_prompt_long_output", "label"] == "int8_quant"
    assert labels.loc["short_prompt_long_output", "label"] == "speculative_decoding"
    g = cand.set_index(["unit", "mode"]).loc[("long_prompt_long_output", "gptq_4bit")]
    assert g["violates_quality_rouge_vs_baseline"]
    # latency comes from the trial rows, not doubled by the aggregate
    ref = cand.set_index(["unit", "mode"]).loc[("long_prompt_long_output", "fp16_baseline"), "latency_ms"]
    assert ref == pytest.approx((2796.98 + 2826.3) / 2)


def test_stress_units_without_reference_are_an_error_or_skipped(a100_dir):
    hybrid = import_file(a100_dir / "profiles_a100_stress_hybrid.csv")
    with pytest.raises(OracleError, match="no rows for its reference mode"):
        label_profile(hybrid)
    single = import_file(a100_dir / "profiles_a100_stress_single.csv")
    labels, _, skipped = label_profile(single, Constraints(on_incomplete="skip"))
    assert "shared4032_out64" in skipped
    assert labels.loc["ctx3840_out256", "label"] == "fp16_baseline"  # no quality evidence
    labels, _, _ = label_profile(single, Constraints(on_incomplete="skip", missing_quality="pass"))
    assert labels.loc["ctx3840_out256", "label"] == "speculative_decoding"


# --- later sweeps' workload names, and files with optional columns absent ---

BENCH = {"mmlu_pro_eval": ("mmlu_pro", "multiple_choice_accuracy"),
         "gsm8k_eval": ("gsm8k", "final_answer_exact_match"),
         "truthfulqa_eval": ("truthfulqa", "multiple_choice_accuracy"),
         "gpqa_eval": ("gpqa", "multiple_choice_accuracy"),
         "mlu_eval": ("mlu", "multiple_choice_accuracy")}


def test_workload_shape_of_later_sweep_names(tmp_path):
    from modeswitch.dataset.importers.modeswitch_a100 import workload_shape

    for name in ("shared_prefix_chat", "shared_prefix_chat_v0", "shared_prefix_chat_v3"):
        s = workload_shape(name, tmp_path / "x.csv", 0)
        assert s["family"] == "shared_prefix_chat" and s["shared_prefix_tokens"] == 1024
        assert s["benchmark_suite"] is None
    for name, (suite, mode) in BENCH.items():
        s = workload_shape(name, tmp_path / "x.csv", 0)
        assert (s["family"], s["benchmark_suite"], s["evaluation_mode"]) == (suite, suite, mode)
        assert s["shared_prefix_tokens"] == 0 and s["memory_pressure"] == 0
        assert pd.isna(s["prompt_tokens"])  # not published
    with pytest.raises(InputFileError):
        workload_shape("gsm8k_evaluation", tmp_path / "x.csv", 2)


def _renamed(a100_dir, tmp_path, filename):
    raw = pd.read_csv(a100_dir / filename)
    raw["workload_name"] = raw["workload_name"].replace({"shared_prefix_chat_v0": "shared_prefix_chat"})
    names = list(BENCH)
    rows = raw.index[raw["workload_name"] == "short_prompt_short_output"]
    for i, row in enumerate(rows):
        raw.loc[row, "workload_name"] = names[i % len(names)]
    p = tmp_path / filename
    raw.to_csv(p, index=False)
    return p


@pytest.mark.parametrize("filename", ["profiles_a100_curated_sweep_trials.csv",
                                      "profiles_a100_curated_sweep.csv"])
def test_later_sweep_workload_names_import(a100_dir, tmp_path, filename):
    df = import_file(_renamed(a100_dir, tmp_path, filename))
    sp = df[df["workload"] == "shared_prefix_chat"]
    assert len(sp) and (sp["family"] == "shared_prefix_chat").all()
    assert (sp["shared_prefix_tokens"] == 1024).all() and sp["benchmark_suite"].isna().all()
    seen = set()
    for name, (suite, mode) in BENCH.items():
        rows = df[df["workload"] == name]
        seen |= set(rows["workload"])
        assert (rows["family"] == suite).all() and (rows["benchmark_suite"] == suite).all()
        assert (rows["evaluation_mode"] == mode).all()
    assert {"gsm8k_eval", "mmlu_pro_eval"} <= seen
    plain = df[df["workload"] == "long_prompt_long_output"]
    assert plain["benchmark_suite"].isna().all() and plain["evaluation_mode"].isna().all()


def test_sweep_without_optional_columns_has_them_missing(a100_dir, tmp_path):
    raw = pd.read_csv(a100_dir / "profiles_a100_curated_sweep.csv").head(5)
    p = tmp_path / "sweep.csv"
    raw.drop(columns=["completed_runs", "baseline_similarity_rouge_l_f1_mean",
                      "total_latency_ms_p95", "tokens_per_second_mean"]).to_csv(p, index=False)
    df = import_file(p)
    assert len(df) == 5 and df["is_aggregate"].all()
    assert df["rouge_l_vs_baseline"].isna().all()
    assert df["latency_ms_p95"].isna().all() and df["tokens_per_s"].isna().all()
    assert df["latency_ms"].tolist() == raw["total_latency_ms_mean"].tolist()
    assert df["rouge_l_vs_reference"].tolist() == pytest.approx(raw["reference_rouge_l_f1_mean"].tolist())
    # an aggregate row needs its trial count: the exact re-expression, named in source
    assert (df["n_trials"] == 2).all()
    assert df["source"].str.contains("n_trials = num_runs - failed_runs", regex=False).all()

    bare = tmp_path / "bare.csv"
    raw[["sweep", "mode_name", "workload_name", "completed_runs",
         "total_latency_ms_mean"]].to_csv(bare, index=False)
    df = import_file(bare)
    assert df["n_trials"].tolist() == raw["completed_runs"].tolist()
    for c in ("rouge_l_vs_baseline", "rouge_l_vs_reference", "ttft_ms", "energy_per_token_j",
              "peak_memory_mb", "latency_ms_std"):
        assert df[c].isna().all(), c

    nocount = tmp_path / "nocount.csv"
    raw.drop(columns=["completed_runs", "num_runs"]).to_csv(nocount, index=False)
    with pytest.raises(InputFileError, match="completed_runs") as exc:
        import_file(nocount)
    assert exc.value.field == "completed_runs" and "nocount.csv" in str(exc.value)


def test_sweep_without_latency_is_a_clear_error(a100_dir, tmp_path):
    raw = pd.read_csv(a100_dir / "profiles_a100_curated_sweep.csv").head(3)
    p = tmp_path / "nolatency.csv"
    raw.drop(columns=["total_latency_ms_mean"]).to_csv(p, index=False)
    with pytest.raises(InputFileError, match="total_latency_ms_mean") as exc:
        import_file(p)
    assert exc.value.field == "total_latency_ms_mean" and exc.value.row is None
    assert "nolatency.csv" in str(exc.value)


def test_trials_without_optional_columns_and_without_latency(a100_dir, tmp_path):
    raw = pd.read_csv(a100_dir / "profiles_a100_curated_sweep_trials.csv").head(6)
    p = tmp_path / "trials.csv"
    raw.drop(columns=["ttft_ms", "energy_per_token_j", "peak_gpu_memory_mb",
                      "tokens_per_second", "source"]).to_csv(p, index=False)
    df = import_file(p)
    assert len(df) == 6 and not df["is_aggregate"].any()
    for c in ("ttft_ms", "energy_per_token_j", "peak_memory_mb", "tokens_per_s"):
        assert df[c].isna().all(), c
    assert df["latency_ms"].tolist() == raw["total_latency_ms"].tolist()
    bad = tmp_path / "trials_nolat.csv"
    raw.drop(columns=["total_latency_ms"]).to_csv(bad, index=False)
    with pytest.raises(InputFileError, match="total_latency_ms") as exc:
        import_file(bad)
    assert exc.value.field == "total_latency_ms" and "trials_nolat.csv" in str(exc.value)


def test_stress_without_optional_columns_and_without_latency(a100_dir, tmp_path):
    raw = pd.read_csv(a100_dir / "profiles_a100_stress_hybrid.csv")
    p = tmp_path / "stress.csv"
    raw.drop(columns=["ttft_ms_mean", "peak_gpu_memory_mb_mean",
                      "energy_per_token_j_mean_from_ci95_midpoint"]).to_csv(p, index=False)
    df = import_file(p)
    assert len(df) == 10 and df["ttft_ms"].isna().all() and df["peak_memory_mb"].isna().all()
    g = df[df["mode"] == "gptq_plus_continuous_batching"].iloc[0]
    assert pd.isna(g["energy_per_token_j"]) and "midpoint" not in g["source"]
    nolat = tmp_path / "stress_nolat.csv"
    raw.drop(columns=["total_latency_ms_mean_exact_best_mode_table"]).to_csv(nolat, index=False)
    with pytest.raises(InputFileError, match="total_latency_ms_mean_exact_best_mode_table") as exc:
        import_file(nolat)
    assert "stress_nolat.csv" in str(exc.value)
    noruns = tmp_path / "stress_noruns.csv"
    raw.drop(columns=["num_runs"]).to_csv(noruns, index=False)
    with pytest.raises(InputFileError, match="num_runs"):
        import_file(noruns)


def test_non_numeric_cell_names_row_and_column(a100_dir, tmp_path):
    raw = pd.read_csv(a100_dir / "profiles_a100_curated_sweep.csv").head(4)
    raw["total_latency_ms_p95"] = raw["total_latency_ms_p95"].astype(object)
    raw.loc[2, "total_latency_ms_p95"] = "n/a ms"
    p = tmp_path / "text.csv"
    raw.to_csv(p, index=False)
    with pytest.raises(InputFileError) as exc:
        import_file(p)
    assert (exc.value.row, exc.value.field) == (2, "total_latency_ms_p95")
