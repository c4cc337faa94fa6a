"""A single decision tree: the cheapest learned decision (generated Python when compiled)."""

from __future__ import annotations

from sklearn.tree import DecisionTreeClassifier

from modeswitch.routers.families.classifier import ModeClassifier
from modeswitch.routers.families.readers import sklearn_trees
from modeswitch.routers.registry import RouterFamily, register_router


class DecisionTreeRouter(ModeClassifier):
    def __init__(self, *, max_depth=5, min_samples_leaf=3, criterion="gini", **shared):
        super().__init__(**shared)
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.criterion = criterion

    def _make_estimator(self):
        return DecisionTreeClassifier(max_depth=self.max_depth, min_samples_leaf=self.min_samples_leaf,
                                      criterion=self.criterion, class_weight=self.class_weight,
                                      random_state=self.random_state)

    @classmethod
    def _search_space(cls, trial) -> dict:
        return dict(max_depth=trial.suggest_int("max_depth", 2, 12),
                    min_samples_leaf=trial.suggest_int("min_samples_leaf", 1, 20),
                    criterion=trial.suggest_categorical("criterion", ["gini", "entropy"]))

    def _estimator_state(self, clf):
        return sklearn_trees([clf], len(self.classes_))


register_router(RouterFamily("dt", DecisionTreeRouter, "decision tree (scikit-learn)"))
