"""The reference model's confidence at the prompt's end: the arithmetic, the prefill on the
tiny checkpoint (cached), and the training table taking it for the quality-risk model."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from modeswitch.dataset.confidence_features import CONFIDENCE_FEATURES, confidence_from_logits
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.workloads.conditions import drawn_requests
from modeswitch.engine import prompt_confidence as pc
from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.training_table import build_training_table
from tests.helpers import synthetic_profile

REF = "fp16_baseline"


def test_the_arithmetic_on_known_distributions():
    ent, gap, top1 = confidence_from_logits(np.zeros(8))
    assert ent == pytest.approx(math.log(8)) and gap == pytest.approx(0) and top1 == pytest.approx(1 / 8)
    # two tokens at log-odds 2 over the rest: the gap is between the top two only
    ent, gap, top1 = confidence_from_logits([5.0, 3.0, 0.0, 0.0])
    p = np.exp([5.0, 3.0, 0.0, 0.0]) / np.exp([5.0, 3.0, 0.0, 0.0]).sum()
    assert gap == pytest.approx(2.0) and top1 == pytest.approx(p[0])
    assert ent == pytest.approx(-(p * np.log(p)).sum())
    # large logits do not overflow
    assert confidence_from_logits([1e4, 0.0])[1] == pytest.approx(1e4)
    with pytest.raises(ValueError, match="two finite"):
        confidence_from_logits([1.0, np.nan])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODESWITCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_prefill_reads_the_last_position_and_is_cached(tiny_models, cache, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    prompts = {"a": [5, 6, 7, 8, 9, 10], "b": [11, 12, 13], "same-as-a": [5, 6, 7, 8, 9, 10]}
    got = pc.prompt_confidence(str(tiny_models.target), prompts)
    assert list(got.index) == list(prompts) and list(got.columns) == [*CONFIDENCE_FEATURES, "prefill_ms"]
    net = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), dtype=torch.float32).eval()
    with torch.inference_mode():
        want = confidence_from_logits(net(torch.tensor([prompts["b"]])).logits[0, -1].numpy())
    assert got.loc["b", list(CONFIDENCE_FEATURES)].to_numpy() == pytest.approx(want, rel=1e-5)
    assert got.loc["a"].equals(got.loc["same-as-a"]) and (got["prefill_ms"] > 0).all()
    # a second call reads the cache and runs no model
    monkeypatch.setattr(pc, "_run", lambda *a, **k: pytest.fail("the cache was not read"))
    again = pc.prompt_confidence(str(tiny_models.target), {"b": [11, 12, 13], "a": [5, 6, 7, 8, 9, 10]})
    pd.testing.assert_frame_equal(again, got.loc[["b", "a"]])


def test_a_folder_without_weights_is_a_clear_error(tmp_path, cache):
    with pytest.raises(InputError, match="no \\*.safetensors"):
        pc.prompt_confidence(str(tmp_path), {"a": [1, 2]})


FAMILIES = ["short_prompt_short_output", "short_prompt_long_output"]


def test_the_table_takes_the_confidence_and_the_risk_model_learns_from_it(tiny_models, cache):
    """int8_quant's output fails where the reference was unsure (a low top-1 probability,
    as the flip literature finds): the risk model, reading the confidence, learns it."""
    from modeswitch.oracle.content_columns import prompt_ids

    model = str(tiny_models.target)
    reqs = drawn_requests(FAMILIES, 16, seed=2, length_scale=0.25)
    swept = [r for i, r in enumerate(reqs) if i % 4]
    conf = pc.prompt_confidence(model, prompt_ids(reqs, model))
    unsure = conf["ref_top1_prob"] < conf.loc[[r.id for r in swept], "ref_top1_prob"].median()
    sweep = pd.DataFrame([{"request_id": r.id, "mode": m, "reference_mode": REF, "accuracy": np.nan,
                           "rouge_l_vs_baseline": 1.0 if m == REF else (0.3 if unsure[r.id] else 0.95)}
                          for r in swept for m in (REF, "int8_quant")])
    c = Constraints(quality_scope="request")
    t = build_training_table(synthetic_profile(), reqs, c, quality=sweep, content_model=model, confidence=True)
    assert t[list(CONFIDENCE_FEATURES)].notna().all().all()
    assert (t["ref_top1_prob"].between(0, 1)).all() and (t["ref_top2_gap"] >= 0).all()
    meta = json.loads(t.attrs["modeswitch"])
    assert meta["confidence"]["prompts"] == len(reqs) and meta["confidence"]["prefill_ms_p50"] > 0
    risk = meta["quality_risk"]
    assert set(CONFIDENCE_FEATURES) <= set(risk["features"]) and "concurrent_requests" not in risk["features"]
    v = {row["mode"]: row for row in risk["validation"]}["int8_quant"]
    assert v["rows"] == len(swept) and v["trusted"] and v["auc"] > 0.8
    unswept = t[t["quality_basis"].eq("estimated")].set_index("request_id")
    assert len(unswept) == len(reqs) - len(swept)
    p = unswept["quality_risk__int8_quant"]
    assert p[unsure[p.index]].mean() > p[~unsure[p.index]].mean()
    with pytest.raises(InputError, match="content_model"):
        build_training_table(synthetic_profile(), reqs, c, confidence=True)
