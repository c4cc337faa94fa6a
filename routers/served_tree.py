"""A certified router's served decision, distilled into one tree per threshold.

Why: a cost-predicting LightGBM router (one output per mode and per risk: thousands
of trees) decides in tens of microseconds where its region tree leaves boxes
undecided, so its compiled decision is distilled into one tree
(:mod:`modeswitch.routers.compiler.distil`). A certificate (Learn then Test) holds for the
decisions it was computed on; a tree distilled *after* certifying would be another
router, not covered by it. So here the tree is part of the certified router: for
each candidate threshold t, one tree is fitted to the router's decisions at t on its
training sample and synthetic rows around it, never on calibration rows, so every
candidate is fixed before the calibration is seen, as Learn then Test needs; the
certification then counts the violations of those trees' picks, and the tree at the
certified threshold is what the router predicts, compiles and serves.

The router's scores on those rows are computed once; a tree per tested threshold
costs one fit of a scikit-learn tree (a fraction of a second on 22,000 rows).
"""

from __future__ import annotations

import numpy as np

from modeswitch.routers.compiler import compile_state
from modeswitch.routers.compiler.distil import check_rows, distil_rows, fit_tree
from modeswitch.routers.compiler.router import DISTIL_WALKED_TREES, walked_trees
from modeswitch.routers.fitted_state import TreeEnsemble


def needs_tree(router) -> bool:
    """Whether ``router``'s compiled decision would be distilled (a tree ensemble whose
    decisions walk more than ``DISTIL_WALKED_TREES`` trees on its training sample) and
    it can say its decision at any threshold from input rows (``row_scores``,
    ``decide_scores``: the cost-predicting routers)."""
    if not (hasattr(router, "row_scores") and hasattr(router, "decide_scores")):
        return False
    try:
        state = router.fitted_state()
    except (ValueError, TypeError):  # e.g. feature set B: not compiled at all
        return False
    model, sample = state.model, state.sample
    if not isinstance(model, TreeEnsemble) or len(model.trees) < 2 or sample is None \
            or np.shape(sample)[1:] != (state.layout.n_features,) or not len(sample):
        return False
    comp = compile_state(state, distil="never")
    return walked_trees(comp, state) > DISTIL_WALKED_TREES


class ThresholdTrees:
    """Trees deciding as ``router`` does at each threshold asked for (the last few kept)."""

    def __init__(self, router, random_state: int = 0):
        self.router = router
        self.random_state = random_state
        self.template = router.fitted_state()
        self.rows = distil_rows(self.template.sample, self.template.layout.n_numeric, random_state)
        self.scores = router.row_scores(self.rows)
        self._trees: dict = {}

    def decisions(self, threshold, rows=None) -> np.ndarray:
        scores = self.scores if rows is None else self.router.row_scores(rows)
        return np.asarray(self.router.decide_scores(*scores, threshold), dtype=int)

    def tree(self, threshold):
        if threshold not in self._trees:
            if len(self._trees) > 4:  # the sequence walks forward: older ones are done with
                self._trees.pop(next(iter(self._trees)))
            self._trees[threshold] = fit_tree(self.rows, self.decisions(threshold), self.random_state)
        return self._trees[threshold]

    def picks(self, threshold, F) -> np.ndarray:
        """Mode indices (into the router's ``modes_``) the tree at ``threshold`` picks for rows ``F``."""
        return np.asarray(self.tree(threshold).predict(np.asarray(F, dtype=np.float64)), dtype=int)

    def report(self, threshold, F_cal) -> dict:
        """Size and agreement with the router at ``threshold``: on its training sample,
        on fresh synthetic rows, and on the calibration rows ``F_cal``."""
        tree = self.tree(threshold)
        sample = np.ascontiguousarray(self.template.sample, dtype=np.float64)
        check = check_rows(sample, self.template.layout.n_numeric, self.random_state)
        F_cal = np.asarray(F_cal, dtype=np.float64)

        def agree(F):
            return float((tree.predict(F) == self.decisions(threshold, F)).mean()) if len(F) else float("nan")

        return {"source_trees": len(self.template.model.trees), "nodes": int(tree.tree_.node_count),
                "depth": int(tree.tree_.max_depth), "agreement_train": agree(sample),
                "agreement_synthetic": agree(check), "agreement_calibration": agree(F_cal)}

