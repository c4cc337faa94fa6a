"""A random forest (averaged class probabilities of the trees)."""

from __future__ import annotations

from sklearn.ensemble import RandomForestClassifier

from modeswitch.routers.families.classifier import ModeClassifier
from modeswitch.routers.families.readers import sklearn_trees
from modeswitch.routers.registry import RouterFamily, register_router


class RandomForestRouter(ModeClassifier):
    def __init__(self, *, n_estimators=100, max_depth=10, min_samples_leaf=2, max_features="sqrt", n_jobs=1,
                 **shared):
        super().__init__(**shared)
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.n_jobs = n_jobs

    def _make_estimator(self):
        return RandomForestClassifier(n_estimators=self.n_estimators, max_depth=self.max_depth,
                                      min_samples_leaf=self.min_samples_leaf,
                                      max_features=self.max_features, class_weight=self.class_weight,
                                      random_state=self.random_state, n_jobs=self.n_jobs)

    @classmethod
    def _search_space(cls, trial) -> dict:
        return dict(n_estimators=trial.suggest_int("n_estimators", 20, 200, step=20),
                    max_depth=trial.suggest_int("max_depth", 3, 12),
                    min_samples_leaf=trial.suggest_int("min_samples_leaf", 1, 10),
                    max_features=trial.suggest_categorical("max_features", ["sqrt", 0.5, 1.0]))

    def _estimator_state(self, clf):
        return sklearn_trees(clf.estimators_, len(self.classes_))


register_router(RouterFamily("rf", RandomForestRouter, "random forest (scikit-learn)"))
