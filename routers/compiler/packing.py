"""Models laid out as the C kernel's flat arrays (:mod:`modeswitch.routers.compiler.kernel`).

:func:`pack` turns a :class:`~modeswitch.routers.fitted_state.FittedState` into the kernel's model
kind and arrays: tree ensembles become binned nodes walked in lockstep
(:func:`pack_trees`), linear models one weight matrix with the standardisation folded
in (:func:`pack_linear`), a cost decision its parameters. It reads only the
plain-data descriptions, so a new family compiles by describing its model.
"""

from __future__ import annotations

import numpy as np

from modeswitch.routers.compiler.kernel import NODE, library
from modeswitch.routers.compiler.tree_checks import check_tree_arrays
from modeswitch.routers.fitted_state import (
    CostDecision,
    FittedState,
    LinearModel,
    TreeEnsemble,
    cut_logit,
)

#: the kernel's model kinds: averaged trees on float32 inputs (scikit-learn), summed
#: trees on doubles (LightGBM), a linear model
AVERAGED_TREES, SUMMED_TREES, LINEAR = 0, 1, 2

#: early exit needs (trees + 1) x classes^2 bounds; above this many the walk runs every tree
MAX_BOUNDS = 4_000_000


def _suffix_bounds(pair_min: list, n_classes: int) -> dict:
    """``sufdiff[t, j, k]``: the least trees t.. can add to score_j - score_k, leaf by leaf
    (``pair_min[t][j, k]`` = min over tree t's leaves of value_j - value_k)."""
    if not pair_min or (len(pair_min) + 1) * n_classes * n_classes > MAX_BOUNDS:
        return {}
    d = np.asarray(pair_min).reshape(-1, n_classes, n_classes)
    suf = np.concatenate([np.cumsum(d[::-1], axis=0)[::-1], np.zeros((1, n_classes, n_classes))])
    return dict(sufdiff=np.ascontiguousarray(suf.reshape(-1)))


def _breadth_first(left, right) -> tuple[np.ndarray, int]:
    """(slot of each node in breadth-first order with siblings adjacent, tree depth)."""
    slot = np.empty(len(left), dtype=np.int64)
    slot[0], nxt, level, depth = 0, 1, [0], 0
    while True:
        children = [c for n in level if left[n] >= 0 for c in (left[n], right[n])]
        if not children:
            return slot, depth
        slot[children] = np.arange(nxt, nxt + len(children))
        nxt += len(children)
        level, depth = children, depth + 1


def pack_trees(trees, n_features: int, n_classes: int, width: int, window: int = 4, bounds: bool = True) -> dict:
    """Pack trees for the kernel's lockstep walk over binned inputs.

    ``trees``: per tree ``(feature, threshold, left, right, value, cls)`` with local
    node indices (``left < 0`` marks a leaf), ``value`` one row of ``width`` numbers per
    node, ``cls`` the class a LightGBM tree scores (0 for scikit-learn trees).

    * Each tree is laid out breadth-first so siblings are adjacent (right = left + 1);
      a leaf points to itself through the constant slot ``n_features`` (bin 0) with
      threshold index 0xFFFF.
    * Thresholds become indexes into the feature's sorted distinct thresholds (cuts).
    * Within each run of ``window`` groups, trees are walked deepest first, so trees of
      similar depth share a group and each group walks as many steps as its deepest
      tree; ``position[o]`` maps original tree ``o`` to its walk position (the kernel
      sums in the original order when it walks every tree). Padding: one zero-valued
      leaf tree."""
    group = library().group_size()
    n_real = len(trees)
    for i, (feature, threshold, left, right, _, _) in enumerate(trees):
        check_tree_arrays(feature, threshold, left, right, n_features, f"tree {i}")
    layouts = [_breadth_first(left, right) for _, _, left, right, _, _ in trees]
    span = window * group
    walk = [o for w in range(0, n_real, span)
            for o in sorted(range(w, min(w + span, n_real)), key=lambda o: -layouts[o][1])]
    pad = (-n_real) % group
    n_nodes = sum(len(t[0]) for t in trees) + 1
    feat = np.zeros(n_nodes, np.int64)
    thr = np.full(n_nodes, np.inf)
    lft = np.zeros(n_nodes, np.int64)
    value = np.zeros((n_nodes, width))
    roots, steps_d, tree_class, pair_min = [], [], [], []
    nxt = 0
    for o in walk:
        feature, threshold, left, right, val, cls = trees[o]
        slot, depth = layouts[o]
        new = nxt + slot  # local index -> packed index
        nxt += len(slot)
        internal = np.asarray(left) >= 0
        feat[new] = np.where(internal, feature, n_features)
        thr[new] = np.where(internal, threshold, np.inf)
        lft[new] = np.where(internal, new[np.where(internal, left, 0)], new)
        value[new] = val
        roots.append(new[0])
        steps_d.append(depth)
        tree_class.append(cls)
        if not bounds:  # no early exit (the cost decision is not an argmax)
            continue
        leaves = np.asarray(val)[~internal]
        if width != n_classes:  # a LightGBM tree adds its value to its own class only
            one = np.zeros((len(leaves), n_classes))
            one[:, cls] = leaves[:, 0]
            leaves = one
        pair_min.append((leaves[:, :, None] - leaves[:, None, :]).min(axis=0))
    dummy = n_nodes - 1  # the padding tree: one leaf, value 0
    feat[dummy], lft[dummy] = n_features, dummy
    roots += [dummy] * pad
    steps_d += [0] * pad
    tree_class += [0] * pad
    if bounds:
        pair_min += [np.zeros((n_classes, n_classes))] * pad

    # thresholds -> bins: per feature, the sorted distinct thresholds its splits use
    cuts, cut_start, cut_count = [], np.zeros(n_features, np.int32), np.zeros(n_features, np.int32)
    tidx = np.full(n_nodes, 0xFFFF, np.int64)
    start = 0
    for f in range(n_features):
        sel = feat == f
        c = np.unique(thr[sel])
        if len(c) >= 0xFFFF:
            raise ValueError(f"feature {f} has {len(c)} distinct split thresholds; the kernel takes "
                             f"at most {0xFFFF - 1}")
        tidx[sel] = np.searchsorted(c, thr[sel])
        cuts.append(c)
        cut_start[f], cut_count[f] = start, len(c)
        start += len(c)
    nodes = np.zeros(n_nodes, dtype=NODE)
    nodes["threshold"], nodes["feature"], nodes["left"] = tidx, feat, lft
    position = np.empty(n_real, np.int32)
    position[np.asarray(walk, dtype=np.int64)] = np.arange(n_real, dtype=np.int32)
    steps = np.asarray(steps_d).reshape(-1, group).max(axis=1) if steps_d else np.zeros(0)
    return dict(**_suffix_bounds(pair_min, n_classes), nodes=nodes,
                value=np.ascontiguousarray(value.reshape(-1)),
                roots=np.asarray(roots, np.int32), steps=np.asarray(steps, np.int32),
                tree_class=np.asarray(tree_class, np.int32), position=position,
                cuts=np.concatenate(cuts) if cuts else np.zeros(0), cut_start=cut_start,
                cut_count=cut_count, n_trees=len(roots), n_real_trees=n_real, n_classes=n_classes)


