"""examples/ run as they are (on small data), and your own per-mode cost table trains
without the profiler. (The README's "From Python" example: tests/test_readme.py.)"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from modeswitch.dataset.errors import InputError
from tests.helpers import free_port, synthetic_profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    from modeswitch.dataset.io import write_parquet

    p = tmp_path_factory.mktemp("examples") / "profile.parquet"
    write_parquet(synthetic_profile(), p)
    return p


def _run(args, cwd, timeout=600, env=None):
    res = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_example_a_trains_and_compares_two_routers(profile_file, tmp_path):
    out = _run([str(ROOT / "examples" / "train_and_compare.py"), "--profiles", str(profile_file),
                "--requests", "200"], tmp_path)
    for router in ("rule", "lgbm", "cost_linear", "oracle"):
        assert re.search(rf"^{router}\s+\d", out, re.M), out
    assert "best oracle capture:" in out


def test_example_b_scores_a_custom_knn_router_beside_the_built_in_ones(profile_file, tmp_path):
    out = _run([str(ROOT / "examples" / "custom_router.py"), "--profiles", str(profile_file),
                "--requests", "200"], tmp_path)
    for router in ("knn", "dt", "lgbm", "rule"):
        assert re.search(rf"^{router}\s+\d", out, re.M), out
    assert "does not describe its fitted KNeighborsClassifier" in out


@pytest.mark.slow  # trains, exports and serves (make test-slow)
def test_example_c_exports_the_champion_and_queries_the_served_model(profile_file, tmp_path, tiny_models):
    out = _run([str(ROOT / "examples" / "export_and_query.py"), "--profiles", str(profile_file),
                "--requests", "200", "--mlruns", str(tmp_path / "mlruns"), "--serve",
                "--model", str(tiny_models.target), "--port", str(free_port())], tmp_path,
               env={"MODESWITCH_CACHE": str(tmp_path / "cache")})
    assert "as models:/modeswitch-router@champion" in out
    assert len(re.findall(r"-> \w+ \(compiled\)", out)) == 5
    served = re.findall(r"served: \d+ chars -> mode (\w+)", out)
    assert len(served) == 2 and all(m != "None" for m in served), out


def _cost_csv(path: Path, n=240, **constraints) -> pd.DataFrame:
    """A per-mode cost table as a user would bring it, from a built training table."""
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle import Constraints, build_training_table

    fams = ["short_prompt_short_output", "long_prompt_long_output", "shared_prefix_chat", "batch_pressure"]
    reqs = [r for i, f in enumerate(fams) for r in get_workload(f).sample(n // len(fams), seed=i)]
    built = build_training_table(synthetic_profile(), reqs, Constraints(on_incomplete="skip", **constraints))
    keep = ["request_id", "prompt_tokens", "expected_output_tokens", "shared_prefix_tokens",
            "concurrent_requests", "family"]
    keep += [c for c in built.columns if c.split("__")[0] in ("latency_ms", "energy_ratio", "memory_ratio",
                                                             "rouge_l_vs_baseline")]
    built[keep].to_csv(path, index=False)
    return built


def test_your_own_cost_table_labels_like_the_oracle_and_trains(tmp_path):
    from modeswitch.oracle import Constraints, read_cost_table
    from modeswitch.oracle.training_table import table_meta
    from modeswitch.routers import api

    # judged per request, the same costs and limits give the oracle's labels (bar its
    # noise and tie rules); per family, the oracle pools its measured cells, the cost
    # table the requests it is given, so the two populations' means may differ
    built = _cost_csv(tmp_path / "costs.csv", quality_scope="request")
    table = read_cost_table(tmp_path / "costs.csv", Constraints(quality_scope="request"))
    assert table_meta(table)["modes"] == table_meta(built)["modes"]
    assert (table["label_source"] == "external").all()
    assert (table["label"].to_numpy() == built["label"].to_numpy()).mean() > 0.9
    # the study's rule on the cost table: a family's mean decides for all its requests
    fam = read_cost_table(tmp_path / "costs.csv")
    rouge = fam.groupby("family")["rouge_l_vs_baseline__gptq_4bit"].transform("mean")
    judged = fam["violates_quality__gptq_4bit"].to_numpy()
    assert (judged == (rouge.fillna(1.0) < 0.80).to_numpy() | fam["rouge_l_vs_baseline__gptq_4bit"].isna().to_numpy()).all()
    assert fam.groupby("family")["violates_quality__gptq_4bit"].nunique().max() == 1
    assert (fam["diverges__gptq_4bit"] == (fam["rouge_l_vs_baseline__gptq_4bit"] < 0.80)).all()
    router = api.fit("lgbm", table, n_estimators=20)
    assert set(router.predict(table)) <= set(table_meta(table)["modes"])


@pytest.mark.parametrize("body, message", [
    ("request_id,prompt_tokens\nx,5\n", "missing column(s) expected_output_tokens"),
    ("request_id,prompt_tokens,expected_output_tokens,latency_ms__int8_quant\nx,5,5,3\n",
     "missing column(s) latency_ms__fp16_baseline"),
    ("request_id,prompt_tokens,expected_output_tokens,latency_ms__fp16_baseline,latency_ms__turbo\nx,5,5,3,1\n",
     "column latency_ms__turbo: 'turbo' is not a registered mode"),
    ("request_id,prompt_tokens,expected_output_tokens,latency_ms__fp16_baseline,latency_ms__int8_quant\n"
     "x,5,5,3,1\ny,5,five,3,1\n", "row 2, column expected_output_tokens: 'five' is not a finite number"),
    ("request_id,prompt_tokens,expected_output_tokens,latency_ms__fp16_baseline,latency_ms__int8_quant\n"
     "x,5,5,3,1\nx,5,5,3,1\n", "row 2, column request_id: 'x' appears twice"),
    ("request_id,prompt_tokens,expected_output_tokens,latency_ms__fp16_baseline,latency_ms__int8_quant\n"
     "x,5,5,3,-1\n", "row 1, column latency_ms__int8_quant"),
    ("request_id,prompt_tokens,expected_output_tokens,latency_ms__fp16_baseline,latency_ms__int8_quant,"
     "violates_quality__int8_quant\nx,5,5,3,1,maybe\n", "row 1, column violates_quality__int8_quant: 'maybe'"),
])
def test_a_bad_cost_table_names_file_row_and_column(tmp_path, body, message):
    from modeswitch.oracle import read_cost_table

    p = tmp_path / "costs.csv"
    p.write_text(body)
    with pytest.raises(InputError) as e:
        read_cost_table(p)
    assert str(p) in str(e.value) and message in str(e.value)


def test_train_takes_a_cost_table_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from modeswitch.cli import app

    _cost_csv(tmp_path / "costs.csv", n=160)
    res = CliRunner().invoke(app, ["train", "--data", str(tmp_path / "costs.csv"), "--routers", "dt",
                                   "--trials", "2", "--split", "random", "--mlruns", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert "dt=" in res.output
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,prompt_tokens\nx,5\n")
    res = CliRunner().invoke(app, ["train", "--data", str(bad), "--mlruns", str(tmp_path / "m")])
    assert res.exit_code != 0 and "missing column(s) expected_output_tokens" in res.output
    assert "Traceback" not in res.output
