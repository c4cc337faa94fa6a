"""Logistic regression's regularisation, declared once for every family that fits one
(the ``lr`` classifier, and ``cost_linear``'s risk models, one per mode and constraint)."""

from __future__ import annotations

from modeswitch.routers.families.base import LearnedRouter


class LogisticParameters(LearnedRouter):
    """A mixin: ``C``, the inverse L2 strength of the family's logistic regressions.
    List it before the family's kind: ``class MyRouter(LogisticParameters, ModeClassifier)``.
    Each family keeps its own search range for it (``_search_space``)."""

    def __init__(self, *, C=1.0, **shared):
        super().__init__(**shared)
        self.C = C
