"""One measurement as one profile row: the timed call (:class:`Measurement`), where
every row of a run comes from (:class:`RowProvenance`), and the columns in the
profile schema's order: shape, timing, noise, resources, quality, provenance."""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from modeswitch.dataset.benchmarks import score_answer
from modeswitch.dataset.requests import Request
from modeswitch.engine.profiler.plan import Unit

if TYPE_CHECKING:  # the engine side loads lazily: building rows needs none of it
    from modeswitch.engine.energy import EnergyReading

def _nan(x):
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else x


def software_string() -> str:
    import torch  # lazy: torch is heavy
    import transformers  # lazy: transformers pulls torch

    return json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                       "transformers": transformers.__version__})


def model_id(path: Path) -> str:
    """Folder name plus a short hash of the config and weights files' sizes and heads."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*")):
        if f.suffix in (".json", ".safetensors", ".bin"):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
            h.update(str(f.stat().st_size).encode())
    return f"{Path(path).name}@{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class RowProvenance:
    """Where every row of one run comes from. The same for all its rows, so it is
    worked out once per run (hashing the weights and querying the hardware is not free)."""

    backend: str
    reference_mode: str
    model: str
    hardware: str
    software: str
    run_id: str
    #: who measured: ``host:pid`` of a serial run, ``ray:<node ip>:<actor id>`` of a Ray worker
    worker: str = ""
    #: the device the engine ran on (``cpu``, ``cuda:<index>``)
    device: str = ""


@dataclass
class Measurement:
    """One timed engine call: what a profile row is made from."""

    unit: Unit
    mode: str
    trial: int
    #: the unit's (request, prompt ids) pairs as the engine ran them
    group: list
    gens: list
    energy: EnergyReading
    peak_mb: float
    #: the engine's own account of how it ran (precision, graph capture, ballast)
    info: dict
    #: wall and CPU seconds of the engine call (:class:`modeswitch.engine.noise.TrialClock`)
    clock: object = None
    #: 0 for a trial's first measurement, then one per re-measurement of a contended one
    attempt: int = 0

    @property
    def requests(self) -> list[Request]:
        return [r for r, _ in self.group]

    @property
    def text(self) -> str:
        return "\n".join(g.text for g in self.gens)


def _shape_columns(m: Measurement) -> dict:
    """Which unit, mode and trial the row is, and the unit's request shape (a group's
    token counts are means over its requests, its concurrency their number)."""
    reqs = m.requests
    r0 = reqs[0]
    return {
        "workload": m.unit.family, "family": m.unit.family, "request_id": m.unit.id, "mode": m.mode,
        "trial": m.trial, "attempt": m.attempt, "is_aggregate": False, "n_trials": None,
        "prompt_tokens": float(np.mean([r.prompt_tokens for r in reqs])),
        "expected_output_tokens": float(np.mean([r.expected_output_tokens for r in reqs])),
        "shared_prefix_tokens": float(r0.shared_prefix_tokens),
        "concurrent_requests": float(len(reqs)),
        "memory_pressure": float(r0.memory_pressure),
        "benchmark_suite": r0.benchmark_suite, "evaluation_mode": r0.evaluation_mode,
    }


def _timing_columns(gens) -> dict:
    """A group finishes when its last request does, so latency is the maximum; tokens
    are summed over the group and time-between-tokens pooled over it."""
    latency = max(g.latency_ms for g in gens)
    out_tokens = sum(g.output_tokens for g in gens)
    tbt = np.concatenate([g.tbt_ms for g in gens]) if gens else np.array([])
    return {
        "latency_ms": latency,
        "ttft_ms": _nan(float(np.nanmean([g.ttft_ms for g in gens]))),
        "tbt_ms_mean": _nan(float(tbt.mean())) if len(tbt) else None,
        "tbt_ms_p95": _nan(float(np.percentile(tbt, 95))) if len(tbt) else None,
        "tokens_per_s": out_tokens / (latency / 1000) if latency > 0 else None,
        "output_tokens": float(out_tokens),
    }


def _resource_columns(m: Measurement) -> dict:
    out_tokens = sum(g.output_tokens for g in m.gens)
    return {
        "energy_j": m.energy.joules,
        "energy_per_token_j": m.energy.joules / out_tokens if out_tokens else None,
        "energy_source": m.energy.source, "peak_memory_mb": m.peak_mb,
    }


def _noise_columns(m: Measurement, threads) -> dict:
    """The trial's CPU time and share, from which the contention flag is worked out
    over the unit's trials when the profile is written (see :mod:`modeswitch.engine.noise`)."""
    c = m.clock
    return {
        "cpu_time_ms": None if c is None else c.cpu_s * 1000,
        "cpu_share": None if c is None else _nan(c.share),
        "other_load": None if c is None else _nan(c.other_load),
        "threads": None if threads is None else threads.threads,
    }


def _quality_columns(m: Measurement) -> dict:
    """Benchmark accuracy where the requests have gold answers. The ROUGE-L columns
    are filled in later: against the reference output, once it is known."""
    acc = [score_answer(g.text, r.reference, r.evaluation_mode) for g, r in zip(m.gens, m.requests)]
    acc = [a for a in acc if a is not None]
    return {
        "accuracy": float(np.mean(acc)) if acc else None,
        "rouge_l_vs_reference": None, "rouge_l_vs_baseline": None,
    }


def _provenance_columns(prov: RowProvenance, m: Measurement, notes: list[str]) -> dict:
    return {
        "reference_mode": prov.reference_mode, "precision": m.info.get("precision"),
        "graph_capture": bool(m.info.get("graph_capture", False)), "backend": prov.backend,
        "model": prov.model,
        "hardware": prov.hardware, "software": prov.software, "run_id": prov.run_id,
        "worker": prov.worker or None, "device": prov.device or None,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": "; ".join(notes), "output_text": m.text,
    }
