import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from modeswitch.dataset.features import FEATURE_SET_A, features_frame
from modeswitch.dataset.requests import Request
from modeswitch.routers import get_router, list_routers
from modeswitch.routers.rule_baseline import RuleBaselineRouter, prefill_score

BASE = dict(prompt_tokens=500, expected_output_tokens=100, shared_prefix_tokens=0,
            concurrent_requests=1, memory_pressure=0.0)

# (overrides, expected study mode, rule number in the reason)
CASES = [
    ({"concurrent_requests": 4, "shared_prefix_tokens": 200}, "int8_plus_continuous_batching", "rule 1"),
    ({"concurrent_requests": 3, "shared_prefix_tokens": 200}, "gptq_plus_prefix_caching", "rule 2"),
    ({"shared_prefix_tokens": 1, "memory_pressure": 0.5}, "gptq_plus_prefix_caching", "rule 2"),
    ({"memory_pressure": 0.3, "family": "short_prompt_long_output"}, "gptq_4bit", "rule 3"),
    ({"family": "short_prompt_short_output"}, "gptq_4bit", "rule 4"),
    ({"family": "short_prompt_long_output"}, "speculative_decoding", "rule 4"),
    ({"family": "long_prompt_short_output"}, "gptq_4bit", "rule 4"),
    ({"family": "long_prompt_long_output"}, "gptq_4bit", "rule 4"),
    ({"benchmark_suite": "gsm8k", "prompt_tokens": 2000, "expected_output_tokens": 8}, "speculative_decoding", "rule 5"),
    ({"benchmark_suite": "mmlu_pro", "prompt_tokens": 100, "expected_output_tokens": 8}, "int8_quant", "rule 6"),
    ({"benchmark_suite": "truthfulqa"}, "int8_quant", "rule 6"),
    ({"benchmark_suite": "gpqa"}, "int8_quant", "rule 6"),
    ({"benchmark_suite": "mlu"}, "int8_quant", "rule 6"),
    ({"prompt_tokens": 384, "expected_output_tokens": 64}, "speculative_decoding", "rule 7"),
    ({"prompt_tokens": 385, "expected_output_tokens": 64, "evaluation_mode": "external_judge"}, "speculative_decoding", "rule 8"),
    ({"prompt_tokens": 900, "expected_output_tokens": 40, "benchmark_suite": "mt_bench"}, "speculative_decoding", "rule 8"),
    ({"prompt_tokens": 2000, "expected_output_tokens": 128}, "speculative_decoding", "rule 8"),
    # prompt 700 (+15), output 10 (+20), ratio 0.014 (+20) = 55 > 40
    ({"prompt_tokens": 700, "expected_output_tokens": 10}, "int8_quant", "rule 9: prefill score 55"),
    # prompt 800: score 25+0+0-20 = 5, but prompt >= 768
    ({"prompt_tokens": 800, "expected_output_tokens": 100}, "int8_quant", "rule 9: prompt"),
    # prompt 500 output 100: score 15-20 -> 0, default
    ({}, "int8_quant", "rule 10"),
]


def frame(**kw):
    row = {**BASE, **kw}
    return pd.DataFrame([row])


@pytest.mark.parametrize("overrides,mode,rule", CASES)
def test_every_rule_branch(overrides, mode, rule):
    r = RuleBaselineRouter().fit()
    X = frame(**overrides)
    label, reason = r.explain(X)[0]
    assert label == mode
    assert reason.startswith(rule), reason
    assert r.predict(X)[0] == mode


@pytest.mark.parametrize("p,o,mp,score", [
    (100, 100, 0, 0), (384, 8, 0, 15 + 30 + 10), (400, 8, 0, 15 + 30 + 20), (768, 16, 0, 25 + 20 + 10),
    (1000, 40, 0, 25 + 0 + 10), (400, 64, 0.2, 15 - 20 + 5), (5000, 4, 0.5, 25 + 30 + 20 + 5),
    (100, 200, 0, 0), (0, 1, 0, 30),
])
def test_prefill_score(p, o, mp, score):
    assert prefill_score(p, o, mp) == max(0, min(100, score))


def test_modes_the_backend_lacks_map_to_nearest_with_reason():
    avail = ["fp16_baseline", "int8_quant", "gptq_4bit", "prefix_caching", "continuous_batching",
             "ngram_speculative_decoding"]
    r = RuleBaselineRouter(available_modes=avail).fit()
    assert r.mode_map_["gptq_plus_prefix_caching"] == "prefix_caching"
    assert r.mode_map_["int8_plus_continuous_batching"] == "continuous_batching"
    assert r.mode_map_["speculative_decoding"] == "ngram_speculative_decoding"
    label, reason = r.explain(frame(concurrent_requests=8))[0]
    assert label == "continuous_batching" and "backend lacks" in reason
    assert set(r.classes_) <= set(avail)


def test_no_substitute_available_is_an_error():
    with pytest.raises(LookupError):
        RuleBaselineRouter(available_modes=["fp16_baseline"]).fit()


def test_estimator_api():
    r = get_router("rule", batch_threshold=8)
    assert "rule" in list_routers()
    assert r.get_params()["batch_threshold"] == 8
    c = clone(r)
    assert c is not r and c.get_params() == r.get_params()
    assert not hasattr(c, "mode_map_")
    with pytest.raises(NotFittedError):
        c.predict(frame())
    assert c.fit(frame()) is c
    assert c.n_features_in_ == len(BASE)
    # threshold is a real parameter
    assert c.predict(frame(concurrent_requests=5))[0] != "int8_plus_continuous_batching"


def test_route_on_raw_request_matches_predict_and_arrays_are_accepted():
    reqs = [Request(id=str(i), prompt_tokens=p, expected_output_tokens=o, concurrent_requests=c,
                    family=f)
            for i, (p, o, c, f) in enumerate([(100, 10, 1, None), (900, 300, 1, None),
                                              (50, 50, 6, None), (128, 32, 1, "short_prompt_short_output")])]
    X = features_frame(reqs)
    r = RuleBaselineRouter().fit(X)
    assert [r.route(q) for q in reqs] == list(r.predict(X))
    arr = X[list(FEATURE_SET_A)].to_numpy()
    assert list(r.predict(arr))[:3] == list(r.predict(X))[:3]
    with pytest.raises(ValueError, match="lacks column"):
        r.predict(pd.DataFrame({"prompt_tokens": [1]}))
    assert isinstance(r.predict(X), np.ndarray)
