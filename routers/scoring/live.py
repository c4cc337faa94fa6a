"""Live scoring: a held-out request stream run through the real engine per router.

Each router picks a mode for every request of the stream (its serving decision
path: compiled by default). The engines of all chosen modes, and the reference,
are loaded once and kept loaded; each request is then run in the reference mode
and in every mode some router chose for it, back to back (interleaved, so machine
drift hits every mode alike). Routers that chose the same mode for a request share
that measurement: they would have run the same computation.

A request with ``concurrent_requests = c`` runs as a group of c requests that
arrive together (latency to the last completion, energy per output token over the
group), like the profiler's batch units; a request with a shared prefix is primed
first with a sibling sharing that prefix (untimed), like the profiler.

Per router and request: live latency (+ its measured routing overhead), energy per
token vs the reference's, ROUGE-L of the output vs the reference output, benchmark
accuracy where the request has a gold answer, and the quality / energy violations
those imply under the table's constraints. Quality is judged as the oracle judges it
(:mod:`modeswitch.oracle.family_rule`): under the study's rule (``quality_scope="family"``) a
router's picks of one mode in one family violate it together when their mean ROUGE-L
is below the threshold or their mean accuracy drops by more than the limit
(``violates_quality``); the per-request view is ``diverges`` (this request's own
ROUGE-L below the threshold), reported as the divergence rate, never as a violation.
A lossless mode's divergence is the reference's floor (``lossless_at_floor``). Memory is
not scored live (one process holds every engine at once, so a per-mode peak is
not observable); the offline table has it.

Profile-estimate error: for every (request, mode) run, the table's latency
(measured or interpolated from profiles) against the live one, as absolute %
error, so users see how far the oracle's estimates can be trusted.

Trials and intervals: every request runs ``trials`` times in every mode it needs,
trial-major and mode-interleaved (trial t of all modes back to back), under the
profiler's measurement hygiene: the profile's thread count (``threads``; two torch
threads on a 2-core machine slow manyfold whenever anything else takes a core),
each trial's CPU share and the machine's other load recorded, trials flagged by the
profiler's :class:`modeswitch.engine.noise.ContentionRule` measured again after the sweep (up
to ``max_remeasure`` more attempts). Per (request, mode) the median of its clean trials counts
(of all, where none is clean); the energy ratio carries its paired
bootstrap interval over trials. Aggregates carry 95 % bootstrap intervals over
requests, resampled within each family (the family-weighted figures stay family
weighted in every resample). A live violation has a cause:

* ``within_noise``: the energy ratio's interval reaches the limit (not beyond noise);
* ``known_unsafe``: the table already marked the pick unsafe for this request;
* ``measurement_wrong``: the table called it safe from this request's own measurement;
* ``other_hardware``: the same, but the table was measured on another kind of machine
  (``modeswitch.engine.hardware.same_kind``): CPU kernels chosen by instruction set sum in other
  orders, and a greedy answer can change, the reference's included;
* ``estimate_wrong``: the table called it safe from an estimate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.dataset.benchmarks import score_answer
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads.conditions import arrival_group, primer
from modeswitch.engine import prompts
from modeswitch.engine.backends import registry
from modeswitch.engine.backends.base import EngineSettings, context_for, start_unit
from modeswitch.engine.energy import cpu_seconds_clock, make_meter
from modeswitch.engine.modes import reference_mode
from modeswitch.engine.noise import TrialClock, clean_trials, flag_contended, unresolved_trials
from modeswitch.engine.quality import rouge_l
from modeswitch.oracle.family_rule import lossless
from modeswitch.oracle.uncertainty import paired_ratio
from modeswitch.routers.scoring.intervals import (
    Parts,
    family_bootstrap,
    family_weighted,
    mean_parts,
    ratio_parts,
)


def stratified(requests: list[Request], n: int, seed: int = 0,
               prefer: set[str] | None = None) -> list[Request]:
    """Up to ``n`` requests, round-robin across families so every family appears; within
    a family the ``prefer``red ids come first (the held-out requests the profile measured:
    there the table's latency is a measurement of the same request, so comparing it with
    the live run tests the measuring conditions, not the estimator)."""
    rng = np.random.default_rng(seed)
    prefer = prefer or set()
    by_fam: dict[str, list[Request]] = {}
    for r in requests:
        by_fam.setdefault(r.family or "none", []).append(r)
    for fam, v in by_fam.items():
        rng.shuffle(v)
        by_fam[fam] = [r for r in v if r.id in prefer] + [r for r in v if r.id not in prefer]
    out, i = [], 0
    while len(out) < n and any(i < len(v) for v in by_fam.values()):
        for fam in sorted(by_fam):
            if i < len(by_fam[fam]) and len(out) < n:
                out.append(by_fam[fam][i])
        i += 1
    return out


def run_live(stream: list[Request], decisions: dict[str, list[str]], model_path, draft_path=None,
             device: str = "cpu", reference: str | None = None, progress=None,
             watts_per_core: float = 4.0, backend: str = "transformers",
             trials: int = 1, threads: int | None = None, max_remeasure: int = 2,
             replay: dict | None = None, checkpoints: dict | None = None) -> pd.DataFrame:
    """Run each request ``trials`` times in the reference mode and every chosen mode on
    ``backend`` (any registered one); one row per (request, mode, trial, attempt), with
    the trial's CPU share, the machine's other load and the contention flag.

    ``threads``: the engines' compute threads (``EngineSettings.threads``), which
    should be the profile's, so live and table measure the same thing. After the
    sweep, each trial with no attempt clean by :class:`modeswitch.engine.noise.ContentionRule`
    is measured again, in stream order, up to ``max_remeasure`` more times, as the
    profiler does.

    ``checkpoints``: the weights per format the engines load (``EngineSettings.checkpoints``),
    which should be the profile's.

    ``replay``: request id -> (the requests, the primers) the profiler ran for that
    unit (:func:`modeswitch.engine.profiler.plan.profiled_units`). A table row holds the unit's measured shape (prompt
    lengths as the template made them, averaged over a group), not the budgets the
    prompts were built from, and rebuilt from it the prompts differ; a profiled
    request is run as the profiler ran it where its plan is given."""
    if trials < 1:
        raise ValueError(f"live trials {trials}: at least 1")
    ids = [r.id for r in stream]
    if len(set(ids)) != len(ids):
        raise InputError("the live stream repeats request ids: " + ", ".join(sorted({i for i in ids if ids.count(i) > 1})))
    be = registry.get_backend(backend)
    settings = EngineSettings(str(model_path), str(draft_path) if draft_path else None, device,
                              threads=int(threads) if threads else None, checkpoints=dict(checkpoints or {}),
                              max_context=context_for(stream))
    reference = reference or reference_mode().name
    needed = [reference] + sorted({m for picks in decisions.values() for m in picks} - {reference})
    _, _, skipped = be.plan(settings, needed)
    if skipped:
        raise InputError("live scoring needs modes this engine cannot run: " + "; ".join(
            f"{m} ({why})" for m, why in skipped.items()))
    engines = {}
    try:
        for m in needed:
            if progress:
                progress(f"live: loading {m}")
            engines[m] = be.load(m, settings)
        builder = prompts.PromptBuilder(engines[reference].tokenizer)
        meter = make_meter(device, watts_per_core=watts_per_core, include_children=be.child_processes)
        clock = _trial_clock(be.child_processes)
        plans = []  # per request: what each of its runs needs

        def measure(k: int, m: str, t: int, attempt: int) -> dict:
            req, group, prime, ignore_eos = plans[k]
            if progress:
                again = f", again ({attempt})" if attempt else ""
                progress(f"live: request {k + 1}/{len(stream)} ({req.family}) on {m}, "
                         f"trial {t + 1}/{trials}{again}")
            gens, energy, c = _measure(engines[m], group, prime, ignore_eos, meter, clock)
            tokens = sum(g.output_tokens for g in gens)
            acc = [score_answer(g.text, r.reference, r.evaluation_mode) for g, (r, _) in zip(gens, group)]
            acc = [a for a in acc if a is not None]
            return {
                "request_id": req.id, "family": req.family, "mode": m, "trial": t, "attempt": attempt,
                "latency_ms": max(g.latency_ms for g in gens),
                "ttft_ms": float(np.nanmean([g.ttft_ms for g in gens])),
                "output_tokens": tokens, "energy_j": energy.joules,
                "energy_per_token_j": energy.joules / tokens if tokens else np.nan,
                "energy_source": energy.source, "cpu_share": c.share, "other_load": c.other_load,
                "accuracy": float(np.mean(acc)) if acc else np.nan,
                "text": "\n".join(g.text for g in gens),
            }

        rows = []
        for i, req in enumerate(stream):
            # the group and primer the profiler measured for this row (dataset's one recipe)
            if replay and req.id in replay:
                members, primers = replay[req.id]
            else:
                p = primer(req)
                members, primers = arrival_group(req), ([p] if p else [])
            group = [builder.prepare(r) for r in members]
            prime = [builder.prepare(p) for p in primers]
            # ends at the model's end of answer for real text, as the profiler does
            plans.append((req, group, prime, not any(r.benchmark_suite or r.evaluation_mode for r, _ in group)))
            modes = [reference] + sorted({d[i] for d in decisions.values()} - {reference})
            rows += [measure(i, m, t, 0) for t in range(trials) for m in modes]
        # as the profiler does: after the sweep, each trial none of whose attempts is clean
        # is measured again (interleaved), until clean or max_remeasure more attempts
        index = {r.id: k for k, r in enumerate(stream)}
        for _ in range(max_remeasure):
            df = pd.DataFrame(rows)
            # each (request, mode) against its own largest CPU share: a clean share below
            # the thread count (an engine that never keeps two threads busy) is no contention
            df["contended"] = flag_contended(df)
            again = unresolved_trials(df)
            if again.empty:
                break
            rows += [measure(index[b.request_id], b.mode, int(b.trial), int(b.attempts))
                     for b in again.itertuples()]
        df = pd.DataFrame(rows)
        df["contended"] = flag_contended(df)
        ref_text = df[(df["mode"] == reference) & (df["trial"] == 0) & (df["attempt"] == 0)] \
            .set_index("request_id")["text"]
        df["rouge_l_vs_baseline"] = [rouge_l(text, ref_text[rid]) for text, rid in zip(df["text"], df["request_id"])]
        return df.drop(columns="text")
    finally:
        for e in engines.values():
            e.close()


def _trial_clock(include_children: bool):
    """A :class:`modeswitch.engine.noise.TrialClock` factory with the profiler's CPU clock (this
    process's, or its process tree's where the engine computes in children)."""
    cpu = cpu_seconds_clock(include_children)
    return lambda: TrialClock(cpu)


def _measure(engine, group, prime, ignore_eos: bool, meter, clock):
    """One timed run of ``group`` (after its untimed prime): (generations, energy, clock)."""
    start_unit(engine, prime, ignore_eos)
    meter.start()
    with clock() as c:
        gens = engine.run(group, ignore_eos=ignore_eos)
    return gens, meter.stop(), c


CAUSES = ("within_noise", "known_unsafe", "measurement_wrong", "other_hardware", "estimate_wrong")


def _collapse(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per (request, mode): the median over its clean trials (all of them where none is
    clean; ROUGE-L too: each run's own text against the reference's first), and the
    per-trial latency and energy, for paired intervals."""
    r = clean_trials(runs.copy()) if "contended" in runs else runs.copy()
    if "trial" not in r:
        r["trial"] = 0
    if "attempt" in r:  # a trial re-measured: its last (clean, where one is) attempt stands for it
        r = r.sort_values("attempt", kind="stable").drop_duplicates(["request_id", "mode", "trial"], keep="last")
    if "accuracy" not in r:
        r["accuracy"] = np.nan
    med = r.groupby(["request_id", "mode"]).agg(
        latency_ms=("latency_ms", "median"), energy_per_token_j=("energy_per_token_j", "median"),
        rouge_l_vs_baseline=("rouge_l_vs_baseline", "median"), accuracy=("accuracy", "median"),
        trials=("trial", "size"))
    per_trial = {k: g.set_index("trial")[["latency_ms", "energy_per_token_j"]]
                 for k, g in r.groupby(["request_id", "mode"])}
    return med, per_trial


