"""LightGBM's parameters, declared once for every family that boosts with it (the ``lgbm``
classifier and the ``cost_lgbm`` cost router)."""

from __future__ import annotations

from modeswitch.routers.families.base import LearnedRouter


class LightGBMParameters(LearnedRouter):
    """A mixin: LightGBM's tree parameters and the keyword arguments its estimators take.
    List it before the family's kind: ``class MyRouter(LightGBMParameters, ModeClassifier)``."""

    def __init__(self, *, n_estimators=100, num_leaves=15, learning_rate=0.1, min_child_samples=10,
                 **shared):
        super().__init__(**shared)
        self.n_estimators = n_estimators
        self.num_leaves = num_leaves
        self.learning_rate = learning_rate
        self.min_child_samples = min_child_samples

    def _lightgbm_kwargs(self) -> dict:
        """One thread per model (the trainer runs folds and workers in parallel), quiet."""
        return dict(n_estimators=self.n_estimators, num_leaves=self.num_leaves,
                    learning_rate=self.learning_rate, min_child_samples=self.min_child_samples,
                    random_state=self.random_state, n_jobs=1, verbose=-1)

    @staticmethod
    def _lightgbm_space(trial, max_leaves: int, max_child_samples: int) -> dict:
        """The boosting parameters for one Optuna trial (each family its own upper bounds)."""
        return dict(n_estimators=trial.suggest_int("n_estimators", 20, 200, step=20),
                    num_leaves=trial.suggest_int("num_leaves", 4, max_leaves),
                    learning_rate=trial.suggest_float("learning_rate", 0.02, 0.3, log=True),
                    min_child_samples=trial.suggest_int("min_child_samples", 5, max_child_samples))
