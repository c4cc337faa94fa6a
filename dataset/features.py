"""Cheap, pure request features for routers.

Feature extraction must cost almost nothing at routing time, so it reads only
what the request already carries (no tokenizer call, no model call) and does a
handful of float operations. Feature sets are registered by name
(:func:`register_feature_set`; the Python API takes any, ``--feature-set`` the three below):

* ``A``: request shape only, numbers that vary from request to request;
* ``B``: ``A`` plus the categorical workload family and benchmark suite;
* ``C``: ``A`` plus what the prompt says, read from its token ids through the
  model's content table (:mod:`modeswitch.dataset.content_features`): a table lookup.
"""

from __future__ import annotations

import math

from modeswitch.dataset.content_features import CONTENT_FEATURES
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request

#: Feature set A, the single definition of each feature: a Python expression over a
#: request ``r`` (any object with the request's fields). :func:`request_features`
#: evaluates these expressions, the compiled decision trees inline them
#: (:mod:`modeswitch.routers.compiler.codegen`), and the C kernel's own arithmetic is tested
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
FEATURE_SET_C = FEATURE_SET_A + CONTENT_FEATURES
#: every registered feature set: name -> its columns (numeric ones first, as routers read them)
FEATURE_SETS: dict[str, tuple[str, ...]] = {}


def register_feature_set(name: str, columns: tuple[str, ...]) -> None:
    """Register a feature set by name. Its columns are feature set A's (a prefix, so the
    compiled kernel computes them from the request's fields), then any of
    :data:`CONTENT_FEATURES` (read from the prompt's token ids) or
    :data:`CATEGORICAL_FEATURES`. Registering a name again with other columns is an
    error (two plug-ins must not replace each other silently)."""
    columns = tuple(columns)
    known = set(FEATURE_SET_A) | set(CONTENT_FEATURES) | set(CATEGORICAL_FEATURES)
    unknown = [c for c in columns if c not in known]
    if unknown or columns[:len(FEATURE_SET_A)] != FEATURE_SET_A:
        raise ValueError(f"feature set {name!r}: columns must start with feature set A's and then take "
                         f"content or categorical columns ({', '.join(unknown) or 'A is not its prefix'})")
    if FEATURE_SETS.get(name, columns) != columns:
        raise ValueError(f"feature set {name!r} is registered already with other columns")
    FEATURE_SETS[name] = columns


def reads_content(feature_set: str) -> bool:
    """Whether a feature set reads the prompt's token ids (a content table is needed)."""
    return any(c in CONTENT_FEATURES for c in feature_columns(feature_set))


def feature_columns(feature_set: str) -> tuple[str, ...]:
    """A registered feature set's columns; an unknown name is an error listing them."""
    try:
        return FEATURE_SETS[feature_set]
    except KeyError:
        raise InputError(f"unknown feature set {feature_set!r}; choose one of {', '.join(sorted(FEATURE_SETS))}") \
            from None


register_feature_set("A", FEATURE_SET_A)
register_feature_set("B", FEATURE_SET_B)
register_feature_set("C", FEATURE_SET_C)

#: Categorical value used when a request has no family / suite.
NONE_CATEGORY = "none"

#: every formula as one function of a request (built once from the expressions above)
_shape = eval(  # noqa: S307 - our own constant expressions
    compile(f"lambda r: ({', '.join(FEATURE_FORMULAS.values())},)", "<features>", "eval"),
    {"log1p": math.log1p, "max": max, "float": float})


def request_features(request: Request, feature_set: str = "A", content=None) -> tuple:
    """Features of one request as a tuple in the feature set's column order.

    ``content``: the model's :class:`~modeswitch.dataset.content_features.ContentTable`, needed by
    a feature set that reads the prompt (the request must carry ``prompt_token_ids``)."""
    base = _shape(request)
    if feature_set == "A":
        return base
    cols = feature_columns(feature_set)
    out = list(base)
    if reads_content(feature_set):
        if content is None:
            raise InputError(f"feature set {feature_set} reads the prompt's content: give the model's content table")
        if request.prompt_token_ids is None:
            raise InputError(f"request {request.id}: feature set {feature_set} reads the prompt's token ids, "
                             "and this request carries none (prompt_token_ids)")
        values = dict(zip(CONTENT_FEATURES, content.features(request.prompt_token_ids).tolist()))
    cats = {"family": request.family or NONE_CATEGORY, "benchmark_suite": request.benchmark_suite or NONE_CATEGORY}
    for c in cols[len(base):]:
        out.append(values[c] if c in CONTENT_FEATURES else cats[c])
    return tuple(out)


def features_frame(requests, feature_set: str = "B", with_context: bool = True, content=None):
    """A feature DataFrame (one row per request) for training and batch routing.

    With ``with_context`` the frame also carries ``evaluation_mode`` and
    ``workload`` so that the rule baseline, which keys on them, can read the same
    frame the learned routers read. ``content``: see :func:`request_features`.
    """
    import pandas as pd  # only for frames: one request's features (serving) need no pandas

    cols = list(feature_columns(feature_set))
    rows = [request_features(r, feature_set, content) for r in requests]
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
