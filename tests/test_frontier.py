"""The capture / violation frontier (routers.scoring.frontier) on tables whose answer is known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from modeswitch.routers.scoring.frontier import frontier
from tests.helpers import synthetic_table


def _two_fast_modes(learnable: bool):
    """A table where ``int8_quant`` saves half the reference's latency and
    ``gptq_4bit`` (faster still) is never safe; int8 is safe on short prompts only
    (``learnable``), or on a coin flip the features cannot see."""
    t = synthetic_table(["short_prompt_short_output", "long_prompt_short_output", "short_prompt_long_output"], 120)
    keep = ["fp16_baseline", "int8_quant", "gptq_4bit"]
    t = t.drop(columns=[c for c in t.columns if "__" in c and c.split("__", 1)[1] not in keep])
    ref = t["latency_ms__fp16_baseline"]
    t["latency_ms__int8_quant"] = ref * 0.5
    t["latency_ms__gptq_4bit"] = ref * 0.3
    t["safe__gptq_4bit"] = False
    coin = np.random.default_rng(0).random(len(t)) < 0.5
    t["safe__int8_quant"] = (t["prompt_tokens"] < t["prompt_tokens"].median()) if learnable else coin
    return t


def test_a_learnable_safety_rule_reaches_the_oracle():
    f = frontier(_two_fast_modes(True), "random")
    assert f.scored > 50
    assert f.best_capture(0.0) == pytest.approx(1.0, abs=0.05)  # int8 where safe, gptq never
    assert f.auc["int8_quant"] > 0.95


def test_safety_the_features_cannot_see_caps_the_capture():
    f = frontier(_two_fast_modes(False), "random")
    # half of int8's picks would violate: no rule keeps much of the saving at 2 %
    assert f.best_capture(0.02) < 0.3
    assert f.auc["int8_quant"] < 0.7
    # and picking freely (every mode allowed) saves more than the oracle at a high violation rate
    free = f.curve[f.curve["rule"] == "threshold"].iloc[-1]
    assert free["capture"] > 1.0 and free["violations"] > 0.9
    # but nothing of that is a saving a deployment keeps: every gptq pick is unsafe
    assert free["safe_capture"] == pytest.approx(0.0)
    assert (f.curve["safe_capture"] <= f.curve["capture"] + 1e-12).all()
    assert f.best_capture(0.02, safe=True) <= f.best_capture(0.02)


def test_lofo_scores_every_family_once_and_only_inside_the_ranges():
    t = _two_fast_modes(True)
    everything = frontier(t, "lofo", inside_only=False)
    inside = frontier(t, "lofo")
    assert everything.scored == len(t)
    assert inside.scored < len(t)  # a held-out family's prompt lengths lie outside the others'


def test_nothing_inside_the_ranges_gives_an_empty_frontier(monkeypatch):
    import pandas as pd

    from modeswitch.routers.scoring import coverage

    t = _two_fast_modes(True)
    every = pd.DataFrame({"request_id": t["request_id"].astype(str), "extrapolated": True, "outside": "x"})
    monkeypatch.setattr(coverage, "coverage", lambda table, folds: (every, None))
    f = frontier(t, "group")
    assert f.scored == 0 and f.curve.empty and np.isnan(f.best_capture(0.02))


def test_routers_are_points_beside_the_ceilings_envelope():
    from modeswitch.routers.scoring.capture import envelope, router_points

    per = pd.DataFrame({"router": ["a"] * 4 + ["oracle"] * 4,
                        "reference_latency_ms": [100.0] * 8, "oracle_latency_ms": [50.0] * 8,
                        "latency_ms": [75.0, 75.0, 100.0, 20.0] + [50.0] * 4,
                        "violates_any": [False, False, False, True] + [False] * 4,
                        "extrapolated": [False, False, False, False, False, False, False, True]})
    pts = router_points(per).set_index("router")
    assert pts.loc["a", "capture"] == pytest.approx((25 + 25 + 0 + 80) / 200) and pts.loc["a", "violations"] == 0.25
    assert pts.loc["oracle", "capture"] == pytest.approx(1.0) and pts.loc["oracle", "requests"] == 3
    curve = pd.DataFrame({"violations": [0.0, 0.0, 0.1, 0.2, 0.2], "capture": [0.1, 0.3, 0.2, 0.6, 0.5]})
    env = envelope(curve)
    assert list(env["violations"]) == [0.0, 0.1, 0.2] and list(env["capture"]) == [0.3, 0.3, 0.6]
