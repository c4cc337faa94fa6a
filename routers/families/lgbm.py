"""Gradient-boosted trees (LightGBM), one tree per class and round."""

from __future__ import annotations

from routers.families.base import LearnedRouter
from routers.families.readers import lightgbm_ensemble
from routers.registry import RouterFamily, register_router


class LightGBMRouter(LearnedRouter):
    def __init__(self, n_estimators=100, num_leaves=15, learning_rate=0.1, min_child_samples=10,
                 class_weight=None, feature_set="A", safety_threshold=None, fallback="rule", target_violation_rate=None,
                 delta=0.1,
                 random_state=0):
        self.n_estimators = n_estimators
        self.num_leaves = num_leaves
        self.learning_rate = learning_rate
        self.min_child_samples = min_child_samples
        self.class_weight = class_weight
        self.feature_set = feature_set
        self.safety_threshold = safety_threshold
        self.fallback = fallback
        self.target_violation_rate = target_violation_rate
        self.delta = delta
        self.random_state = random_state

    def _make_estimator(self):
        from lightgbm import LGBMClassifier

        return LGBMClassifier(n_estimators=self.n_estimators, num_leaves=self.num_leaves,
                              learning_rate=self.learning_rate,
                              min_child_samples=self.min_child_samples,
                              class_weight=self.class_weight, random_state=self.random_state,
                              n_jobs=1, verbose=-1)

    @classmethod
    def _search_space(cls, trial) -> dict:
        return dict(n_estimators=trial.suggest_int("n_estimators", 20, 200, step=20),
                    num_leaves=trial.suggest_int("num_leaves", 4, 63),
                    learning_rate=trial.suggest_float("learning_rate", 0.02, 0.3, log=True),
                    min_child_samples=trial.suggest_int("min_child_samples", 5, 50))

    def _estimator_state(self, clf):
        return lightgbm_ensemble(clf.booster_)


register_router(RouterFamily("lgbm", LightGBMRouter, "gradient-boosted trees (LightGBM)"))