def pack_linear(model: LinearModel, n_numeric: int) -> dict:
    """One weight row per output on the raw inputs: a standardisation of the numeric
    columns, ``(x - mean) / scale``, is folded into the weights and the bias."""
    W = np.atleast_2d(np.asarray(model.weights, np.float64))
    bias = np.asarray(model.bias, np.float64).reshape(-1).copy()
    if model.mean is not None:
        mu, sd = np.asarray(model.mean, np.float64), np.asarray(model.scale, np.float64)
        n = len(mu)
        if n > n_numeric:
            raise ValueError(f"a standardisation of {n} columns over {n_numeric} numeric inputs")
        bias = bias - (W[:, :n] * mu / sd).sum(axis=1)
        W = np.hstack([W[:, :n] / sd, W[:, n:]])
    return dict(weights=np.ascontiguousarray(W), bias=bias, n_classes=W.shape[0])


def _cost_arrays(cost: CostDecision) -> dict:
    return dict(n_modes=cost.n_modes, n_constraints=cost.n_constraints, ref=cost.reference,
                threshold=float(cost.threshold), cut=cut_logit(float(cost.threshold)))


def _tree_kind(model: TreeEnsemble) -> int:
    if model.combine == "mean" and model.float32_inputs:
        return AVERAGED_TREES
    if model.combine == "sum" and not model.float32_inputs:
        return SUMMED_TREES
    raise TypeError(f"the kernel walks averaged trees on float32 inputs or summed trees on doubles, "
                    f"not {model.combine!r} trees on {'float32' if model.float32_inputs else 'double'} inputs")


def pack(state: FittedState) -> tuple[int, dict]:
    """(kernel model kind, arrays) for a fitted router's description."""
    model, cost, n_features = state.model, state.decision, state.layout.n_features
    if isinstance(model, LinearModel):
        arrays = pack_linear(model, state.layout.n_numeric)
        if arrays["weights"].shape[1] != n_features:
            raise ValueError(f"linear model over {arrays['weights'].shape[1]} inputs; the layout has {n_features}")
        kind = LINEAR
    elif isinstance(model, TreeEnsemble):
        kind = _tree_kind(model)
        trees = list(model.trees)
        if cost is not None:  # each output's trees one run, in their own order (stable sort)
            trees.sort(key=lambda t: t.output)
        width = model.n_outputs if kind == AVERAGED_TREES else 1
        arrays = pack_trees([(t.feature, t.threshold, t.left, t.right, t.value, t.output) for t in trees],
                            n_features, model.n_outputs, width, bounds=cost is None)
        if model.bias is not None:
            arrays["bias"] = np.asarray(model.bias, np.float64)
        if cost is not None:
            counts = np.bincount([t.output for t in trees], minlength=model.n_outputs)
            arrays["out_start"] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    else:
        raise TypeError(f"cannot compile a {type(model).__name__}: describe the model as a "
                        "TreeEnsemble or a LinearModel (routers.fitted_state)")
    if cost is not None:
        arrays["cost"] = _cost_arrays(cost)
    return kind, arrays
