"""(b) Add your own router class (k nearest neighbours) and score it beside the built-in ones.

A router is a scikit-learn estimator: subclass ModeClassifier, declare your own
parameters (keyword-only; the shared ones come from the base through ``**shared``), say
which model to fit and its Optuna search space, register it by name, and training, scoring, export and
serving take it like any built-in family (`modeswitch train --routers knn` too, when
the module is on $MODESWITCH_PLUGINS).

    python examples/custom_router.py --profiles runs/demo-*/profiles.parquet
"""

from _data import table_from_args
from sklearn.neighbors import KNeighborsClassifier

from modeswitch.routers import RouterFamily, api, register_router
from modeswitch.routers.families.classifier import ModeClassifier


class KNNRouter(ModeClassifier):
    """The mode most of the k nearest training requests (scaled features) were labelled."""

    _scale = True  # distances need comparable feature scales

    def __init__(self, *, n_neighbors=7, weights="distance", **shared):
        super().__init__(**shared)
        self.n_neighbors = n_neighbors
        self.weights = weights

    def _make_estimator(self):
        return KNeighborsClassifier(n_neighbors=self.n_neighbors, weights=self.weights)

    @classmethod
    def _search_space(cls, trial) -> dict:
        return dict(n_neighbors=trial.suggest_int("n_neighbors", 1, 30),
                    weights=trial.suggest_categorical("weights", ["uniform", "distance"]))

    @classmethod
    def search_space(cls, trial) -> dict:
        return cls._search_space(trial)  # no class weighting: kNN has none to tune


register_router(RouterFamily("knn", KNNRouter, "k nearest neighbours (examples/custom_router.py)"))

if __name__ == "__main__":
    table, args = table_from_args(__doc__.splitlines()[0])
    train, test = api.split(table, "random", test_size=0.3)
    routers = {name: api.fit(name, train) for name in ("knn", "dt", "lgbm")}
    scores = api.evaluate(routers, test)
    print(scores[["speedup", "violation_rate_any", "latency_capture", "oracle_match",
                  "overhead_p50_us"]].round(3).to_string())
    print("knn decisions run through its scikit-learn pipeline:",
          routers["knn"].compile() is None and routers["knn"].compile_reason_)
