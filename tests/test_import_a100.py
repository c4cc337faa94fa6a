"""Import of the study's published A100 measurements (skips without ../shared)."""

import pandas as pd
import pytest

from dataset.errors import InputFileError
from dataset.importers import detect_importer, import_file, import_files
from oracle import Constraints, OracleError, label_profile


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
    labels, cand, _ = label_profile(trials)
    # per-trial data alone has no quality signal: energy and memory decide
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
    assert labels.loc["ctx3840_out256", "label"] == "speculative_decoding"
