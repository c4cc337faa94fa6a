"""Research add-ons of ModeSwitch, behind one boundary.

The core pipeline (modes, backends, profiling, the oracle's labels, the training table,
feature sets, the dt / rf / lr / lgbm / cost routers, the pooled Learn-then-Test
certificate, splits, tuning, MLflow, scoring, export, serving) lives in the rooms and
is what ``modeswitch.routers.api`` and each command's default ``--help`` expose. What
is here answers research questions about that pipeline; it works, the study runs it,
but its interface and results may change without notice:

* adaptive thresholds: :class:`AdaptiveThresholdRouter` (a certified cost router whose
  threshold moves with every pick's outcome) and :func:`adaptive_replay` (its replay
  over held-out requests);
* the capture / violation ceiling of a split: :func:`frontier`;
* what a certificate costs and where it refuses: :func:`router_curves`,
  :func:`certificate_price`, :func:`certificate_refusals`;
* the per-request quality-risk model the oracle can judge unswept requests with:
  :class:`QualityRisk` (``--quality-scope request``);
* the certificates beyond the pooled one (``train --certificate`` per-family,
  family-held-out, family-cross-fit, ...), the capture tuning objective and pooled
  leave-one-family-out tuning: options of ``train``, not names here.

The modules stay in their rooms (listed in :data:`RESEARCH_MODULES`); this package names
them lazily, so ``import modeswitch.experimental`` loads none of them, and no core
module imports them at import time (tests/test_experimental.py holds both). Using an
add-on, or a command option in a ``--help``'s "Advanced" panel, emits one
:class:`ExperimentalWarning` per feature and process. To silence it::

    import warnings
    from modeswitch.experimental import ExperimentalWarning
    warnings.filterwarnings("ignore", category=ExperimentalWarning)

(or, for the command line, ``PYTHONWARNINGS="ignore:experimental add-on"``: every
message starts so, and ``-W`` cannot name a category outside the standard library).
"""

from __future__ import annotations

import importlib

from modeswitch.experimental._warn import (
    ExperimentalWarning,
    experimental_class,
    experimental_func,
    run_by_default,
    warn_experimental,
)

#: the research modules behind the boundary: imported only when an add-on is used
RESEARCH_MODULES = (
    "modeswitch.routers.adaptive",
    "modeswitch.routers.scoring.adaptive",
    "modeswitch.routers.scoring.frontier",
    "modeswitch.routers.scoring.refusals",
    "modeswitch.routers.scoring.threshold_sweep",
    "modeswitch.oracle.quality_risk",
)

#: name -> the module that defines it, loaded on first access (PEP 562)
_LAZY = {
    "AdaptiveThresholdRouter": "modeswitch.routers.adaptive",
    "ThresholdTracker": "modeswitch.routers.adaptive",
    "adaptive_replay": "modeswitch.routers.scoring.adaptive",
    "Frontier": "modeswitch.routers.scoring.frontier",
    "frontier": "modeswitch.routers.scoring.frontier",
    "certificate_refusals": "modeswitch.routers.scoring.refusals",
    "router_curves": "modeswitch.routers.scoring.threshold_sweep",
    "certificate_price": "modeswitch.routers.scoring.threshold_sweep",
    "QualityRisk": "modeswitch.oracle.quality_risk",
}

__all__ = ["RESEARCH_MODULES", "ExperimentalWarning", "experimental_class", "experimental_func",
           "run_by_default", "warn_experimental", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
