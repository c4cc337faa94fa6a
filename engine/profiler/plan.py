"""What a profile measures: the :class:`ProfileSpec` (everything in it but ``quick``'s
expansion is the run's identity) and the units it expands to (one request, or a group
arriving together; per-request drawn conditions; benchmark prompts)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field

from modeswitch.dataset.benchmarks import read_benchmark
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.limits import count, finite, requests_fit
from modeswitch.dataset.prompt_corpus import in_draft_split
from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import get_workload
from modeswitch.dataset.workloads.conditions import (
    ConditionDraw,
    arrival_group,
    draw_units,
    primer,
    scaled,
)

DEFAULT_WORKLOADS = (
    "short_prompt_short_output", "short_prompt_long_output", "long_prompt_short_output",
    "long_prompt_long_output", "shared_prefix_chat", "memory_pressure_long_context",
    "batch_pressure",
)


@dataclass
class ProfileSpec:
    """What to measure. Everything here (but ``quick``'s expansion) enters the
    journal's identity, so a rerun with other settings cannot mix rows."""

    model: str
    draft_model: str | None = None
    backend: str = "transformers"
    device: str = "cpu"
    modes: list[str] | None = None
    workloads: list[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    requests: int = 3
    #: interleaved trials per (unit, mode); the oracle reads their median
    trials: int = 3
    #: how often a contended trial is measured again before its flag is kept
    max_remeasure: int = 2
    seed: int = 0
    benchmarks: list[str] = field(default_factory=list)
    benchmark_requests: int = 2
    batch_size: int | None = None
    watts_per_core: float = 4.0
    #: torch threads; None: chosen by a measurement at the start of the run
    threads: int | None = None
    #: keep every mode's engine loaded and measure each unit in all modes back to
    #: back (fair ratios on a noisy machine; needs memory for all engines at once)
    interleave: bool = False
    #: vLLM backend: pre-quantized checkpoints of the quantized modes (int8, gptq_4bit, awq_4bit)
    checkpoints: dict = field(default_factory=dict)
    #: per-request conditions (:class:`modeswitch.dataset.workloads.conditions.ConditionDraw` as a
    #: dict); None: every family's own fixed condition
    conditions: dict | None = None
    #: every family's prompt, output and prefix lengths times this
    length_scale: float = 1.0
    #: measure only the drawn units whose arrival group is at most this large (the others
    #: are drawn all the same, so the kept ones keep their ids); None: every unit
    max_concurrency: int | None = None

    def __post_init__(self):
        """Refuse counts and scales no run could use before anything is measured."""
        count("requests", self.requests)
        count("trials", self.trials)
        count("max_remeasure", self.max_remeasure, minimum=0)
        count("benchmark_requests", self.benchmark_requests, minimum=0)
        for name in ("batch_size", "threads", "max_concurrency"):
            if getattr(self, name) is not None:
                count(name, getattr(self, name))
        finite("length_scale", self.length_scale, positive=True)
        finite("watts_per_core", self.watts_per_core, minimum=0)
        requests_fit("requests", self.requests * max(1, len(self.workloads)))

    def identity(self) -> str:
        d = asdict(self)
        # fields added later enter the identity only when set, so journals written
        # before they existed still resume
        for key, default in (("conditions", None), ("length_scale", 1.0), ("max_concurrency", None)):
            if d[key] == default:
                del d[key]
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Unit:
    """What one profile row measures: one request, or a group arriving together."""

    id: str
    family: str
    requests: list[Request]
    #: untimed requests run first: the study times the follow-up to a request that
    #: shares its prefix ("prime, then follow"), so prefix caches are warm
    prime: list[Request] = field(default_factory=list)


def build_units(spec: ProfileSpec) -> list[Unit]:
    units = []
    for i, name in enumerate(spec.workloads):
        w = scaled(get_workload(name), spec.length_scale)
        if spec.conditions is not None:
            units += _drawn_units(spec, w, i)
        else:
            # stratified: the units span the family's spread (see WorkloadSpec.sample); a
            # family with company runs each request in its arrival group, a shared prefix
            # after its primer (the recipes live scoring replays: dataset.workloads.conditions)
            n_conc = spec.batch_size or w.concurrent_requests
            for r in w.sample(spec.requests, seed=spec.seed * 1000 + i, stratified=True):
                if n_conc > 1:
                    r = dataclasses.replace(r, concurrent_requests=n_conc)
                p = primer(r)
                units.append(Unit(r.id, name, arrival_group(r), prime=[p] if p else []))
    for path in spec.benchmarks:
        # the draft was distilled on the corpus's draft split: those prompts are no evaluation
        for r in read_benchmark(path, spec.benchmark_requests, seed=spec.seed, skip=in_draft_split):
            units.append(Unit(r.id, r.family, [r]))
    if spec.max_concurrency is not None:
        units = [u for u in units if len(u.requests) <= spec.max_concurrency]
    return units


def _drawn_units(spec: ProfileSpec, w, i: int) -> list[Unit]:
    """Units of family ``w`` under per-request drawn conditions: lengths stratified over
    the family's spread, each unit its own concurrency (a group of that many requests),
    shared prefix (primed first by an untimed request with the same prefix) and
    memory pressure."""
    draw = ConditionDraw.from_dict(spec.conditions)
    units = []
    for du in draw_units(w, spec.requests, draw, seed=spec.seed * 1000 + i, stratified=True):
        p = primer(du.request)
        units.append(Unit(du.request.id, w.name, du.group, prime=[p] if p else []))
    return units


def profiled_units(spec: dict | None) -> dict[str, tuple[list[Request], list[Request]]]:
    """Request id -> (requests, primers) of every unit the profile plan ``spec`` (a
    :class:`ProfileSpec` as a dict, as the profiler's journal records it) measures.

    Why: a profile row holds the unit's measured shape (the template's prompt lengths,
    averaged over its group), not the budgets its prompts were built from, so prompts
    rebuilt from the row are other text. What reads a measured request's prompt (the
    live check replaying it, the table's content features) takes it from here.
    Empty without a plan."""
    if not spec:
        return {}
    known = {f.name for f in dataclasses.fields(ProfileSpec)}  # a plan recorded by an older version
    plan = ProfileSpec(**{k: v for k, v in spec.items() if k in known})
    return {u.id: (list(u.requests), list(u.prime)) for u in build_units(plan)}


def check_plan(rows: list[Request], leads: dict[str, Request], where: str) -> None:
    """Refuse a plan of another profile: it would give the rows other requests' prompts.
    Each planned unit (``leads``: :func:`profiled_leads`) must be its row's family and
    arrival group size."""
    for req in rows:
        lead = leads.get(req.id)
        if lead is None:
            continue
        n, m = max(1, int(lead.concurrent_requests)), max(1, int(req.concurrent_requests))
        if lead.family != req.family or n != m:
            raise InputError(f"{where}: the profile plan's unit {req.id!r} ({lead.family}, {n} arriving "
                             f"together) is not the table's row ({req.family}, {m}): the plan is of "
                             "another profile")


def profiled_leads(spec: dict | None) -> dict[str, Request]:
    """Request id -> the request a profiled unit's prompt was built from (its group's
    lead, whose id the profile row carries): what the table's content columns read
    for a measured request (:func:`modeswitch.oracle.content_columns.prompt_ids`)."""
    return {uid: members[0] for uid, (members, _) in profiled_units(spec).items()}
