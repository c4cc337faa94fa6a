"""Multinomial logistic regression on standardised features."""

from __future__ import annotations

from sklearn.linear_model import LogisticRegression

from modeswitch.routers.families.classifier import ModeClassifier
from modeswitch.routers.families.logistic_params import LogisticParameters
from modeswitch.routers.families.readers import linear_model
from modeswitch.routers.registry import RouterFamily, register_router


class LogisticRouter(LogisticParameters, ModeClassifier):
    _scale = True

    def __init__(self, *, max_iter=3000, **shared):
        super().__init__(**shared)
        self.max_iter = max_iter

    def _make_estimator(self):
        return LogisticRegression(C=self.C, max_iter=self.max_iter, class_weight=self.class_weight,
                                  solver="lbfgs", random_state=self.random_state)

    @classmethod
    def _search_space(cls, trial) -> dict:
        return dict(C=trial.suggest_float("C", 1e-3, 1e2, log=True))

    def _estimator_state(self, clf):
        scaler = self.pipeline_.named_steps["prep"].named_transformers_["num"]
        return linear_model(clf.coef_, clf.intercept_, scaler)


register_router(RouterFamily("lr", LogisticRouter, "logistic regression (scikit-learn)"))
