"""Gradient-boosted trees (LightGBM), one tree per class and round."""

from __future__ import annotations

from modeswitch.routers.families.classifier import ModeClassifier
from modeswitch.routers.families.lightgbm_params import LightGBMParameters
from modeswitch.routers.families.readers import lightgbm_ensemble
from modeswitch.routers.registry import RouterFamily, register_router


class LightGBMRouter(LightGBMParameters, ModeClassifier):
    def _make_estimator(self):
        from lightgbm import LGBMClassifier  # heavy (~0.3 s): only when a LightGBM router is built

        return LGBMClassifier(class_weight=self.class_weight, **self._lightgbm_kwargs())

    @classmethod
    def _search_space(cls, trial) -> dict:
        return cls._lightgbm_space(trial, max_leaves=63, max_child_samples=50)

    def _estimator_state(self, clf):
        return lightgbm_ensemble(clf.booster_)


register_router(RouterFamily("lgbm", LightGBMRouter, "gradient-boosted trees (LightGBM)"))
