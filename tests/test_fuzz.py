"""Fuzzing: the server against its own OpenAPI schema (schemathesis: every endpoint,
generated bodies, valid and not), and the profile readers and importers against
random files (hypothesis). The only acceptable outcomes are an answer below 500 /
a parsed table, or one of the project's input errors naming the file."""

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeswitch.dataset.errors import InputError, InputFileError
from tests.test_serving_limits import _server

#: examples per endpoint (bounded: the suite's time budget)
EXAMPLES = 60


@pytest.fixture(scope="module")
def live():
    (server, th, port), _ = _server(step_s=0.0, max_body_bytes=64 * 1024, max_in_flight=64)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    th.join(timeout=30)


def test_no_input_makes_the_server_answer_5xx(live):
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{live}/openapi.json")
    seen = {}
    for result in schema.get_all_operations():
        op = result.ok()
        seen.setdefault(op.label, [])

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            r = case.call(base_url=live, timeout=30)
            seen[case.operation.label].append(r.status_code)
            assert r.status_code < 500, (case.body, r.status_code, r.text[:300])

        check()
    assert {"POST /v1/completions", "POST /v1/chat/completions", "GET /health"} <= set(seen)
    assert len(seen["POST /v1/completions"]) >= EXAMPLES // 2
    print({k: (len(v), sorted(set(v))) for k, v in seen.items()})


COLUMNS = ["workload", "family", "mode", "trial", "latency_ms", "reference_mode", "backend", "is_aggregate",
           "n_trials", "energy_j", "prompt_tokens", "memory_pressure", "request_id", "energy_source"]
cell = st.one_of(st.integers(-5, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.text(string.printable, max_size=12), st.sampled_from(["", "true", "fp16_baseline", "w"]))


@given(cols=st.lists(st.sampled_from(COLUMNS), min_size=0, max_size=10, unique=True),
       rows=st.lists(st.lists(cell, min_size=10, max_size=10), max_size=6), raw=st.binary(max_size=40),
       kind=st.sampled_from(["csv", "garbage", "parquet"]))
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_profile_reader_and_importers_take_any_file_without_a_traceback(tmp_path_factory, cols, rows,
                                                                              raw, kind):
    import pandas as pd

    from modeswitch.dataset.importers import import_files
    from modeswitch.dataset.profile_schema import read_profile

    d = tmp_path_factory.mktemp("fz")
    path = d / ("p.parquet" if kind == "parquet" else "p.csv")
    if kind == "garbage":
        path.write_bytes(raw)
    else:
        frame = pd.DataFrame([r[: len(cols)] for r in rows], columns=cols) if cols else pd.DataFrame()
        if kind == "csv":
            frame.to_csv(path, index=False)
        else:
            frame.astype(str).to_parquet(path)
    for reader in (lambda: read_profile(path), lambda: import_files([path])):
        try:
            reader()
        except (InputError, InputFileError) as exc:
            assert str(path) in str(exc) or path.name in str(exc), str(exc)
