"""Labelling what every importer gives: per-trial rows, aggregate rows alone (published
per-cell means without their trials), and a file without its reference mode's rows.

The published A100 files (``a100_dir``) are absent from a user's clone; the small sweep
file written here is not, so the aggregate-only case always runs."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from modeswitch.dataset.importers import import_file, list_importers
from modeswitch.oracle import Constraints, OracleError, label_profile
from modeswitch.oracle.family_rule import divergence_rates
from modeswitch.oracle.mode_table import mode_table
from modeswitch.oracle.quality_floor import self_consistency_floor

runner = CliRunner()

#: the published file each importer reads
FIXTURES = {"modeswitch_a100_trials": "profiles_a100_curated_sweep_trials.csv",
            "modeswitch_a100_sweep": "profiles_a100_curated_sweep.csv",
            "modeswitch_a100_stress": "profiles_a100_stress_single.csv"}


def aggregate_sweep(path):
    """A sweep file of per-cell means only, in the published sweep's columns: the
    reference, a lossy mode and a lossless one on two workloads."""
    rows = []
    for workload, base in (("short_prompt_short_output", 400.0), ("long_prompt_long_output", 2800.0)):
        for mode, speed, rouge in (("fp16_baseline", 1.0, 1.0), ("int8_quant", 0.6, 0.9),
                                   ("continuous_batching", 0.8, 0.95)):
            rows.append({"sweep": "curated_controller_sweep_20260422_222918", "mode_name": mode,
                         "workload_name": workload, "num_runs": 2, "completed_runs": 2,
                         "total_latency_ms_mean": base * speed, "reference_rouge_l_f1_mean": 0.3,
                         "baseline_similarity_rouge_l_f1_mean": rouge})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _label_everything(profile: pd.DataFrame, c: Constraints | None = None) -> pd.DataFrame:
    """What ``modeswitch label`` computes from a profile, its labels returned."""
    labels, cand, _ = label_profile(profile, c)
    mode_table(profile, c or Constraints())
    divergence_rates(cand.reset_index(), (c or Constraints()).min_rouge_vs_baseline)
    self_consistency_floor(profile)
    return labels


def test_an_aggregate_only_profile_is_labelled(tmp_path):
    profile = import_file(aggregate_sweep(tmp_path / "sweep.csv"))
    assert profile["is_aggregate"].all()
    labels = _label_everything(profile)
    assert set(labels.index) == {"short_prompt_short_output", "long_prompt_long_output"}
    assert (labels["label"] == "int8_quant").all()  # fastest, ROUGE-L 0.9 >= 0.80
    # no per-trial rows: no floor to report, and no error for want of one
    assert self_consistency_floor(profile).empty


def test_the_floor_of_no_per_trial_rows_is_empty():
    """The floor reads per-trial rows only; a frame whose rows are all aggregates leaves
    an empty string column to filter, which must still give an empty table."""
    profile = pd.DataFrame({"mode": pd.Series(["fp16_baseline", "continuous_batching"], dtype="string[pyarrow]"),
                            "family": "f", "request_id": pd.NA, "rouge_l_vs_baseline": [1.0, 0.9],
                            "reference_mode": "fp16_baseline", "is_aggregate": True})
    assert self_consistency_floor(profile).empty


@pytest.mark.parametrize("importer", sorted(FIXTURES))
def test_every_importer_s_published_file_is_labelled(a100_dir, importer):
    assert set(FIXTURES) == {i.name for i in list_importers()}, "a new importer needs its fixture here"
    profile = import_file(a100_dir / FIXTURES[importer], importer=importer)
    labels = _label_everything(profile, Constraints(on_incomplete="skip"))
    assert len(labels) and labels["label"].notna().all()


def test_a_file_without_its_reference_rows_is_one_clear_error(a100_dir):
    hybrid = import_file(a100_dir / "profiles_a100_stress_hybrid.csv")
    with pytest.raises(OracleError, match="no rows for its reference mode"):
        label_profile(hybrid)
    with pytest.raises(OracleError, match="nothing to label: every one of the 4 units was skipped"):
        label_profile(hybrid, Constraints(on_incomplete="skip"))
    single = import_file(a100_dir / "profiles_a100_stress_single.csv")
    labels, _, skipped = label_profile(pd.concat([single, hybrid]), Constraints(on_incomplete="skip"))
    assert len(labels) == 2 and len(skipped) == 2


def test_modeswitch_label_on_an_aggregate_only_import_exits_0(tmp_path):
    profile = tmp_path / "agg.parquet"
    res = runner.invoke(app, ["import-profiles", str(aggregate_sweep(tmp_path / "sweep.csv")), "-o", str(profile)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "labels.parquet"
    res = runner.invoke(app, ["label", "--profiles", str(profile), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert len(pd.read_parquet(out)) == 2
