"""Each certified router with its threshold adapted online over the held-out requests,
replayed as a stream (``adaptive_replay.csv``, ``adaptive_replay_per_family.csv``).

Why: the certified point says what a threshold fixed before the new family arrived
keeps; the hindsight curve (:mod:`modeswitch.routers.scoring.threshold_sweep`) what the best fixed
threshold would have kept had the held-out outcomes been known. An adaptive threshold
(:mod:`modeswitch.routers.adaptive`) sits between them and can be served: it starts at the
certified threshold and moves after each outcome it is told, so its rate over the
stream is held to the target by construction (within :meth:`ThresholdTracker.slack`),
not by the calibration rows' likeness to the new family.

The replay: the held-out requests in a random order (``seed``), one deployment per
router as served (leave one family out: every family is its own deployment, its fold's
router starting at the threshold certified without it), each pick's outcome (the
table's ``violates_*`` for it, the same any violation the offline score counts) fed
back ``delay`` requests later. What a replay assumes that a server must provide: an
outcome for every pick (a shadow run of the reference on each request, or on a sample
with the step scaled up) and the same violations the table's labels state.

Figures, per router: the pooled capture and violation rate over the requests inside
the training ranges (as every other point in the plot), the certified threshold's on
the same requests (the same decider: a served distilled tree answers one threshold
only, so both are the ensemble's, ``decision``), the worst family's rate; and what the
bound covers, each stream's every decision (extrapolated requests too): the pooled
and the worst stream's violation rate and the largest slack (``delay`` counted). The
per-family table adds the threshold each family's stream ended at.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from modeswitch.experimental import experimental_func
from modeswitch.routers.adaptive import STEP_SIZE, ThresholdTracker, tracker_for
from modeswitch.routers.scoring.capture import capture_and_violations, inside_ranges
from modeswitch.routers.scoring.offline import score_requests
from modeswitch.routers.scoring.threshold_sweep import certified_parts, picks_at


def violation_matrix(test: pd.DataFrame, modes: list[str]) -> np.ndarray:
    """(rows, modes) booleans: would picking each mode break a limit on each row, as the
    offline score counts it (``violates_any``: quality, energy, memory or unmeasured)."""
    n = len(test)
    return np.column_stack([score_requests(test, np.full(n, m, dtype=object))["violates_any"].to_numpy(bool)
                            for m in modes]) if modes else np.zeros((n, 0), bool)


def replay_stream(certified, X: pd.DataFrame, violates: np.ndarray, order: np.ndarray, target: float,
                  step_size: float = STEP_SIZE, delay: int = 0) -> tuple[np.ndarray, np.ndarray, ThresholdTracker]:
    """One deployment: ``X``'s rows served in ``order`` by the certified router's inner
    model, its threshold adapted by the outcome of each pick (``violates``: rows x the
    inner model's modes) ``delay`` picks later. Returns (picks by row, the threshold each
    row was decided at, the tracker at the end)."""
    inner = certified.router_
    tracker = tracker_for(inner, certified.threshold_, target, step_size)
    modes = np.asarray(inner.modes_, dtype=object)
    idx = np.zeros(len(X), dtype=int)
    at = np.full(len(X), np.nan)
    fast = hasattr(inner, "row_scores") and hasattr(inner, "decide_scores")
    if fast:
        ratio, risk = inner.row_scores(inner.features(X))
    pending: deque = deque()
    try:
        for i in order:
            at[i] = t = tracker.threshold
            if fast:
                idx[i] = int(inner.decide_scores(ratio[i:i + 1], risk[i:i + 1], t)[0])
            else:
                inner.set_risk_threshold(t)
                idx[i] = int(np.flatnonzero(modes == inner.predict(X.iloc[[i]])[0])[0])
            pending.append(bool(violates[i, idx[i]]))
            if len(pending) > delay:
                tracker.update(pending.popleft())
    finally:
        if not fast:  # the served threshold back
            inner.set_risk_threshold(certified.threshold_)
    return modes[idx], at, tracker


@experimental_func
def adaptive_replay(scored: dict, test: pd.DataFrame, marks: pd.DataFrame | None = None,
                    step_size: float = STEP_SIZE, delay: int = 0, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per certified router, per router and family): the replay's figures beside the
    certified threshold's, over the held-out requests inside the training ranges."""
    rows, fam_rows = [], []
    fam = test["family"].astype(str).to_numpy()
    rng = np.random.default_rng(seed)
    for name, router in scored.items():
        parts = certified_parts(router)
        if parts is None or not all(hasattr(r.router_, "reference_only_below") for r in parts.values()):
            continue  # a certified mode classifier: no strict end that answers the reference
        adaptive, fixed = np.empty(len(test), dtype=object), np.empty(len(test), dtype=object)
        ends, trackers, streams = {}, [], []  # streams: (decisions, violations) per deployment
        for key, r in parts.items():
            mask = np.ones(len(test), bool) if key is None else fam == key
            if not mask.any():
                continue
            X = test[mask]
            order = rng.permutation(len(X))
            violates = violation_matrix(X, list(r.router_.modes_))
            picks, _, tracker = replay_stream(r, X, violates, order, float(r.target_violation_rate), step_size, delay)
            picked = pd.Index(r.router_.modes_).get_indexer(picks)
            streams.append((len(X), int(violates[np.arange(len(X)), picked].sum())))
            adaptive[mask] = picks
            certified_at = r.router_.strictest_threshold if r.threshold_ is None else r.threshold_
            fixed[mask] = picks_at(r, X, [certified_at])[0]
            ends[key] = tracker.threshold
            trackers.append(tracker)
        done = np.array([p is not None for p in adaptive])
        if not done.any():
            continue
        sub = test[done]
        a = inside_ranges(score_requests(sub, adaptive[done], router=name), marks)
        f = inside_ranges(score_requests(sub, fixed[done], router=name), marks)
        cap_a, viol_a = capture_and_violations(a)
        cap_f, viol_f = capture_and_violations(f)
        per_fam_a = a.groupby("family")["violates_any"].mean()
        per_fam_f = f.groupby("family")["violates_any"].mean()
        target = float(next(iter(parts.values())).target_violation_rate)
        decision = "ensemble" if any(getattr(r, "served_tree_", None) is not None for r in parts.values()) \
            else "served"
        rows.append({"router": name, "target": target, "step_size": step_size, "delay": delay,
                     "requests": len(a), "capture": cap_a, "violations": viol_a,
                     "worst_family_violations": float(per_fam_a.max()) if len(per_fam_a) else np.nan,
                     "certified_capture": cap_f, "certified_violations": viol_f,
                     # what the bound covers: every decision of each stream, extrapolated rows too
                     "stream_requests": int(sum(n for n, _ in streams)),
                     "stream_violations": float(sum(v for _, v in streams)) / max(1, sum(n for n, _ in streams)),
                     "worst_stream_violations": max(v / n for n, v in streams),
                     "slack": max(t.slack(n, delay) for t, (n, _) in zip(trackers, streams)),
                     "deployments": len(trackers), "decision": decision})
        for family, g in a.groupby("family"):
            key = family if family in ends else None
            fam_rows.append({"router": name, "family": family, "requests": len(g),
                             "violations": float(g["violates_any"].mean()),
                             "certified_violations": float(per_fam_f.get(family, np.nan)),
                             "capture": capture_and_violations(g)[0],
                             "certified_capture": capture_and_violations(f[f["family"] == family])[0],
                             "end_threshold": ends.get(key, np.nan)})
    return pd.DataFrame(rows), pd.DataFrame(fam_rows)


def summary_line(r) -> str:
    """One router's replay (a row of :func:`adaptive_replay`'s first table) as a sentence,
    for the score report and the study's."""
    return (f"adapted {r.capture:.1%} of the oracle's saving at {r.violations:.1%} violations (worst family "
            f"{r.worst_family_violations:.1%}; certified {r.certified_capture:.1%} at "
            f"{r.certified_violations:.1%}); every decision of the streams {r.stream_violations:.1%} of "
            f"{r.stream_requests}, worst stream {r.worst_stream_violations:.1%} (bound: target {r.target:.0%} "
            f"+ slack {r.slack:.1%})")
