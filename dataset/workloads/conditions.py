"""Serving conditions drawn per request, across families.

Why: in the study (and in this project until now) every family had one fixed
condition: concurrency 8 in ``batch_pressure`` and 1 everywhere else, a shared
prefix only in the shared-prefix families, memory pressure only in its own family.
Inside a family the condition features were constant, so a router (and a cost
model) could only learn a family's name, never a condition's effect. A
:class:`ConditionDraw` gives every request its own concurrency, shared-prefix
length and memory pressure, drawn independently of its family's shape. A family
keeps its *defining* condition (``batch_pressure`` always has company,
``shared_prefix_chat`` always its prefix, the memory-pressure family always some
pressure); the other two are drawn.

The draw is data, not code: a frozen dataclass that a study TOML's
``[conditions]`` table fills (:meth:`ConditionDraw.from_dict`), and that enters a
profile's identity, so two runs with other draws never mix rows.

:func:`scaled` shrinks a family's lengths by one factor (the default embedded
model on two CPU cores cannot measure 2048-token prompts at 16 concurrent
requests within a study's hour; a researcher with a GPU keeps factor 1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import get_workload
from modeswitch.dataset.workloads.spec import WorkloadSpec


@dataclass(frozen=True)
class ConditionDraw:
    """How each request's condition is drawn.

    * ``concurrency``/``concurrency_weights``: requests in flight together (this one
      included) and their probabilities; a family whose own concurrency is above 1
      draws only from the levels above 1.
    * ``shared_prefix_rate``: the share of requests of prefix-free families that get
      a shared prefix, of ``shared_prefix_fraction`` (low, high) of the prompt,
      drawn uniformly; families with their own prefix keep it.
    * ``memory_pressure``/``memory_pressure_weights``: the levels and their
      probabilities (the memory-pressure family draws only from those above 0).
    """

    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    concurrency_weights: tuple[float, ...] = (0.6, 0.15, 0.1, 0.1, 0.05)
    shared_prefix_rate: float = 0.3
    shared_prefix_fraction: tuple[float, float] = (0.25, 0.75)
    memory_pressure: tuple[float, ...] = (0.0, 0.25, 0.5)
    memory_pressure_weights: tuple[float, ...] = (0.6, 0.2, 0.2)

    def __post_init__(self):
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("conditions.concurrency: levels must be integers >= 1")
        if len(self.concurrency_weights) != len(self.concurrency):
            raise ValueError(f"conditions.concurrency_weights: {len(self.concurrency_weights)} "
                             f"weights for {len(self.concurrency)} concurrency levels")
        if min(self.concurrency_weights) < 0 or sum(self.concurrency_weights) <= 0:
            raise ValueError("conditions.concurrency_weights: weights must be >= 0, not all 0")
        if not 0 <= self.shared_prefix_rate <= 1:
            raise ValueError("conditions.shared_prefix_rate: must lie in [0, 1]")
        lo, hi = self.shared_prefix_fraction
        if not 0 < lo <= hi < 1:
            raise ValueError("conditions.shared_prefix_fraction: need 0 < low <= high < 1")
        if not self.memory_pressure or not all(0 <= m < 1 for m in self.memory_pressure):
            raise ValueError("conditions.memory_pressure: levels must lie in [0, 1)")
        if (len(self.memory_pressure_weights) != len(self.memory_pressure)
                or min(self.memory_pressure_weights) < 0 or sum(self.memory_pressure_weights) <= 0):
            raise ValueError("conditions.memory_pressure_weights: one weight >= 0 per level, not all 0")

    @classmethod
    def from_dict(cls, d: dict) -> ConditionDraw:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"conditions: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def draw(self, family: WorkloadSpec, rng) -> tuple[int, float, float]:
        """(concurrency, shared-prefix fraction of the prompt (0: none), memory
        pressure) for one request of ``family``."""
        conc = _choose(rng, self.concurrency, self.concurrency_weights,
                       (lambda c: c > 1) if family.concurrent_requests > 1 else None,
                       family.concurrent_requests)
        frac = 0.0
        if not family.shared_prefix_tokens and rng.random() < self.shared_prefix_rate:
            frac = float(rng.uniform(*self.shared_prefix_fraction))
        mp = _choose(rng, self.memory_pressure, self.memory_pressure_weights,
                     (lambda m: m > 0) if family.memory_pressure > 0 else None, family.memory_pressure)
        return int(conc), frac, float(mp)


def _choose(rng, levels, weights, keep=None, default=None):
    """One of ``levels`` by ``weights``; ``keep`` (a family's defining condition)
    restricts the levels (equal weights if the kept ones all weigh 0; the family's
    own value if none is kept)."""
    pairs = [(v, w) for v, w in zip(levels, weights) if keep is None or keep(v)]
    if not pairs:
        return default
    if sum(w for _, w in pairs) <= 0:
        pairs = [(v, 1.0) for v, _ in pairs]
    total = sum(w for _, w in pairs)
    return pairs[int(rng.choice(len(pairs), p=[w / total for _, w in pairs]))][0]


def scaled(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    """``spec`` with prompt, output and shared-prefix lengths times ``factor``."""
    if factor == 1:
        return spec
    if factor <= 0:
        raise ValueError(f"length scale must be > 0, got {factor}")

    def s(n):
        return max(1, round(n * factor)) if n else 0

    return dataclasses.replace(spec, prompt_tokens=s(spec.prompt_tokens),
                               expected_output_tokens=s(spec.expected_output_tokens),
                               shared_prefix_tokens=s(spec.shared_prefix_tokens))


def drawn_requests(names, per_family: int, seed: int = 0, length_scale: float = 1.0) -> list[Request]:
    """The requests ``dataset build`` labels from estimates and ``quality-sweep`` measures:
    ``per_family`` from each workload in ``names`` at ``length_scale``, ids namespaced
    ``draw-`` apart from a profile's own (the same generators draw those). The same
    arguments give the same requests, so a sweep's rows join the table's."""
    return [dataclasses.replace(r, id=f"draw-{r.id}") for i, n in enumerate(names)
            for r in scaled(get_workload(n), length_scale).sample(per_family, seed=seed * 100 + i)]


def with_condition(req: Request, concurrency: int, prefix_fraction: float,
                   memory_pressure: float) -> Request:
    """``req`` under a drawn condition: a prefix-free request gets ``prefix_fraction`` of
    its prompt as a shared prefix (the prompt length is unchanged); one with its
    family's own prefix keeps it."""
    prefix = req.shared_prefix_tokens
    if prefix_fraction and not prefix:
        prefix = min(req.prompt_tokens - 1, max(1, math.floor(req.prompt_tokens * prefix_fraction)))
        prefix = max(prefix, 0)
    return dataclasses.replace(req, concurrent_requests=int(concurrency),
                               shared_prefix_tokens=int(prefix), memory_pressure=float(memory_pressure))


def arrival_group(req: Request) -> list[Request]:
    """``req`` and the requests that arrive with it: ``concurrent_requests - 1``
    companions of its own shape (prompt and output lengths, shared prefix, memory
    pressure), each with its own id and so its own text.

    Why one function: the profiler measures this group as one unit and live scoring
    runs it again from the table's row, which holds the lead request only. Both build
    it here, so the live check times the group the table measured. Companions take
    the lead's shape, not lengths of their own: the row's features (the lead's) then
    describe the whole group, which is all a router sees."""
    c = max(1, int(req.concurrent_requests))
    return [req] + [dataclasses.replace(req, id=f"{req.id}~{k}") for k in range(1, c)]


def primer(req: Request) -> Request | None:
    """The untimed request run before ``req`` to warm its shared prefix ("prime, then
    follow"), or None without one: the same prefix, a few tokens of its own, one
    output token. Shared by the profiler and live scoring, like :func:`arrival_group`."""
    if not req.shared_prefix_tokens:
        return None
    return dataclasses.replace(req, id=f"{req.id}-prime", prompt_tokens=req.shared_prefix_tokens + 8,
                               expected_output_tokens=1, concurrent_requests=1)


@dataclass
class DrawnUnit:
    """One drawn request and, when its concurrency is above 1, the companions that
    arrive with it (:func:`arrival_group`)."""

    request: Request
    companions: list[Request] = field(default_factory=list)

    @property
    def group(self) -> list[Request]:
        return [self.request, *self.companions]


def draw_units(spec: WorkloadSpec, n: int, conditions: ConditionDraw, seed: int = 0,
               stratified: bool = False, with_companions: bool = True) -> list[DrawnUnit]:
    """``n`` requests of ``spec`` (lengths as :meth:`WorkloadSpec.sample`), each under
    its own drawn condition; ``with_companions`` also makes the requests that arrive
    with it (what a profile measures as one group: :func:`arrival_group`)."""
    import numpy as np  # only when requests are drawn: listing workloads (the CLI) needs none

    rng = np.random.default_rng([seed, 7919])
    base = spec.sample(n, seed=seed, stratified=stratified)
    out = []
    for r in base:
        conc, frac, mp = conditions.draw(spec, rng)
        r = with_condition(r, conc, frac, mp)
        comps = arrival_group(r)[1:] if with_companions else []
        out.append(DrawnUnit(r, comps))
    return out
