"""Routers: the router protocol, the registry, the rule baseline and the learned routers.

Rooms inside ``routers/``:

* this level: the :class:`~modeswitch.routers.base.Router` protocol (``base``), the registry
  (``registry``), the rule baseline (``rule_baseline``), fixed-mode and oracle routers
  (``reference``), the learned families (``families/``, one file each), their fitted
  decision as plain data (``fitted_state``) and the certifying wrapper (``certified``);
* ``training/``: Optuna tuning, the cost objective, splits, MLflow tracking;
* ``scoring/``: offline scores, routing overhead, live runs, the report;
* ``compiler/``: compiled routers (C kernel, generated Python);
* ``export``: the MLflow registry (``champion``) and loading for serving.

Every router, learned or rule, follows scikit-learn's estimator API (``__init__``
stores parameters, ``fit`` returns self, learned attributes end in ``_``).
"""

from modeswitch.routers.base import Router, RouterMixin
from modeswitch.routers.registry import (
    RouterFamily,
    get_family,
    get_router,
    learned_families,
    list_routers,
    register_router,
)

__all__ = ["Router", "RouterFamily", "RouterMixin", "get_family", "get_router", "learned_families",
           "list_routers", "register_router"]
