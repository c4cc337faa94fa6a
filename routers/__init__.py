"""Routers: the rule baseline and learned routers, all scikit-learn estimators.

Every router, learned or rule, follows scikit-learn's estimator API (``__init__``
stores parameters, ``fit`` returns self, learned attributes end in ``_``) and is
registered by name in :mod:`routers.registry`.
"""

from routers.registry import get_router, list_routers, register_router

__all__ = ["get_router", "list_routers", "register_router"]