def _cause(violates: bool, within_noise: bool, table_row, pick: str, other_hardware: bool = False) -> str:
    if not violates:
        return ""
    if within_noise:
        return "within_noise"
    if table_row is None:
        return "estimate_wrong"
    safe = table_row.get(f"safe__{pick}")
    if safe is not None and safe == safe and not bool(safe):
        return "known_unsafe"
    if table_row.get("label_source") != "measured":
        return "estimate_wrong"
    return "other_hardware" if other_hardware else "measurement_wrong"


def score_live(runs: pd.DataFrame, stream: list[Request], decisions: dict[str, list[str]],
               overhead_us: dict[str, float], constraints, table: pd.DataFrame | None = None,
               reference: str | None = None, other_hardware: bool = False
               ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per-request live scores per router, per (request, mode) estimate errors, summary
    figures). ``other_hardware``: the table was measured on another kind of machine than
    the live runs (a measured label's violation is then counted as ``other_hardware``)."""
    reference = reference or reference_mode().name
    idx, per_trial = _collapse(runs)
    trows = table.set_index("request_id") if table is not None else None
    limit = constraints.max_energy_ratio
    rows = []
    for name, picks in decisions.items():
        oh = float(overhead_us.get(name, 0.0))
        for req, pick in zip(stream, picks):
            got, ref = idx.loc[(req.id, pick)], idx.loc[(req.id, reference)]
            e_ratio = got["energy_per_token_j"] / ref["energy_per_token_j"]
            rouge = got["rouge_l_vs_baseline"]
            a, b = per_trial[(req.id, pick)], per_trial[(req.id, reference)]
            common = a.index.intersection(b.index)
            ci = paired_ratio(a.loc[common, "energy_per_token_j"], b.loc[common, "energy_per_token_j"])
            e_lo, e_hi = (ci.low, ci.high) if len(common) >= 2 else (e_ratio, e_ratio)
            v_e = bool(e_ratio > limit + 1e-9)
            noise_e = v_e and e_lo <= limit + 1e-9
            trow = trows.loc[req.id].to_dict() if trows is not None and req.id in trows.index else None
            rows.append({
                "router": name, "request_id": req.id, "family": req.family, "pick": pick,
                "overhead_us": oh, "latency_ms": got["latency_ms"], "trials": int(got["trials"]),
                "effective_latency_ms": got["latency_ms"] + oh / 1000,
                "reference_latency_ms": ref["latency_ms"],
                "speedup": ref["latency_ms"] / (got["latency_ms"] + oh / 1000),
                "energy_ratio": e_ratio, "energy_ratio_low": e_lo, "energy_ratio_high": e_hi,
                "rouge_l_vs_baseline": rouge, "rouge_delta": rouge - 1.0,
                "accuracy_delta_pp": (got["accuracy"] - ref["accuracy"]) * 100,
                "is_reference_pick": pick == reference,
                "violates_energy": v_e, "energy_within_noise": noise_e,
                "cause_energy": _cause(v_e, noise_e, trow, pick, other_hardware), "_trow": trow,
            })
    per = _judge_quality(pd.DataFrame(rows), constraints, other_hardware)
    est = None
    if table is not None:
        t = table.set_index("request_id")
        e = idx.reset_index()
        e["family"] = e["request_id"].map({r.id: r.family for r in stream})
        e["estimated_latency_ms"] = [
            t.at[r, f"latency_ms__{m}"] if f"latency_ms__{m}" in t.columns and r in t.index else np.nan
            for r, m in zip(e["request_id"], e["mode"])]
        e["label_source"] = e["request_id"].map(t["label_source"]) if "label_source" in t else "unknown"
        e["signed_pct_error"] = (e["estimated_latency_ms"] - e["latency_ms"]) / e["latency_ms"] * 100
        e["abs_pct_error"] = e["signed_pct_error"].abs()
        est = e
    summary = {"estimate_mape_pct": float(est["abs_pct_error"].mean()) if est is not None else np.nan}
    if est is not None:
        summary.update(estimate_error_by_source(est))
    if "contended" in runs and "attempt" in runs:
        first = runs[runs["attempt"] == 0]
        n = first.groupby(["request_id", "mode", "trial"]).ngroups
        # trials contended at their first attempt, and those with no clean attempt at the end
        summary["contended_trials_pct"] = len(unresolved_trials(first)) / n * 100 if n else np.nan
        summary["contended_after_remeasure_pct"] = len(unresolved_trials(runs)) / n * 100 if n else np.nan
        summary["remeasured_runs"] = int((runs["attempt"] > 0).sum())
    return per, est, summary


def _judge_quality(per: pd.DataFrame, constraints, other_hardware: bool = False) -> pd.DataFrame:
    """The quality verdicts, as the oracle gives them (:mod:`modeswitch.oracle.family_rule`): per
    request ``diverges`` (its own ROUGE-L below the threshold); ``violates_quality`` under
    the table's ``quality_scope``: ``family`` judges each router's picks of one mode in one
    family on their mean ROUGE-L and mean accuracy change, ``request`` each on its own.
    A lossless pick's divergence is the floor where ``lossless_at_floor``. Then the
    combined flags and each violation's cause."""
    if per.empty:
        return per
    c, eps = constraints, 1e-9
    scope = getattr(c, "quality_scope", "request")
    floor = per["pick"].map(lossless) if getattr(c, "lossless_at_floor", False) else False
    per["diverges"] = (per["rouge_l_vs_baseline"] < c.min_rouge_vs_baseline - eps) & ~per["is_reference_pick"]
    per["at_floor"] = floor & ~per["is_reference_pick"]
    rouge, acc = per["rouge_l_vs_baseline"], per["accuracy_delta_pp"]
    if scope == "family":
        g = per.groupby(["router", "family", "pick"], dropna=False)
        rouge, acc = g["rouge_l_vs_baseline"].transform("mean"), g["accuracy_delta_pp"].transform("mean")
    per["judged_rouge_l"], per["judged_accuracy_delta_pp"] = rouge, acc
    bad = (rouge < c.min_rouge_vs_baseline - eps) | (acc.fillna(0.0) < -c.max_accuracy_drop_pp - eps)
    per["violates_quality"] = bad & ~per["is_reference_pick"] & ~per["at_floor"]
    per["violates_any"] = per["violates_quality"] | per["violates_energy"]
    # beyond noise: what a rerun would show again
    per["violates_any_beyond_noise"] = per["violates_quality"] | (per["violates_energy"] & ~per["energy_within_noise"])
    per["cause"] = [_cause(bool(q), False, t, p, other_hardware) or e for q, t, p, e in
                    zip(per["violates_quality"], per["_trow"], per["pick"], per["cause_energy"])]
    return per.drop(columns=["_trow", "cause_energy", "energy_within_noise"])


def estimate_error_by_source(est: pd.DataFrame) -> dict:
    """The table's latency against live medians, apart for requests the profile measured
    (the same request measured twice: what differs is the measuring conditions) and
    requests whose latency the table estimated (what differs is also the estimator);
    mean absolute and median signed % error, and how many (request, mode) pairs."""
    out = {}
    for source in ("measured", "estimated"):
        part = est[(est["label_source"] == source) & est["abs_pct_error"].notna()]
        out[f"estimate_mape_pct_{source}"] = float(part["abs_pct_error"].mean()) if len(part) else np.nan
        out[f"estimate_median_signed_pct_{source}"] = (float(part["signed_pct_error"].median())
                                                       if len(part) else np.nan)
        out[f"estimate_pairs_{source}"] = int(len(part))
    return out


def _family_parts(g: pd.DataFrame) -> Parts:
    """A family's live figures as (numerator, denominator) columns
    (:mod:`modeswitch.routers.scoring.intervals`): the point estimate and its interval alike."""
    return {
        "speedup": ratio_parts(g["reference_latency_ms"], g["effective_latency_ms"]),
        "energy_ratio": mean_parts(g["energy_ratio"]), "rouge_delta": mean_parts(g["rouge_delta"]),
        "violation_rate_quality": mean_parts(g["violates_quality"]),
        "divergence_rate": mean_parts(g["diverges"]),
        "violation_rate_energy": mean_parts(g["violates_energy"]),
        "violation_rate_any": mean_parts(g["violates_any"]),
        "violation_rate_beyond_noise": mean_parts(g["violates_any_beyond_noise"]),
    }


INTERVAL_FIGURES = ("speedup", "energy_ratio", "violation_rate_any", "violation_rate_beyond_noise")


def summarise_live(per: pd.DataFrame, by_family: bool = False, n_boot: int = 1000,
                   seed: int = 0) -> pd.DataFrame:
    """Per router (and per family with ``by_family``), family weighted: speedup (ratio of
    summed latencies), energy, quality, violation rates (all, and beyond noise), the
    violations by cause, and 95 % bootstrap intervals (``*_low``/``*_high``) over
    requests resampled within each family."""
    keys = ["router", "family"] if by_family else ["router"]
    out = []
    for key, g in per.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        rec = dict(zip(keys, key))
        rec["requests"] = len(g)
        rec.update(family_weighted(g, _family_parts))
        rec.update(family_bootstrap(g, _family_parts, INTERVAL_FIGURES, n_boot, seed))
        for c in CAUSES:
            rec[f"violations_{c}"] = int((g["cause"] == c).sum())
        # a count beside the family-weighted rate: the exact binomial bound needs one
        rec["violations_beyond_noise"] = int(g["violates_any_beyond_noise"].sum())
        out.append(rec)
    return pd.DataFrame(out)
