"""What an engine returns for one request: tokens, text and timings."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Generation:
    """One finished request. ``token_times_ms`` are arrival times of each output
    token, relative to the request's start (tokens accepted together in one
    speculative step share a time)."""

    request_id: str
    output_ids: list[int]
    text: str
    latency_ms: float
    token_times_ms: list[float] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def ttft_ms(self) -> float:
        return self.token_times_ms[0] if self.token_times_ms else float("nan")

    @property
    def tbt_ms(self) -> np.ndarray:
        t = np.asarray(self.token_times_ms, dtype=float)
        return np.diff(t) if len(t) > 1 else np.array([])

    @property
    def tbt_ms_mean(self) -> float:
        d = self.tbt_ms
        return float(d.mean()) if len(d) else float("nan")

    @property
    def tbt_ms_p95(self) -> float:
        d = self.tbt_ms
        return float(np.percentile(d, 95)) if len(d) else float("nan")
