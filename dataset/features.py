"""Cheap, pure request features for routers.

Feature extraction must cost almost nothing at routing time, so it reads only
fields the request already carries (no tokenizer call) and does a handful of float
operations. Two feature sets exist:

* ``A``: request shape only, numbers that vary from request to request;
* ``B``: ``A`` plus the categorical workload family and benchmark suite.
"""

from __future__ import annotations

import math

from modeswitch.dataset.requests import Request

#: Feature set A, the single definition of each feature: a Python expression over a
#: request ``r`` (any object with the request's fields). :func:`request_features`
#: evaluates these expressions, the compiled decision trees inline them
#: (:mod:`routers.compiler.codegen`), and the C kernel's own arithmetic is tested
#: against them on every feature (``tests/test_features.py``).
FEATURE_FORMULAS = {
    "prompt_tokens": "float(r.prompt_tokens)",
    "expected_output_tokens": "float(r.expected_output_tokens)",
    "output_prompt_ratio": "float(r.expected_output_tokens) / (r.prompt_tokens if r.prompt_tokens > 1 else 1.0)",
    "log_prompt_tokens": "log1p(r.prompt_tokens)",
    "log_expected_output_tokens": "log1p(r.expected_output_tokens)",
    "shared_prefix_tokens": "float(r.shared_prefix_tokens)",
    "concurrent_requests": "float(r.concurrent_requests)",
    "memory_pressure": "float(r.memory_pressure)",
}
FEATURE_SET_A = tuple(FEATURE_FORMULAS)
CATEGORICAL_FEATURES = ("family", "benchmark_suite")
FEATURE_SET_B = FEATURE_SET_A + CATEGORICAL_FEATURES
FEATURE_SETS = {"A": FEATURE_SET_A, "B": FEATURE_SET_B}

#: Categorical value used when a request has no family / suite.
NONE_CATEGORY = "none"

#: every formula as one function of a request (built once from the expressions above)
_shape = eval(  # noqa: S307 - our own constant expressions
    compile(f"lambda r: ({', '.join(FEATURE_FORMULAS.values())},)", "<features>", "eval"),
    {"log1p": math.log1p, "max": max, "float": float})


def request_features(request: Request, feature_set: str = "A") -> tuple:
    """Features of one request as a tuple in the feature set's column order."""
    base = _shape(request)
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
    import pandas as pd  # only for frames: one request's features (serving) need no pandas

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
