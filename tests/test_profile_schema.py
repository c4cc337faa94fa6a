import pandas as pd
import pytest

from modeswitch.dataset.io import OutputExistsError
from modeswitch.dataset.profile_schema import (
    PROFILE_COLUMNS,
    ProfileSchemaError,
    read_profile,
    validate_profile,
    write_profile,
)
from tests.helpers import profile, row


def good():
    return pd.DataFrame([row("w", "fp16_baseline", 10.0), row("w", "int8_quant", 5.0, trial=1)])


def test_good_profile_round_trips_with_missing_values_kept(tmp_path):
    df = validate_profile(good())
    assert list(df.columns[: len(PROFILE_COLUMNS)]) == list(PROFILE_COLUMNS)
    path = write_profile(df, tmp_path / "p.parquet")
    back = read_profile(path)
    assert back["latency_ms"].tolist() == [10.0, 5.0]
    # never measured -> still missing after a round trip, not 0
    assert back["ttft_ms"].isna().all()
    assert back["accuracy"].isna().all()
    assert back["graph_capture"].isna().all()


def test_negative_latency_names_row_and_column():
    df = good()
    df.loc[1, "latency_ms"] = -3.0
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(df, path="bad.parquet")
    assert exc.value.row == 1 and exc.value.field == "latency_ms"
    assert "bad.parquet" in str(exc.value) and "row 1" in str(exc.value)


def test_wrong_type_names_row_and_column(tmp_path):
    df = good()
    df["latency_ms"] = df["latency_ms"].astype(object)
    df.loc[0, "latency_ms"] = "fast"
    p = tmp_path / "bad.csv"
    df.to_csv(p, index=False)
    with pytest.raises(ProfileSchemaError) as exc:
        read_profile(p)
    assert (exc.value.row, exc.value.field) == (0, "latency_ms")
    assert str(p) in str(exc.value)


def test_missing_required_column_is_named():
    df = good().drop(columns=["mode"])
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(df, path="x.parquet")
    assert exc.value.field == "mode" and exc.value.row is None


def test_bad_energy_source_and_out_of_range_quality():
    df = good()
    df.loc[0, "energy_source"] = "guess"
    df.loc[1, "rouge_l_vs_baseline"] = 1.5
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(df)
    where = {(r, c) for r, c, _ in exc.value.failures}
    assert where == {(0, "energy_source"), (1, "rouge_l_vs_baseline")}


def test_trial_rows_need_trial_and_aggregates_need_n():
    df = good()
    df.loc[0, "trial"] = None
    df.loc[1, "is_aggregate"] = True
    df.loc[1, "trial"] = None
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(df)
    where = {(r, c) for r, c, _ in exc.value.failures}
    assert where == {(0, "trial"), (1, "n_trials")}


def test_write_refuses_to_overwrite_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "p.parquet"
    write_profile(good(), path)
    before = path.read_bytes()
    with pytest.raises(OutputExistsError):
        write_profile(good().iloc[:1], path)
    assert path.read_bytes() == before
    write_profile(good().iloc[:1], path, overwrite=True)
    assert len(read_profile(path)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["p.parquet"]


def test_invalid_table_is_not_written(tmp_path):
    df = good()
    df.loc[0, "latency_ms"] = -1
    with pytest.raises(ProfileSchemaError):
        write_profile(df, tmp_path / "p.parquet")
    assert not any(tmp_path.iterdir())


def test_helper_profile_is_valid():
    assert len(profile([row("w", "fp16_baseline", 1.0)])) == 1


def test_a_profile_without_latency_or_with_only_infinite_ones_is_refused():
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(good().drop(columns=["latency_ms"]), path="x.parquet")
    assert exc.value.field == "latency_ms" and "required column is missing" in str(exc.value)
    df = good()
    df["latency_ms"] = float("inf")
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(df, path="x.parquet")
    assert (exc.value.row, exc.value.field) == (0, "latency_ms") and "finite" in str(exc.value)
    df = good()
    df.loc[1, "energy_j"] = float("-inf")
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(df, path="x.parquet")
    assert (exc.value.row, exc.value.field) == (1, "energy_j")


def test_repeated_rows_are_an_error_within_and_across_files(tmp_path):
    from modeswitch.dataset.profile_schema import read_profiles

    df = good()
    with pytest.raises(ProfileSchemaError) as exc:
        validate_profile(pd.concat([df, df], ignore_index=True), path="twice.parquet")
    assert exc.value.row == 2 and "repeats row 0" in str(exc.value) and "twice.parquet" in str(exc.value)
    p = write_profile(df, tmp_path / "a.parquet")
    with pytest.raises(ProfileSchemaError) as exc:
        read_profiles([p, p])
    assert "repeats row 0" in str(exc.value) and str(p) in str(exc.value)
    other = df.copy()
    other["run_id"] = "another-run"  # the same cells measured by another run are not copies
    q = write_profile(other, tmp_path / "b.parquet")
    assert len(read_profiles([p, q])) == 4


def test_a_csv_profile_with_empty_text_columns_reads_back(tmp_path):
    p = tmp_path / "p.csv"
    validate_profile(good()).to_csv(p, index=False)
    back = read_profile(p)
    assert back["latency_ms"].tolist() == [10.0, 5.0]
    assert back["benchmark_suite"].isna().all() and back["evaluation_mode"].isna().all()  # missing, not "nan"
    assert back["workload"].tolist() == ["w", "w"]
