"""Hand-built profile tables for tests (no engine involved)."""

import pandas as pd

PROV = {
    "backend": "test", "model": "hand-built", "hardware": "none", "run_id": "t",
    "energy_source": "none", "reference_mode": "fp16_baseline",
}


def row(unit, mode, latency, energy=1.0, memory=100.0, trial=0, **extra):
    r = {
        "workload": unit, "family": extra.pop("family", "short_prompt_short_output"),
        "mode": mode, "trial": trial, "is_aggregate": False,
        "latency_ms": latency, "energy_per_token_j": energy, "peak_memory_mb": memory,
        "prompt_tokens": extra.pop("prompt_tokens", 128.0),
        "expected_output_tokens": extra.pop("expected_output_tokens", 32.0),
        **PROV,
    }
    r.update(extra)
    return r


def profile(rows) -> pd.DataFrame:
    from dataset.profile_schema import validate_profile

    return validate_profile(pd.DataFrame(rows))
