"""Cheap, pure request features for routers.

Feature extraction must cost almost nothing at routing time, so it reads only
fields the request already carries (no tokenizer call) and does a handful of float
operations. Two feature sets exist:

* ``A``: request shape only, numbers that vary from request to request;
* ``B``: ``A`` plus the categorical workload family and benchmark suite.
"""

from __future__ import annotations

import math

from dataset.requests import Request

FEATURE_SET_A = (
    "prompt_tokens",
    "expected_output_tokens",
    "output_prompt_ratio",
    "log_prompt_tokens",
    "log_expected_output_tokens",
    "shared_prefix_tokens",
    "concurrent_requests",
    "memory_pressure",
)
CATEGORICAL_FEATURES = ("family", "benchmark_suite")
FEATURE_SET_B = FEATURE_SET_A + CATEGORICAL_FEATURES
FEATURE_SETS = {"A": FEATURE_SET_A, "B": FEATURE_SET_B}

#: Categorical value used when a request has no family / suite.
NONE_CATEGORY = "none"


def shape_features(
    prompt_tokens, expected_output_tokens, shared_prefix_tokens=0, concurrent_requests=1,
    memory_pressure=0.0,
) -> tuple:
    """Feature set A as a tuple, in FEATURE_SET_A order, from raw numbers."""
    p = float(prompt_tokens)
    o = float(expected_output_tokens)
    return (
        p,
        o,
        o / max(p, 1.0),
        math.log1p(p),
        math.log1p(o),
        float(shared_prefix_tokens),
        float(concurrent_requests),
        float(memory_pressure),
    )


def request_features(request: Request, feature_set: str = "A") -> tuple:
    """Features of one request as a tuple in the feature set's column order."""
    base = shape_features(
        request.prompt_tokens,
        request.expected_output_tokens,
        request.shared_prefix_tokens,
        request.concurrent_requests,
        request.memory_pressure,
    )
    if feature_set == "A":
        return base
    if feature_set == "B":
        return base + (
            request.family or NONE_CATEGORY,
            request.benchmark_suite or NONE_CATEGORY,
        )
    raise ValueError(f"unknown feature set {feature_set!r}; choose one of {sorted(FEATURE_SETS)}")


def features_frame(requests, feature_set: str = "B", with_context: bool = True):
    """A feature DataFrame (one row per request) for training and batch routing.

    With ``with_context`` the frame also carries ``evaluation_mode`` and
    ``workload`` so that the rule baseline, which keys on them, can read the same
    frame the learned routers read.
    """
    import pandas as pd

    cols = list(FEATURE_SETS[feature_set])
    rows = [request_features(r, feature_set) for r in requests]
    df = pd.DataFrame(rows, columns=cols)
    if with_context:
        extra = {
            "family": [r.family or NONE_CATEGORY for r in requests],
            "benchmark_suite": [r.benchmark_suite or NONE_CATEGORY for r in requests],
            "evaluation_mode": [r.evaluation_mode or NONE_CATEGORY for r in requests],
            "workload": [r.workload or NONE_CATEGORY for r in requests],
        }
        for k, v in extra.items():
            if k not in df.columns:
                df[k] = v
    df.index = pd.Index([r.id for r in requests], name="request_id")
    return df
