"""The workload dataclass: a named request shape with real per-request spread."""

from __future__ import annotations

import math
from dataclasses import dataclass

from modeswitch.dataset.requests import Request

#: The serving condition a workload puts a request in. The oracle estimates a
#: request's metrics only from profile cells measured under the same condition.
CONDITIONS = ("plain", "shared_prefix", "memory_pressure", "batch_pressure", "benchmark")


def condition_of(shared_prefix_tokens, memory_pressure, concurrent_requests) -> str:
    """The condition implied by a request's numbers when its family is unknown.

    Precedence follows the rule controller: batch pressure, then shared prefix,
    then memory pressure.
    """
    if concurrent_requests is not None and concurrent_requests >= 2:
        return "batch_pressure"
    if shared_prefix_tokens is not None and shared_prefix_tokens > 0:
        return "shared_prefix"
    if memory_pressure is not None and memory_pressure > 0:
        return "memory_pressure"
    return "plain"


#: the share of a workload's spread a stratified (profile) draw covers
COVERAGE = 0.95


@dataclass(frozen=True)
class WorkloadSpec:
    """A request population around a nominal shape.

    ``spread`` is the sigma of the log-normal noise on prompt and output lengths,
    so requests inside one family differ (the study's did not, which left its
    learned routers nothing to learn beyond the family).
    """

    name: str
    description: str
    condition: str
    prompt_tokens: int
    expected_output_tokens: int
    shared_prefix_tokens: int = 0
    concurrent_requests: int = 1
    memory_pressure: float = 0.0
    spread: float = 0.25
    #: benchmark suites whose questions end this family's prompts (every suite when
    #: empty); see :mod:`modeswitch.dataset.prompt_corpus`
    questions: tuple[str, ...] = ()
    #: suites whose worked examples fill a long prompt, and the shared prefix, up to
    #: the family's length
    context: tuple[str, ...] = ("mmlu_pro", "gsm8k")

    def __post_init__(self):
        if self.condition not in CONDITIONS:
            raise ValueError(f"workload {self.name}: condition must be one of {CONDITIONS}")

    def sample(self, n: int, seed: int = 0, stratified: bool = False) -> list[Request]:
        """Draw ``n`` requests with log-normal spread around the nominal shape.

        ``stratified`` (what a profile measures): a Latin-hypercube draw over the
        central ``COVERAGE`` of the spread, prompt and output lengths each at evenly
        spaced quantiles in a random pairing, so ten requests span the range that
        thousands of random draws (what routers are trained and scored on) mostly
        fall in, instead of clustering near the nominal shape.
        """
        import numpy as np  # only when requests are drawn: listing workloads (the CLI) needs none

        rng = np.random.default_rng(seed)
        if stratified and self.spread and n > 1:
            from scipy.stats import norm  # scipy for the stratified draw only

            q = (1 - COVERAGE) / 2 + COVERAGE * np.arange(n) / (n - 1)
            z = norm.ppf(q) * self.spread
            jitters = np.column_stack([rng.permutation(z), rng.permutation(z)])
        else:
            jitters = rng.normal(0.0, self.spread, size=(n, 2)) if self.spread else np.zeros((n, 2))
        out = []
        for i in range(n):
            jitter = jitters[i]
            suffix = max(1, round(max(self.prompt_tokens - self.shared_prefix_tokens, 1)
                                  * math.exp(jitter[0])))
            prompt = self.shared_prefix_tokens + suffix if self.shared_prefix_tokens else suffix
            out_tokens = max(1, round(self.expected_output_tokens * math.exp(jitter[1])))
            out.append(
                Request(
                    id=f"{self.name}-{seed}-{i:05d}",
                    prompt_tokens=int(prompt),
                    expected_output_tokens=int(out_tokens),
                    shared_prefix_tokens=int(self.shared_prefix_tokens),
                    concurrent_requests=int(self.concurrent_requests),
                    memory_pressure=float(self.memory_pressure),
                    family=self.name,
                    workload=self.name,
                )
            )
        return out
