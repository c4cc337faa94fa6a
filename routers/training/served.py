"""The decision a router serves, as tuning sees it: its picks and what each one costs.

Why: the score and the server run the compiled decision (distilled where an ensemble
would walk too many trees: :func:`modeswitch.routers.compiler.compile_state`) and pay its
time on every request; scored as if deciding were free, a model better on paper but
slower than its picks are worth (a LightGBM of hundreds of rounds) would win the
search. Here each trial's first fold model is compiled as it would serve,
scored on the picks that path makes, and timed on the fold's own requests as the
score times it (one decision from a raw request, p50); the trial's other folds pay
the same cost (it follows the hyperparameters, not the fold).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.routers.scoring.offline import requests_from_table
from modeswitch.routers.scoring.overhead import decision_function, time_decisions

#: decisions timed per fold model (compiled: a few ms in all)
DECISIONS = 2000
#: decisions timed where a router does not compile (its pipeline: milliseconds each)
PIPELINE_DECISIONS = 30


def served_decision(router, valid: pd.DataFrame, decisions: int = DECISIONS) -> tuple[np.ndarray, float]:
    """(the picks ``router`` serves on the rows of ``valid``, its decision p50 in ms)."""
    fn, _, fast = decision_function(router)
    picks = fast.predict(valid) if fast is not None else router.predict(valid)
    requests = requests_from_table(valid, token_ids=True)  # a router reading the prompt routes on its ids
    n = decisions if fast is not None else min(decisions, PIPELINE_DECISIONS)
    times_us = time_decisions(fn, requests, n, warmup=min(200, n))
    return np.asarray(picks, dtype=object), float(np.median(times_us)) / 1e3
