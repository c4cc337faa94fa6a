"""Multinomial logistic regression on standardised features."""

from __future__ import annotations

from routers.families.base import LearnedRouter
from routers.families.readers import linear_model
from routers.registry import RouterFamily, register_router


class LogisticRouter(LearnedRouter):
    _scale = True

    def __init__(self, C=1.0, max_iter=3000, class_weight=None, feature_set="A",
                 safety_threshold=None, fallback="rule", target_violation_rate=None,
                 delta=0.1):
        self.C = C
        self.max_iter = max_iter
        self.class_weight = class_weight
        self.feature_set = feature_set
        self.safety_threshold = safety_threshold
        self.fallback = fallback
        self.target_violation_rate = target_violation_rate
        self.delta = delta

    def _make_estimator(self):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=self.C, max_iter=self.max_iter, class_weight=self.class_weight,
                                  solver="lbfgs")

    @classmethod
    def _search_space(cls, trial) -> dict:
        return dict(C=trial.suggest_float("C", 1e-3, 1e2, log=True))

    def _estimator_state(self, clf):
        return linear_model(clf.coef_, clf.intercept_, self.pipeline_.named_steps["prep"].named_transformers_["num"])


register_router(RouterFamily("lr", LogisticRouter, "logistic regression (scikit-learn)"))
