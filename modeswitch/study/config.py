"""The study's settings: one typed dataclass, filled from ``study.toml``.

Why one dataclass: like a mode's ``ModeConfig``, the study's settings have one
source for Python and for the file; the TOML groups them in tables
(``[study] [profile] [conditions] [dataset] [constraints] [train] [score]``) and
:meth:`StudyConfig.from_toml` maps each table's keys onto the fields, naming the
file, table and key of anything it refuses. The defaults are the CPU study
``make study`` runs on two cores within an hour.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from modeswitch.dataset.errors import InputError, InputFileError
from modeswitch.dataset.limits import count, finite, requests_fit
from modeswitch.dataset.workloads.conditions import ConditionDraw
from modeswitch.engine.modes.config import CHECKPOINT_KEYS
from modeswitch.oracle import Constraints
from modeswitch.routers.certificates import CERTIFICATES
from modeswitch.routers.registry import check_router_params
from modeswitch.routers.training.costs import OBJECTIVES
from modeswitch.routers.training.splits import LOFO_TUNING, SPLITS

DEFAULT_FAMILIES = (
    "short_prompt_short_output", "short_prompt_long_output", "long_prompt_short_output",
    "long_prompt_long_output", "shared_prefix_chat", "memory_pressure_long_context",
    "batch_pressure",
)

#: TOML table -> the fields it sets (a field belongs to exactly one table)
TABLES = {
    "study": ("name", "output", "seed", "mlruns"),
    "model": ("model", "draft_model", "backend", "device", "checkpoints"),
    "profile": ("families", "modes", "requests_per_family", "trials", "max_remeasure",
                "length_scale", "interleave", "threads"),
    "dataset": ("drawn_requests", "swept_per_family", "sweep_arrival_groups", "sweep_repeats", "confidence"),
    "train": ("splits", "routers", "tuning_trials", "feature_set", "labels", "test_size",
              "target_violation_rate", "certificate", "router_params", "tuning_objective", "lofo_tuning",
              "workers"),
    "score": ("live", "live_per_family", "live_trials", "decisions"),
}
#: fields added after studies had begun, left out of the identity at their default
LATER_FIELDS = {"target_violation_rate": 0.01, "certificate": "pooled", "swept_per_family": 0,
                "sweep_arrival_groups": False, "sweep_repeats": 1,
                "confidence": False, "router_params": {}, "tuning_objective": "regret",
                # studies before it tuned leave-one-family-out once, on every row
                "lofo_tuning": "pooled", "workers": 1, "checkpoints": {}}
#: tables holding a mapping handed on as it is (checked by their own owners)
MAPPINGS = ("conditions", "constraints")


@dataclass(frozen=True)
class StudyConfig:
    """Everything ``modeswitch study run`` does, and with what."""

    name: str = "cpu-study"
    #: the study's folder: every step's outputs, its state and the report
    output: str = "runs/study"
    seed: int = 0
    mlruns: str = "mlruns"
    model: str = "smollm2"
    draft_model: str | None = None
    backend: str = "transformers"
    device: str = "cpu"
    #: weights per format (``EngineSettings.checkpoints``): the vLLM backend's
    #: pre-quantized checkpoints (`modeswitch model quantize`), llama.cpp's GGUF types
    checkpoints: dict[str, str] = field(default_factory=dict)
    families: tuple[str, ...] = DEFAULT_FAMILIES
    #: None: every mode the backend supports
    modes: tuple[str, ...] | None = None
    requests_per_family: int = 4
    trials: int = 2
    max_remeasure: int = 2
    length_scale: float = 0.25
    interleave: bool = True
    threads: int | None = None
    #: per-request conditions (:class:`modeswitch.dataset.workloads.conditions.ConditionDraw` fields)
    conditions: dict = field(default_factory=dict)
    #: requests drawn beside the profiled ones, labelled from estimates (0: measured only)
    drawn_requests: int = 700
    #: drawn requests per family whose quality is measured by a quality sweep (the
    #: ``quality`` step: the reference and every lossy mode, batched, untimed), so
    #: their safety labels are their own, not their family's mean; 0: no sweep
    swept_per_family: int = 0
    #: the sweep runs each request with the companions that arrive with it and judges the
    #: group's joined output, as the profile and the live check do (engine.quality_sweep)
    sweep_arrival_groups: bool = False
    #: passes of the sweep over every request, each in batches of other companions; a
    #: request is safe only where every pass judged it so (engine.quality_sweep)
    sweep_repeats: int = 1
    #: the dataset step also reads the reference model's confidence at each prompt's end
    #: (one prefill per prompt), which the per-request quality-risk model reads
    confidence: bool = False
    #: :class:`modeswitch.oracle.Constraints` fields; empty: the defaults
    constraints: dict = field(default_factory=dict)
    splits: tuple[str, ...] = ("random", "group", "lofo")
    #: None: every registered learned family
    routers: tuple[str, ...] | None = None
    tuning_trials: int = 10
    feature_set: str = "A"
    labels: str = "all"
    test_size: float = 0.25
    #: certified violation-rate target of the routers that take one (cost-predicting)
    target_violation_rate: float = 0.01
    #: what the certificate bounds (routers.certificates.CERTIFICATES)
    certificate: str = "pooled"
    #: fixed parameters per router family (``[train.router_params.cost_lgbm]``), beside
    #: the tuned ones (routers.training.trainer.TrainConfig.router_params)
    router_params: dict = field(default_factory=dict)
    #: what Optuna minimises: "regret" or "capture" (routers.training.costs.OBJECTIVES)
    tuning_objective: str = "regret"
    #: leaving one family out: one Optuna study per fold ("nested") or one on every row
    #: ("pooled"); routers.training.trainer.TrainConfig.lofo_tuning says why nested
    lofo_tuning: str = "nested"
    #: local processes tuning each study together (routers.training.parallel): faster on
    #: several cores, but each process samples with its own seed, so trials are not
    #: reproducible one by one
    workers: int = 1
    live: bool = True
    live_per_family: int = 3
    live_trials: int = 2
    decisions: int = 20_000

    def __post_init__(self):
        bad = [s for s in self.splits if s not in SPLITS]
        if bad:
            raise ValueError(f"train.splits: unknown split(s) {', '.join(bad)}; choose from {', '.join(SPLITS)}")
        bad = [k for k in self.checkpoints if k not in CHECKPOINT_KEYS]
        if bad:
            raise ValueError(f"model.checkpoints: unknown key(s) {', '.join(bad)}; choose from "
                             f"{', '.join(CHECKPOINT_KEYS)}")
        # every number finite, in range and within what this machine can hold, before any
        # step starts (length_scale = inf or requests_per_family = 1e20 failed in the profile)
        for name in ("requests_per_family", "trials", "live_trials", "tuning_trials", "decisions", "workers",
                     "sweep_repeats"):
            count(name, getattr(self, name))
        for name in ("max_remeasure", "drawn_requests", "live_per_family", "swept_per_family"):
            count(name, getattr(self, name), minimum=0)
        if self.threads is not None:
            count("threads", self.threads)
        finite("profile.length_scale", self.length_scale, positive=True)
        finite("train.test_size", self.test_size, positive=True, below=1)
        requests_fit("profile.requests_per_family", self.requests_per_family * max(1, len(self.families)))
        requests_fit("drawn_requests", self.drawn_requests)
        if not 0 <= self.target_violation_rate < 1:
            raise ValueError("train.target_violation_rate: must lie in [0, 1) (0: no certification)")
        if self.certificate not in CERTIFICATES:
            raise ValueError(f"train.certificate {self.certificate!r}: choose one of {', '.join(CERTIFICATES)}")
        if self.tuning_objective not in OBJECTIVES:
            raise ValueError(f"train.tuning_objective {self.tuning_objective!r}: choose one of {', '.join(OBJECTIVES)}")
        if self.lofo_tuning not in LOFO_TUNING:
            raise ValueError(f"train.lofo_tuning {self.lofo_tuning!r}: choose one of {', '.join(LOFO_TUNING)}")

    # ------------------------------------------------------------- the file
    @classmethod
    def from_toml(cls, path) -> StudyConfig:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InputFileError(path, None, None, str(exc)) from None
        flat: dict = {}
        for table, value in data.items():
            if table in MAPPINGS:
                flat[table] = dict(value)
                continue
            if table not in TABLES:
                raise InputFileError(path, None, table, f"unknown table; known: "
                                     f"{', '.join([*TABLES, *MAPPINGS])}")
            for key, v in value.items():
                if key not in TABLES[table]:
                    raise InputFileError(path, None, f"{table}.{key}", "unknown key; known: "
                                         + ", ".join(TABLES[table]))
                flat[key] = tuple(v) if isinstance(v, list) else v
        return cls.from_dict(flat, path)

    @classmethod
    def from_dict(cls, flat: dict, path=None) -> StudyConfig:
        try:
            cfg = TypeAdapter(cls).validate_python(flat)
        except ValidationError as exc:
            err = exc.errors()[0]
            # a check in __post_init__ has no field of its own: its message names the value
            raise InputFileError(path, None, ".".join(map(str, err["loc"])) or None,
                                 err["msg"].removeprefix("Value error, ")) from None
        except ValueError as exc:
            raise InputFileError(path, None, None, str(exc)) from None
        cfg.condition_draw()  # the owners check their own tables now, not an hour in
        cfg.constraint_set()
        if cfg.router_params:
            try:
                check_router_params(cfg.router_params)
            except InputError as exc:
                raise InputFileError(path, None, "train.router_params", str(exc)) from None
        return cfg

    def replace(self, **changes) -> StudyConfig:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------- what it builds
    def condition_draw(self):
        try:
            return ConditionDraw.from_dict(self.conditions)
        except (TypeError, ValueError) as exc:
            raise InputFileError(None, None, "conditions", str(exc)) from None

    def constraint_set(self):
        return Constraints().replace(**self.constraints) if self.constraints else Constraints()

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=list))

    def identity(self) -> str:
        """What a resumed run must agree on: every setting but where it is written."""
        d = self.to_dict()
        d.pop("output")
        for key, default in LATER_FIELDS.items():  # fields added later: only when set,
            if d.get(key) == default:            # so a study begun before them resumes
                d.pop(key)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
