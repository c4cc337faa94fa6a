"""Fitted scikit-learn and LightGBM models read as plain descriptions
(:mod:`modeswitch.routers.fitted_state`), for a family's ``_estimator_state``.

Why here: reading a library's fitted model is the family's business (it knows what it
fitted); the compiler only reads the descriptions. A plug-in family of scikit-learn
trees describes itself with :func:`sklearn_trees` in one line.
"""

from __future__ import annotations

import numpy as np

from modeswitch.routers.fitted_state import LinearModel, Tree, TreeEnsemble


def sklearn_tree(estimator, n_classes: int) -> Tree:
    """A fitted scikit-learn classification tree (``tree_``), each leaf its class
    probabilities."""
    tr = estimator.tree_
    v = tr.value[:, 0, :n_classes].astype(np.float64)
    norm = v.sum(axis=1, keepdims=True)
    norm[norm == 0.0] = 1.0
    return Tree(tr.feature, tr.threshold, tr.children_left, tr.children_right, v / norm)


def sklearn_trees(estimators, n_classes: int) -> TreeEnsemble:
    """Classification trees whose probabilities are averaged (a random forest's
    ``estimators_``, extra trees', or one decision tree in a list)."""
    return TreeEnsemble(tuple(sklearn_tree(t, n_classes) for t in estimators), n_classes, "mean", True)


def _lightgbm_tree(structure, output: int, scale: float) -> Tree:
    """One dumped LightGBM tree as node arrays (iterative: deep trees are fine)."""
    feature, threshold, left, right, value = [], [], [], [], []
    todo = [(structure, -1, False)]  # (node, parent, is right child)
    while todo:
        node, parent, is_right = todo.pop()
        idx = len(feature)
        if parent >= 0:
            (right if is_right else left)[parent] = idx
        feature.append(0)
        threshold.append(0.0)
        left.append(-1)
        right.append(-1)
        value.append(0.0)
        if "split_index" in node:
            if node.get("decision_type", "<=") != "<=":
                raise ValueError("compiled LightGBM routers support numeric '<=' splits only")
            feature[idx] = node["split_feature"]
            threshold[idx] = float(node["threshold"])
            todo.append((node["right_child"], idx, True))
            todo.append((node["left_child"], idx, False))
        else:
            value[idx] = float(node["leaf_value"])
    return Tree(np.asarray(feature), np.asarray(threshold, np.float64), np.asarray(left), np.asarray(right),
                np.asarray(value, np.float64)[:, None] * scale, output)


def lightgbm_trees(booster, offset: int = 0, scale: float = 1.0) -> tuple[list[Tree], int]:
    """(a booster's trees, tree ``i`` scoring output ``offset + i % k``; k, its trees per
    iteration). ``scale`` multiplies every leaf: -1 negates a classifier's logit (exact:
    the negated sums are the sums negated); any other factor is exact to rounding (a
    cost router's ratio-based risk, :mod:`modeswitch.routers.families.cost`). One ``dump_model``
    call: it serialises the whole booster."""
    dump = booster.dump_model()
    k = dump["num_tree_per_iteration"]
    return [_lightgbm_tree(info["tree_structure"], offset + i % k, scale)
            for i, info in enumerate(dump["tree_info"])], k


def lightgbm_ensemble(booster) -> TreeEnsemble:
    """A LightGBM classifier's booster: raw scores summed per class."""
    trees, k = lightgbm_trees(booster)
    return TreeEnsemble(tuple(trees), k, "sum", False)


def linear_model(coef, intercept, scaler=None) -> LinearModel:
    """A fitted linear model (``coef_``, ``intercept_``) on inputs whose leading numeric
    columns a fitted ``StandardScaler`` standardised (None or "passthrough": raw)."""
    coef = np.atleast_2d(np.asarray(coef, np.float64))
    bias = np.ravel(np.asarray(intercept, np.float64))
    if scaler is None or isinstance(scaler, str):
        return LinearModel(coef, bias)
    return LinearModel(coef, bias, np.asarray(scaler.mean_, np.float64), np.asarray(scaler.scale_, np.float64))
