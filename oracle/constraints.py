"""Constraint thresholds for the oracle, defaulting to the study's.

Every threshold is a CLI flag and can come from a TOML file (``[constraints]``
table or top level), validated with pydantic so a bad value names its key.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationError

from modeswitch.dataset.errors import InputFileError

NonNeg = Annotated[float, Field(ge=0)]


@dataclass(frozen=True)
class Constraints:
    """When a mode is acceptable for a request, relative to the reference mode.

    * energy: energy per token <= ``max_energy_ratio`` x reference;
    * memory: peak memory <= ``max_memory_ratio`` x reference;
    * quality, for whichever signals the reference has: benchmark accuracy no
      more than ``max_accuracy_drop_pp`` points below the reference's; ROUGE-L
      of the output vs the reference-mode output >= ``min_rouge_vs_baseline``;
      ROUGE-L vs the gold reference no more than ``max_rouge_vs_reference_drop``
      below the reference mode's.

    ``latency_tie_rel`` makes latencies within that relative distance of the
    fastest safe mode count as tied (0: only exact ties). ``on_incomplete``
    decides what a missing metric or a unit without reference rows does:
    ``error`` (default) stops with a message, ``skip`` rejects the mode (or skips
    the unit) and says so in the explanation. ``missing_quality`` is the study's
    rule for a mode without quality evidence: ``unsafe`` (default) rejects it,
    ``pass`` leaves the missing signals unchecked. ``noise_aware`` applies the
    noise rule of :mod:`modeswitch.oracle.noise_aware` to units measured in two or more trials
    (a mode replaces a safer one only beyond noise; the energy limit is met by the
    upper end of the interval), with intervals at ``confidence_level``.

    ``quality_scope`` is where the two quality limits (ROUGE-L vs the reference
    output, accuracy drop) are judged: ``family`` (default, the study's rule) on the
    mean over the measured units of the request's family or benchmark suite;
    ``request`` on the request's own figures (stricter). ``lossless_at_floor``
    leaves lossless modes' divergence uncharged: it is the reference's own
    self-consistency floor (see :mod:`modeswitch.oracle.family_rule`).

    ``max_quality_risk`` and ``quality_risk``: under ``quality_scope="request"``, with a
    quality sweep, a request the sweep did not measure takes a lossy mode only when a
    model fitted on the swept requests (:mod:`modeswitch.oracle.quality_risk`, ``logistic`` or
    ``lgbm``) puts its probability of failing the quality rule at most
    ``max_quality_risk``, instead of judging figures interpolated from other requests;
    ``quality_risk="off"`` keeps the interpolation.
    """

    max_energy_ratio: NonNeg = 1.00
    max_memory_ratio: NonNeg = 1.02
    max_accuracy_drop_pp: NonNeg = 1.5
    min_rouge_vs_baseline: Annotated[float, Field(ge=0, le=1)] = 0.80
    max_rouge_vs_reference_drop: NonNeg = 0.02
    latency_tie_rel: NonNeg = 0.0
    on_incomplete: Literal["error", "skip"] = "error"
    missing_quality: Literal["unsafe", "pass"] = "unsafe"
    noise_aware: bool = True
    confidence_level: Annotated[float, Field(gt=0, lt=1)] = 0.95
    quality_scope: Literal["family", "request"] = "family"
    lossless_at_floor: bool = True
    max_quality_risk: Annotated[float, Field(ge=0, le=1)] = 0.05
    quality_risk: Literal["logistic", "lgbm", "off"] = "logistic"

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> Constraints:
        """A copy with the given (non-None) thresholds changed, validated."""
        data = self.to_dict()
        data.update({k: v for k, v in changes.items() if v is not None})
        return _ADAPTER.validate_python(data)

    @classmethod
    def from_toml(cls, path) -> Constraints:
        path = Path(path)
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        data = data.get("constraints", data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputFileError(path, None, unknown[0],
                                 f"unknown constraint; known: {', '.join(sorted(known))}")
        try:
            return _ADAPTER.validate_python(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise InputFileError(path, None, ".".join(map(str, err["loc"])), err["msg"]) from None


_ADAPTER = TypeAdapter(Constraints)
