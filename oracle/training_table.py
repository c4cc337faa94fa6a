"""The per-request training table: features, the oracle's label, and every mode's
estimated cost, so training and scoring can compute regret for any pick.

One row per request. Columns: the request's fields and features (sets A and B),
``label`` / ``label_source`` / ``estimate_basis`` / ``latency_basis`` /
``quality_basis`` (``measured (sweep)``, ``measured (profile)`` or ``estimated``:
:mod:`modeswitch.oracle.sweep_quality`), and for every mode ``m``:
``latency_ms__m``, ``energy_ratio__m``, ``memory_ratio__m``, ``rouge_l_vs_baseline__m``,
``accuracy_delta_pp__m`` (benchmark requests),
``safe__m`` and ``violates_{quality,energy,memory}__m``; with a per-request
quality-risk model (:mod:`modeswitch.oracle.quality_risk`), ``quality_risk__m`` (P(fail) where
it judged the request, NaN elsewhere). The table's provenance
(constraints, profile content hash) is kept in ``DataFrame.attrs``, which parquet
preserves.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd

from modeswitch.dataset.confidence_features import CONFIDENCE_FEATURES
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import features_frame
from modeswitch.dataset.requests import Request, requests_frame
from modeswitch.engine.prompt_confidence import prompt_confidence
from modeswitch.oracle import sweep_quality
from modeswitch.oracle.cells import request_rows, summarise
from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.content_columns import TOKEN_IDS, content_columns
from modeswitch.oracle.label import label_requests

#: request features a quality sweep does not vary (it runs requests batched, untimed)
UNSWEPT_CONDITIONS = ("concurrent_requests", "memory_pressure")
PER_MODE = ("latency_ms", "energy_ratio", "memory_ratio", "rouge_l_vs_baseline", "accuracy_delta_pp")


def frame_hash(df: pd.DataFrame) -> str:
    df = df.reset_index(drop=True)
    if TOKEN_IDS in df:  # a list per row: hashed as its text (pandas hashes scalars only)
        df = df.assign(**{TOKEN_IDS: df[TOKEN_IDS].map(lambda v: " ".join(map(str, v)))})
    h = pd.util.hash_pandas_object(df, index=False).values
    return hashlib.sha256(h.tobytes()).hexdigest()[:12]


def profiled_requests(profile: pd.DataFrame) -> list[Request]:
    """The profile's own measured requests (per-request units: a request, or a group
    arriving together, with its mean shape), as requests to put in a training table:
    their labels come from their own measurements (the median of their clean
    trials), marked ``measured``."""
    rows = request_rows(profile)
    if rows.empty:
        return []
    units = summarise(rows).units
    out = []
    for uid, u in units.iterrows():
        if not (np.isfinite(u["prompt_tokens"]) and np.isfinite(u["expected_output_tokens"])):
            continue
        suite = u["benchmark_suite"] if isinstance(u["benchmark_suite"], str) and u["benchmark_suite"] else None
        prompt = int(round(u["prompt_tokens"]))
        out.append(Request(
            id=str(uid), prompt_tokens=prompt,
            expected_output_tokens=max(1, int(round(u["expected_output_tokens"]))),
            shared_prefix_tokens=min(int(round(u["shared_prefix_tokens"] or 0)), prompt),
            concurrent_requests=max(1, int(round(u["concurrent_requests"] or 1))),
            memory_pressure=float(u["memory_pressure"] or 0.0),
            family=str(u["family"]), workload=str(u["workload"]), benchmark_suite=suite,
            evaluation_mode=u["evaluation_mode"] if isinstance(u["evaluation_mode"], str) else None))
    return out


def build_training_table(profile: pd.DataFrame, requests: list[Request],
                         constraints: Constraints | None = None, source=None,
                         costmodel=None, quality: pd.DataFrame | None = None,
                         content_model: str | None = None, confidence: bool = False,
                         device: str = "cpu", threads: int | None = None,
                         built_from: dict[str, Request] | None = None) -> pd.DataFrame:
    """One row per labelled request: its features, the oracle's label and every mode's
    costs and safety. ``content_model``: a checkpoint folder whose prompts and content
    features (:mod:`modeswitch.oracle.content_columns`) the table also takes, for routers that read
    the prompt (feature set C); None: shape only. ``confidence``: also the reference
    model's confidence at each prompt's end (:mod:`modeswitch.dataset.confidence_features`, one
    prefill of ``content_model`` per prompt on ``device`` with ``threads``), which the
    quality-risk model reads. ``built_from``: request id -> the request its prompt was
    built from (a profiled request: its unit's first member in the profile's plan,
    :func:`modeswitch.engine.profiler.plan.profiled_units`), for the content columns."""
    constraints = constraints or Constraints()
    reqs_df = requests_frame(requests)
    built_from = {k: v for k, v in (built_from or {}).items() if k in {r.id for r in requests}}
    content = None if content_model is None else content_columns(requests, content_model, built_from)
    prefill = None
    if confidence:
        if content is None:
            raise InputError("confidence features read each prompt's token ids through the reference "
                             "model: give content_model (--content-model)")
        conf = prompt_confidence(str(content_model), dict(zip(content.index, content[TOKEN_IDS])),
                                 device=device, threads=threads)
        content = content.join(conf[list(CONFIDENCE_FEATURES)])
        prefill = conf["prefill_ms"]
    # what the per-request quality-risk model reads (oracle.quality_risk): the prompt's and
    # the answer's shape (not the conditions, which a batched, untimed sweep never varied),
    # and the prompt's content and the reference's confidence where the table takes them
    risk_features = features_frame(requests, "A", with_context=False).drop(columns=list(UNSWEPT_CONDITIONS))
    if content is not None:
        risk_features = risk_features.join(content.drop(columns=TOKEN_IDS))
    labels, cand, skipped = label_requests(profile, reqs_df, constraints, source=source,
                                           costmodel=costmodel, quality=quality,
                                           risk_features=risk_features)
    cand = cand.copy()
    cand["violates_quality"] = cand[[c for c in cand.columns if c.startswith("violates_quality_")]].any(axis=1)
    wide = {}
    # ``diverges``: the request's own output below the ROUGE-L threshold (the per-request
    # view, reported as a rate; the quality verdict is ``violates_quality``)
    risk = (sweep_quality.RISK,) if sweep_quality.RISK in cand else ()
    for col in PER_MODE + risk + ("safe", "violates_quality", "violates_energy", "violates_memory", "diverges"):
        piv = cand.pivot(index="unit", columns="mode", values=col)
        for mode in piv.columns:
            wide[f"{col}__{mode}"] = piv[mode]
    wide = pd.DataFrame(wide)
    feats = features_frame([r for r in requests if r.id in labels.index], "B", with_context=True)
    table = feats.join(labels[["label", "label_source", "estimate_basis", "latency_basis",
                               "quality_basis", "reference_mode", "condition"]])
    table = table.join(wide)
    if content is not None:
        table = table.join(content)
    table.index.name = "request_id"
    table = table.reset_index()
    modes = sorted(cand["mode"].unique())
    table.attrs["modeswitch"] = json.dumps({
        "modes": modes,
        "constraints": constraints.to_dict(),
        "profile_hash": frame_hash(profile),
        "profile_source": None if source is None else str(source),
        "backends": sorted(profile["backend"].dropna().astype(str).unique().tolist())
        if "backend" in profile else [],
        "skipped": skipped,
        "label_sources": {str(k): int(v) for k, v in table["label_source"].value_counts().items()},
        "quality_sources": {str(k): int(v) for k, v in table["quality_basis"].value_counts().items()},
        # the engines' compute threads the profile measured with (a live check must match)
        "threads": sorted({int(x) for x in profile["threads"].dropna().unique()})
        if "threads" in profile else [],
        # what the profile ran on (a live check on another kind of machine may see other
        # outputs: engine.hardware)
        "hardware": sorted(profile["hardware"].dropna().astype(str).unique().tolist())
        if "hardware" in profile else [],
        "content_model": None if content_model is None else str(content_model),
        # requests whose prompt was rebuilt from the profile's plan (the profiled units'
        # own requests), not from their rows
        "prompts_from_plan": len(built_from) if content is not None else 0,
        # what reading the reference's confidence cost: one prefill per prompt
        "confidence": None if prefill is None else {
            "prefill_ms_p50": float(prefill.median()), "prefill_ms_p90": float(prefill.quantile(0.9)),
            "prompts": int(len(prefill))},
        # the per-request quality-risk model that judged unswept requests, and how it validated
        "quality_risk": labels.attrs.get("quality_risk"),
        # per mode, how far an estimated request's ratios are widened (oracle.estimate_error)
        "estimate_error": labels.attrs.get("estimate_error"),
        "costmodel": None if costmodel is None else {
            "backend": costmodel.backend,
            "preferred": sorted({f"{m}:{k}" for (m, _, k) in costmodel.groups
                                 if costmodel.prefers(m, k)})},
    })
    return table


def table_meta(table: pd.DataFrame) -> dict:
    raw = table.attrs.get("modeswitch")
    if not raw:
        raise InputError("not a training table built by `modeswitch dataset build` (no metadata)")
    return json.loads(raw)
