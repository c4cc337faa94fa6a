"""Structural checks of fitted trees, run before anything walks them.

A stored router is data from a file: a decision tree whose child indices point back up
(a cycle) makes every walk over it (the compiler's breadth-first layout, scikit-learn's
own ``predict``, LightGBM's ``dump_model``) loop or recurse for ever, and an index out of
range reads past the arrays. :func:`check_fitted_trees` finds every scikit-learn ``Tree``
and LightGBM ``Booster`` in a loaded router and refuses it, naming the tree and node,
unless each tree is a tree: children in range, every node reached from the root at
most once, split features in range and thresholds finite.

The check is vectorised and linear in the nodes: a tree whose internal nodes' children
are distinct, in range and never the root is walked from the root without revisiting
a node (each node has at most one parent), so no walk over it can loop.
"""

from __future__ import annotations

import numpy as np
from sklearn.tree._tree import Tree

from modeswitch.dataset.errors import InputError

#: scikit-learn's leaf marker in ``children_left`` / ``children_right``
SKLEARN_LEAF = -1


def check_tree_arrays(feature, threshold, left, right, n_features: int, where: str) -> None:
    """Refuse a tree given as node arrays (``left < 0`` marks a leaf; children index nodes)
    whose structure is not a finite tree rooted at node 0; ``where`` names it."""
    left, right = np.asarray(left, np.int64), np.asarray(right, np.int64)
    feature, threshold = np.asarray(feature), np.asarray(threshold, np.float64)
    n = len(left)
    if n == 0 or len(right) != n or len(feature) != n or len(threshold) != n:
        raise InputError(f"{where}: node arrays of unequal or zero length ({n}, {len(right)}, "
                         f"{len(feature)}, {len(threshold)})")
    internal = left >= 0
    if np.any(internal != (right >= 0)):
        node = int(np.flatnonzero(internal != (right >= 0))[0])
        raise InputError(f"{where}: node {node} has one child only")
    children = np.concatenate([left[internal], right[internal]])
    bad = (children <= 0) | (children >= n)
    if bad.any():
        raise InputError(f"{where}: a child index {int(children[bad][0])} outside 1..{n - 1}")
    if len(np.unique(children)) != len(children):
        raise InputError(f"{where}: a node is the child of two splits (a cycle or a shared "
                         "subtree): not a tree")
    f = feature[internal]
    if len(f) and (not np.all(np.isfinite(f)) or f.min() < 0 or f.max() >= n_features):
        raise InputError(f"{where}: a split on a feature outside 0..{n_features - 1}")
    if not np.all(np.isfinite(threshold[internal])):
        raise InputError(f"{where}: a split threshold that is not finite")


def check_sklearn_tree(tree, where: str) -> None:
    """A fitted ``sklearn.tree._tree.Tree``."""
    check_tree_arrays(tree.feature, tree.threshold, tree.children_left, tree.children_right,
                      int(tree.n_features), where)


def _lightgbm_fields(block: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in block.splitlines() if "=" in line)


def check_lightgbm_booster(booster, where: str) -> None:
    """Every tree of a LightGBM ``Booster``, read from its model text (LightGBM's own
    ``dump_model`` recurses through the children, so it must not see a cycle first).
    LightGBM numbers internal nodes 0.. and leaves ~child."""
    text = booster.model_to_string()
    head, _, rest = text.partition("\nTree=")
    n_features = int(_lightgbm_fields(head).get("max_feature_idx", "-1")) + 1
    for i, block in enumerate(rest.split("\nTree=") if rest else []):
        block = block.split("\nend of trees", 1)[0]
        f = _lightgbm_fields(block)
        try:
            n_leaves = int(f["num_leaves"])
            if n_leaves <= 1:
                continue
            split = [np.array(f[k].split(), dtype=np.float64)
                     for k in ("split_feature", "threshold", "left_child", "right_child")]
        except (KeyError, ValueError) as exc:
            raise InputError(f"{where} tree {i}: unreadable ({exc})") from None
        feature, threshold, lc, rc = split
        if not (len(lc) == len(rc) == n_leaves - 1) or not np.all(np.isfinite(lc)):
            raise InputError(f"{where} tree {i}: {len(lc)} splits for {n_leaves} leaves")
        lc, rc = lc.astype(np.int64), rc.astype(np.int64)
        leaves = np.concatenate([lc[lc < 0], rc[rc < 0]])
        if len(leaves) and (np.any(~leaves >= n_leaves) or len(np.unique(leaves)) != len(leaves)):
            raise InputError(f"{where} tree {i}: a leaf index out of range or reached twice")
        # as node arrays: internal nodes 0..s-1, leaf k at s + k
        s = n_leaves - 1
        left = np.where(lc >= 0, lc, s + ~lc)
        right = np.where(rc >= 0, rc, s + ~rc)
        pad = np.full(n_leaves, -1)
        check_tree_arrays(np.concatenate([feature, np.zeros(n_leaves)]),
                          np.concatenate([threshold, np.zeros(n_leaves)]),
                          np.concatenate([left, pad]), np.concatenate([right, pad]),
                          max(n_features, 1), f"{where} tree {i}")


def _objects(root, limit: int = 200_000):
    """Every object reachable from ``root`` through attributes and containers, once."""
    seen, todo = set(), [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None), np.ndarray)):
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            todo.extend(vars(obj).values())


def check_fitted_trees(router) -> int:
    """Check every tree a loaded router holds; the number of trees and boosters checked."""
    checked = 0
    for obj in _objects(router):
        if isinstance(obj, Tree):
            check_sklearn_tree(obj, f"stored tree #{checked}")
            checked += 1
        elif type(obj).__module__ == "lightgbm.basic" and type(obj).__name__ == "Booster":
            check_lightgbm_booster(obj, f"stored booster #{checked}")
            checked += 1
    return checked
