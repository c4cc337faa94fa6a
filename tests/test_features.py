"""One definition of each feature: Python, the generated tree code and the C kernel agree.

``dataset.features.FEATURE_FORMULAS`` is the single source. These tests pin the
formulas to the documented arithmetic and check, feature by feature, that every
decision path computes exactly the same numbers from the same request.
"""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from modeswitch.dataset.features import FEATURE_FORMULAS, FEATURE_SET_A, request_features
from modeswitch.dataset.requests import Request
from modeswitch.routers.compiler import kernel_shape_features

requests = st.builds(
    Request, id=st.just("r"),
    prompt_tokens=st.integers(0, 200_000), expected_output_tokens=st.integers(0, 20_000),
    shared_prefix_tokens=st.integers(0, 100_000), concurrent_requests=st.integers(1, 256),
    memory_pressure=st.floats(0.0, 0.99, allow_nan=False),
)


def documented(r: Request) -> tuple:
    """The README's feature set A, written out independently of the formulas."""
    p, o = float(r.prompt_tokens), float(r.expected_output_tokens)
    return (p, o, o / (p if p > 1 else 1.0), math.log1p(p), math.log1p(o),
            float(r.shared_prefix_tokens), float(r.concurrent_requests), float(r.memory_pressure))


def test_formulas_name_feature_set_a_in_order():
    assert tuple(FEATURE_FORMULAS) == FEATURE_SET_A


@settings(max_examples=300, deadline=None)
@given(requests)
def test_python_features_follow_the_documented_arithmetic(r):
    assert request_features(r, "A") == documented(r)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_generated_code_computes_each_feature_exactly(r):
    ns = {"log1p": math.log1p}
    for i, (name, expr) in enumerate(FEATURE_FORMULAS.items()):
        assert eval(compile(expr, name, "eval"), ns, {"r": r}) == request_features(r, "A")[i], name


@settings(max_examples=300, deadline=None)
@given(requests)
def test_c_kernel_computes_each_feature_exactly(r):
    got = kernel_shape_features(r.prompt_tokens, r.expected_output_tokens, r.shared_prefix_tokens,
                                r.concurrent_requests, r.memory_pressure)
    want = request_features(r, "A")
    for name, g, w in zip(FEATURE_SET_A, got, want):
        assert g == w, name
