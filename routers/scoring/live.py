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
token vs the reference's, ROUGE-L of the output vs the reference output, and the
quality / energy violations those imply under the table's constraints. Memory is
not scored live (one process holds every engine at once, so a per-mode peak is
not observable); the offline table has it.

Profile-estimate error: for every (request, mode) run, the table's latency
(measured or interpolated from profiles) against the live one, as absolute %
error, so users see how far the oracle's estimates can be trusted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from dataset.errors import InputError
from dataset.requests import Request
from engine.modes import reference_mode


def stratified(requests: list[Request], n: int, seed: int = 0) -> list[Request]:
    """Up to ``n`` requests, round-robin across families so every family appears."""
    rng = np.random.default_rng(seed)
    by_fam: dict[str, list[Request]] = {}
    for r in requests:
        by_fam.setdefault(r.family or "none", []).append(r)
    for v in by_fam.values():
        rng.shuffle(v)
    out, i = [], 0
    while len(out) < n and any(i < len(v) for v in by_fam.values()):
        for fam in sorted(by_fam):
            if i < len(by_fam[fam]) and len(out) < n:
                out.append(by_fam[fam][i])
        i += 1
    return out


def _group(req: Request) -> list[Request]:
    c = max(1, int(req.concurrent_requests))
    return [req] + [dataclasses.replace(req, id=f"{req.id}~{k}") for k in range(1, c)]


def run_live(stream: list[Request], decisions: dict[str, list[str]], model_path, draft_path=None,
             device: str = "cpu", reference: str | None = None, progress=None,
             watts_per_core: float = 4.0, backend: str = "transformers") -> pd.DataFrame:
    """Run each request in the reference mode and every chosen mode on ``backend`` (any
    registered one); one row per (request, mode)."""
    from engine.backends.base import EngineSettings
    from engine.backends.registry import get_backend
    from engine.energy import make_meter
    from engine.prompts import PromptBuilder
    from engine.quality import rouge_l

    be = get_backend(backend)
    settings = EngineSettings(str(model_path), str(draft_path) if draft_path else None, device)
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
        builder = PromptBuilder(engines[reference].tokenizer)
        meter = make_meter(device, watts_per_core=watts_per_core, include_children=be.child_processes)
        rows = []
        for i, req in enumerate(stream):
            group = [builder.prepare(r) for r in _group(req)]
            prime = [builder.prepare(dataclasses.replace(req, id=f"{req.id}-prime"))] \
                if req.shared_prefix_tokens else []
            modes = [reference] + sorted({d[i] for d in decisions.values()} - {reference})
            ref_text = None
            for m in modes:
                if progress:
                    progress(f"live: request {i + 1}/{len(stream)} ({req.family}) on {m}")
                eng = engines[m]
                ignore_eos = not req.benchmark_suite
                if prime:
                    eng.run(prime, ignore_eos=ignore_eos)
                meter.start()
                gens = eng.run(group, ignore_eos=ignore_eos)
                energy = meter.stop()
                text = "\n".join(g.text for g in gens)
                if m == reference:
                    ref_text = text
                tokens = sum(g.output_tokens for g in gens)
                rows.append({
                    "request_id": req.id, "family": req.family, "mode": m,
                    "latency_ms": max(g.latency_ms for g in gens),
                    "ttft_ms": float(np.nanmean([g.ttft_ms for g in gens])),
                    "output_tokens": tokens, "energy_j": energy.joules,
                    "energy_per_token_j": energy.joules / tokens if tokens else np.nan,
                    "energy_source": energy.source,
                    "rouge_l_vs_baseline": rouge_l(text, ref_text) if ref_text is not None else np.nan,
                })
        return pd.DataFrame(rows)
    finally:
        for e in engines.values():
            e.close()


def score_live(runs: pd.DataFrame, stream: list[Request], decisions: dict[str, list[str]],
               overhead_us: dict[str, float], constraints, table: pd.DataFrame | None = None,
               reference: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per-request live scores per router, per (request, mode) estimate errors, summary figures)."""
    reference = reference or reference_mode().name
    idx = runs.set_index(["request_id", "mode"])
    rows = []
    for name, picks in decisions.items():
        oh = float(overhead_us.get(name, 0.0))
        for req, pick in zip(stream, picks):
            got, ref = idx.loc[(req.id, pick)], idx.loc[(req.id, reference)]
            e_ratio = got["energy_per_token_j"] / ref["energy_per_token_j"]
            rouge = got["rouge_l_vs_baseline"]
            rows.append({
                "router": name, "request_id": req.id, "family": req.family, "pick": pick,
                "overhead_us": oh, "latency_ms": got["latency_ms"],
                "effective_latency_ms": got["latency_ms"] + oh / 1000,
                "reference_latency_ms": ref["latency_ms"],
                "speedup": ref["latency_ms"] / (got["latency_ms"] + oh / 1000),
                "energy_ratio": e_ratio, "rouge_delta": rouge - 1.0,
                "violates_quality": bool(rouge < constraints.min_rouge_vs_baseline - 1e-9),
                "violates_energy": bool(e_ratio > constraints.max_energy_ratio + 1e-9),
            })
    per = pd.DataFrame(rows)
    est = None
    if table is not None:
        t = table.set_index("request_id")
        e = runs.copy()
        e["estimated_latency_ms"] = [
            t.at[r, f"latency_ms__{m}"] if f"latency_ms__{m}" in t.columns and r in t.index else np.nan
            for r, m in zip(e["request_id"], e["mode"])]
        e["abs_pct_error"] = (e["estimated_latency_ms"] - e["latency_ms"]).abs() / e["latency_ms"] * 100
        est = e
    summary = {"estimate_mape_pct": float(est["abs_pct_error"].mean()) if est is not None else np.nan}
    return per, est, summary


def summarise_live(per: pd.DataFrame) -> pd.DataFrame:
    """Per router, equal family weights: speedup (ratio of summed latencies), energy,
    quality, violation rates."""
    out = []
    for name, g in per.groupby("router", sort=False):
        fam = g.groupby("family").apply(lambda f: pd.Series({
            "speedup": f["reference_latency_ms"].sum() / f["effective_latency_ms"].sum(),
            "energy_ratio": f["energy_ratio"].mean(), "rouge_delta": f["rouge_delta"].mean(),
            "violation_rate_quality": f["violates_quality"].mean(),
            "violation_rate_energy": f["violates_energy"].mean()}), include_groups=False)
        out.append({"router": name, "requests": len(g), **fam.mean().to_dict()})
    return pd.DataFrame(out)
