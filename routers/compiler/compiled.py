"""Compiled routers: a learned decision for the price of a few comparisons.

The study's learned routers cost 4.5-50 ms per decision because each went through
a pandas row and a scikit-learn pipeline. :func:`compile` turns a fitted router
into data for a small C kernel (``routers/compiler/native/kernels.c``, built once with the
system C compiler against this Python's headers and cached; it is both a CPython
extension, for single decisions, and a ctypes library, for batches):

* trees (decision trees, random forests, LightGBM): each feature's split thresholds
  become sorted cuts and a request becomes one bin per feature, so nodes are 8 bytes
  comparing small integers; scikit-learn's float32 comparisons and LightGBM's double
  ones are reproduced exactly;
* **region tree** (tree models): the ensemble's argmax is constant on large boxes of
  the bin grid; the kernel finds them (bounding each tree's reachable leaves per box,
  cutting undecided boxes where the training sample ``X_sample_`` lies first) and
  stores them as one tree per family x suite combination, so most decisions are a
  binary search per feature and one short walk, whatever the ensemble's size; boxes
  the budget (``REGION_NODES``, ``REGION_WORK``) leaves undecided walk the trees;
* **lockstep walk** (the fallback): groups of trees walk together, branch-free, with
  an exact early exit once no remaining tree can change the leading class (suffix
  sums of each tree's least leaf-by-leaf difference between two classes);
* logistic regression: one dot product per class with the standard scaling folded
  into the weights and the one-hot categories as weight columns.

Every path returns what the original model returns (scores summed in its own tree
order wherever a near-tie could depend on it); ``tests/test_compiled.py`` checks
this on held-out rows and on random inputs.

The compiled object keeps the estimator API (``predict``; ``classes_``) and adds
``route(request)``: feature extraction and prediction from a raw request in one
C call (the request's fields are read in C). Unseen categories encode as all-zero
one-hot columns, as the pipeline's ``OneHotEncoder(handle_unknown="ignore")`` does.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from dataset.features import CATEGORICAL_FEATURES, FEATURE_SET_A, NONE_CATEGORY
from routers.compiler.tree_checks import check_tree_arrays

_SRC = Path(__file__).parent / "native" / "kernels.c"
_LIB = None
_EXT = None
_I32 = ctypes.POINTER(ctypes.c_int32)
_F64 = ctypes.POINTER(ctypes.c_double)


def _cache_dir() -> Path:
    env = os.environ.get("MODESWITCH_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "modeswitch") / "native"


def _build() -> Path:
    src = _SRC.read_bytes()
    include = sysconfig.get_paths()["include"]
    tag = hashlib.sha256(src + include.encode()).hexdigest()[:12]
    out = _cache_dir() / f"kernels-{tag}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not out.exists():
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise RuntimeError("compiled routers need a C compiler (cc/gcc) on PATH; "
                               "use the uncompiled router instead (--no-compile)")
        if not Path(include, "Python.h").exists():
            raise RuntimeError(f"compiled routers need Python's C headers (Python.h not in {include}); "
                               "install the python3-dev package or use --no-compile")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_so = Path(tmp) / "k.so"
            res = subprocess.run([cc, "-O3", "-shared", "-fPIC", f"-I{include}", "-o", str(tmp_so),
                                  str(_SRC), "-lm"], capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"building {_SRC} failed:\n{res.stderr}")
            os.replace(tmp_so, out)
    return out


def extension():
    """The kernel as a CPython extension module (single decisions from request objects)."""
    global _EXT
    if _EXT is None:
        path = _build()
        loader = importlib.machinery.ExtensionFileLoader("_modeswitch_kernels", str(path))
        spec = importlib.util.spec_from_file_location("_modeswitch_kernels", str(path), loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        _EXT = mod
    return _EXT


def library():
    """Build (once, cached by source hash) and load the C kernel through ctypes."""
    global _LIB
    if _LIB is not None:
        return _LIB
    extension()  # one build, one load: the extension and ctypes share the model table
    lib = ctypes.CDLL(str(_build()))  # releases the GIL during calls: batches, region builds
    # the model table changes under the GIL only (registration here, release when a
    # router object is garbage), so two threads compiling at once cannot race
    lib.register_model = ctypes.PyDLL(str(_build())).register_model
    lib.release_model.restype = None
    lib.release_model.argtypes = [ctypes.c_int]
    lib.register_model.restype = ctypes.c_int
    lib.register_model.argtypes = [ctypes.c_int] * 9 + [ctypes.c_void_p, _F64, _I32, _I32, _I32, _I32,
                                                          _F64, _I32, _I32, _F64, _F64, _F64]
    lib.set_output_ranges.restype = ctypes.c_int
    lib.set_output_ranges.argtypes = [ctypes.c_int, _I32]
    lib.set_cost_decision.restype = ctypes.c_int
    lib.set_cost_decision.argtypes = [ctypes.c_int] * 4 + [ctypes.c_double] * 2
    lib.shape_features.restype = None
    lib.shape_features.argtypes = [ctypes.c_double] * 5 + [_F64]
    lib.build_region.restype = ctypes.c_long
    lib.build_region.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_long, _F64, ctypes.c_long]
    lib.region_walk_share.restype = ctypes.c_double
    lib.region_walk_share.argtypes = [ctypes.c_int]
    lib.region_hits.restype = ctypes.c_long
    lib.region_hits.argtypes = [ctypes.c_int, _F64, ctypes.c_long]
    lib.predict_batch.restype = None
    lib.predict_batch.argtypes = [ctypes.c_int, _F64, ctypes.c_long, _I32]
    if lib.node_size() != NODE.itemsize:
        raise RuntimeError(f"kernel node layout ({lib.node_size()} bytes) differs from {NODE}")
    _LIB = lib
    return lib


#: region-tree budget: nodes, and tree nodes visited while building (~1 ns each)
REGION_NODES = 1 << 17
REGION_WORK = 2_000_000_000

#: one packed tree node, as the kernel's ``Node``: the split is ``bin[feature] <= threshold``
#: (an index into the feature's sorted cuts); the right child is ``left + 1``
NODE = np.dtype([("threshold", "<u2"), ("feature", "<u2"), ("left", "<i4")])


def _ptr(a, kind):
    return a.ctypes.data_as(kind) if a is not None else ctypes.cast(None, kind)


class CompiledRouter:
    """A fitted router as flat arrays in the C kernel. Build with :func:`compile`."""

    def __init__(self, source, kind: int, classes, n_num: int, fam_cats, suite_cats, arrays: dict,
                 region_budget: tuple | None = None):
        self.source = source
        self.kind = kind
        self.classes_ = np.asarray(classes, dtype=object)
        self.n_num = n_num
        self.fam_cats = list(fam_cats)
        self.suite_cats = list(suite_cats)
        self.fam_index = {c: i for i, c in enumerate(self.fam_cats)}
        self.suite_index = {c: i for i, c in enumerate(self.suite_cats)}
        self.n_features = n_num + len(self.fam_cats) + len(self.suite_cats)
        a = arrays  # copied by the kernel; not kept here
        lib = library()
        self._lib = lib
        nodes = a.get("nodes")
        self.handle = lib.register_model(
            kind, self.n_features, a["n_classes"], a.get("n_trees", 0), a.get("n_real_trees", 0), n_num,
            len(self.fam_cats), len(self.suite_cats), len(nodes) if nodes is not None else 0,
            nodes.ctypes.data if nodes is not None else None, _ptr(a.get("value"), _F64),
            _ptr(a.get("roots"), _I32), _ptr(a.get("steps"), _I32), _ptr(a.get("tree_class"), _I32),
            _ptr(a.get("position"), _I32), _ptr(a.get("cuts"), _F64), _ptr(a.get("cut_start"), _I32),
            _ptr(a.get("cut_count"), _I32), _ptr(a.get("weights"), _F64), _ptr(a.get("bias"), _F64),
            _ptr(a.get("sufdiff"), _F64))
        if self.handle < 0:
            raise RuntimeError("compiled router: the kernel refused the model (over 4096 models alive in this "
                               "process, more than 256 outputs or 512 features, or out of memory)")
        cost = a.get("cost")  # the cost decision over per-mode outputs (cost-predicting routers)
        if cost is not None and lib.set_cost_decision(self.handle, cost["n_modes"], cost["n_constraints"],
                                                      cost["ref"], cost["threshold"], cost["cut"]) < 0:
            lib.release_model(self.handle)
            raise RuntimeError("compiled router: the kernel refused the cost decision's layout")
        starts = a.get("out_start")
        if starts is not None and lib.set_output_ranges(self.handle, _ptr(starts, _I32)) < 0:
            lib.release_model(self.handle)
            raise RuntimeError("compiled router: the kernel refused the outputs' tree ranges")
        #: the model's owner in the kernel: a builtin function making one decision from a raw
        #: request in one C call; the model is freed when this object is garbage
        self._owner = extension().make_router(
            self.handle, tuple(self.classes_), self.fam_index if self.fam_cats else None,
            self.suite_index if self.suite_cats else None)
        self.route = self._owner
        #: tree models: nodes of the region tree (the argmax as one tree over numeric bins)
        #: and the share of the bin grid it leaves undecided (those decisions walk the trees)
        self.region_nodes_, self.region_walk_share_ = 0, 1.0
        region_budget = region_budget or (REGION_NODES, REGION_WORK)
        if kind != 2 and region_budget[0] > 0:
            sample = getattr(source, "X_sample_", None)
            if sample is not None and np.shape(sample)[1:] != (self.n_features,):
                sample = None  # not the kernel's layout: spend the budget by volume alone
            sample = None if sample is None else np.ascontiguousarray(sample, dtype=np.float64)
            got = lib.build_region(self.handle, int(region_budget[0]), int(region_budget[1]),
                                   _ptr(sample, _F64), 0 if sample is None else len(sample))
            if got == -2:
                raise MemoryError("compiled router: out of memory building the region tree")
            self.region_nodes_ = max(0, got)
            self.region_walk_share_ = lib.region_walk_share(self.handle)

    # ------------------------------------------------------------- decisions
    def matrix(self, X) -> np.ndarray:
        """The kernel's input matrix (numeric features + one-hot) from a feature frame or array."""
        if hasattr(X, "columns"):
            num = X[list(FEATURE_SET_A)[: self.n_num]].to_numpy(dtype=np.float64)
            parts = [num]
            for cats, col in ((self.fam_cats, "family"), (self.suite_cats, "benchmark_suite")):
                if cats:
                    vals = X[col].fillna(NONE_CATEGORY).astype(str).to_numpy()
                    parts.append((vals[:, None] == np.asarray(cats, dtype=object)[None, :]).astype(np.float64))
            return np.ascontiguousarray(np.hstack(parts))
        X = np.ascontiguousarray(np.asarray(X, dtype=np.float64))
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected a 2-D array with {self.n_features} columns")
        return X

    def predict_matrix(self, M: np.ndarray) -> np.ndarray:
        """Class indices for a ready input matrix (the batch path)."""
        out = np.empty(len(M), dtype=np.int32)
        self._lib.predict_batch(self.handle, _ptr(M, _F64), len(M), _ptr(out, _I32))
        if len(out) and out.min() < 0:
            raise MemoryError("compiled router: out of memory")
        return out

    def region_share(self, X) -> float:
        """Share of the rows the region tree decides without walking the trees."""
        M = self.matrix(X)
        if not len(M) or not self.region_nodes_:
            return 0.0
        return self._lib.region_hits(self.handle, _ptr(M, _F64), len(M)) / len(M)

    def predict(self, X) -> np.ndarray:
        return self.classes_[self.predict_matrix(self.matrix(X))]


# ------------------------------------------------------------------ builders
def _layout(router):
    """(numeric feature count, family categories, suite categories) of a fitted router."""
    prep = router.pipeline_.named_steps["prep"]
    num_cols, fam, suite = 0, [], []
    for name, trans, cols in prep.transformers_:
        if name == "num":
            num_cols = len(cols)
            if isinstance(cols, list) and cols and isinstance(cols[0], str) and \
                    list(cols) != list(FEATURE_SET_A)[: len(cols)]:
                raise ValueError("compiled routers expect feature set A's column order")
        elif name == "cat":
            enc = trans
            for c, cats in zip(cols, enc.categories_):
                if c == CATEGORICAL_FEATURES[0]:
                    fam = [str(x) for x in cats]
                else:
                    suite = [str(x) for x in cats]
    return num_cols, fam, suite


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


def _pack(trees, n_features: int, n_classes: int, width: int, window: int = 4, bounds: bool = True) -> dict:
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


def _sklearn_trees(trees, n_classes, n_features):
    packed = []
    for t in trees:
        tr = t.tree_
        v = tr.value[:, 0, :n_classes].astype(np.float64)
        norm = v.sum(axis=1, keepdims=True)
        norm[norm == 0.0] = 1.0
        packed.append((tr.feature, tr.threshold, tr.children_left, tr.children_right, v / norm, 0))
    return _pack(packed, n_features, n_classes, n_classes)


def _lightgbm_tree(structure):
    """One dumped LightGBM tree as (feature, threshold, left, right, value[:, None]) arrays."""
    feature, threshold, left, right, value = [], [], [], [], []
    todo = [(structure, -1, False)]  # (node, parent, is right child): iterative, deep trees are fine
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
    return (np.asarray(feature), np.asarray(threshold, np.float64), np.asarray(left), np.asarray(right),
            np.asarray(value, np.float64)[:, None])


def _lightgbm_packed(booster, offset: int = 0, sign: float = 1.0) -> tuple[list, int]:
    """(a booster's trees as ``_pack`` input, scoring outputs ``offset + tree % k``; k, its
    trees per iteration). ``sign`` -1 negates every leaf (exact: the negated sums are the
    sums negated). One ``dump_model`` call: it serialises the whole booster."""
    dump = booster.dump_model()
    k = dump["num_tree_per_iteration"]
    out = []
    for i, info in enumerate(dump["tree_info"]):
        f, t, le, ri, v = _lightgbm_tree(info["tree_structure"])
        out.append((f, t, le, ri, v * sign, offset + i % k))
    return out, k


def _lightgbm_trees(booster, n_features):
    packed, k = _lightgbm_packed(booster)
    return _pack(packed, n_features, k, 1)


def compile(router, region_budget: tuple | None = None) -> CompiledRouter:  # noqa: A001 - the issue's name
    """Compile a fitted learned router (dt, rf, lr, lgbm) for the C kernel.

    ``region_budget``: (nodes, work) for the region tree of tree models; default
    (``REGION_NODES``, ``REGION_WORK``); nodes 0 = no region tree (always walk)."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    if getattr(router, "safety_threshold", None) is not None:
        raise ValueError("routers with a safety guard are not compiled yet; compile without it")
    clf = router.pipeline_.named_steps["clf"]
    n_num, fam, suite = _layout(router)
    n_features = n_num + len(fam) + len(suite)
    classes = router.classes_
    if isinstance(clf, DecisionTreeClassifier):
        from routers.compiler.codegen import compile_tree

        comp = CompiledRouter(router, 0, classes, n_num, fam, suite, _sklearn_trees([clf], len(classes), n_features), region_budget)
        # single decisions: generated Python beats a C call for a handful of comparisons
        comp.route, comp.source_code = compile_tree(clf, classes, n_num, fam, suite)
        return comp
    if isinstance(clf, RandomForestClassifier):
        return CompiledRouter(router, 0, classes, n_num, fam, suite,
                              _sklearn_trees(clf.estimators_, len(classes), n_features), region_budget)
    if isinstance(clf, LogisticRegression):
        scaler = router.pipeline_.named_steps["prep"].named_transformers_["num"]
        coef, bias = clf.coef_.astype(np.float64), clf.intercept_.astype(np.float64)
        if scaler != "passthrough":
            mu, sd = scaler.mean_, scaler.scale_
            w_num = coef[:, :n_num] / sd
            bias = bias - (coef[:, :n_num] * (mu / sd)).sum(axis=1)
            coef = np.hstack([w_num, coef[:, n_num:]])
        return CompiledRouter(router, 2, classes, n_num, fam, suite,
                              dict(weights=np.ascontiguousarray(coef), bias=bias, n_classes=coef.shape[0]))
    if type(clf).__name__ == "LGBMClassifier":
        return CompiledRouter(router, 1, classes, n_num, fam, suite,
                              _lightgbm_trees(clf.booster_, n_features), region_budget)
    raise TypeError(f"cannot compile {type(clf).__name__}")


def _logit(p: float) -> float:
    if p <= 0:
        return -np.inf
    if p >= 1:
        return np.inf
    return float(np.log(p / (1 - p)))


def compile_cost(router, region_budget: tuple | None = None) -> CompiledRouter:
    """Compile a fitted cost-predicting router (``cost_linear``, ``cost_lgbm``; feature
    set A) for the kernel's cost decision.

    Outputs: each mode's predicted log latency ratio, then each (mode, constraint)'s
    risk logit. The linear variant is kind 2 (the scaling folded into the weights);
    the LightGBM variant packs every regressor's and classifier's trees into one
    ensemble (kind 1, each tree scoring its own output) and gets a region tree like
    any tree model, cut until one mode is surely allowed and surely fastest. A model
    that predicts a constant (too few rows, one class) becomes the output's bias; a
    constant risk is compared with the threshold here, once."""
    from routers.cost_predicting import CONSTRAINTS, LightGBMCostRouter, LinearCostRouter, _Constant

    if router.feature_set != "A":
        raise ValueError("compiled cost-predicting routers take feature set A (numbers only)")
    modes, ref = list(router.modes_), router.reference_
    M, C = len(modes), len(CONSTRAINTS)
    K, d = M * (1 + C), len(FEATURE_SET_A)
    thr = float(router.threshold_)

    def const_logit(p: float) -> float:  # decided now: allowed (-inf) or not (+inf)
        return -np.inf if p <= thr else np.inf

    bias = np.zeros(K)
    cost = dict(n_modes=M, n_constraints=C, ref=modes.index(ref), threshold=thr, cut=_logit(thr))
    # every output's model: (output index, model, sign of its logit); a constant model
    # is its output's bias (a ratio as it is, a risk decided against the threshold now)
    fitted = []
    for j, m in enumerate(modes):
        if m == ref:
            continue
        outputs = [(j, router.ratio_models_[m], None)]
        outputs += [(M + j * C + c, router.risk_models_[m][name], None) for c, name in enumerate(CONSTRAINTS)]
        for k, mdl, _ in outputs:
            if isinstance(mdl, _Constant):
                bias[k] = mdl.value if k < M else const_logit(mdl.value)
            else:  # a risk's logit is of P(True): classes_[1] True, else negated
                fitted.append((k, mdl, 1.0 if k < M or mdl.classes_[1] else -1.0))
    if isinstance(router, LinearCostRouter):
        sc = router.prep_.named_transformers_["num"]
        mu, sd = sc.mean_, sc.scale_
        W = np.zeros((K, d))
        for k, mdl, sign in fitted:  # the scaling folded into the weights
            coef = sign * np.ravel(np.asarray(mdl.coef_, float))
            intercept = sign * float(np.ravel(mdl.intercept_)[0])
            W[k] = coef / sd
            bias[k] = intercept - (coef * mu / sd).sum()
        arrays = dict(weights=np.ascontiguousarray(W), bias=bias, n_classes=K, cost=cost)
        return CompiledRouter(router, 2, modes, d, [], [], arrays)
    if isinstance(router, LightGBMCostRouter):
        if not fitted:  # every model a constant: the biases are the whole decision
            return CompiledRouter(router, 2, modes, d, [], [],
                                  dict(weights=np.zeros((K, d)), bias=bias, n_classes=K, cost=cost))
        # sorted by output: each output's trees are one run, in its model's order
        packed = [t for k, mdl, sign in sorted(fitted, key=lambda f: f[0])
                  for t in _lightgbm_packed(mdl.booster_, k, sign)[0]]
        arrays = _pack(packed, d, K, 1, bounds=False)
        counts = np.bincount([t[5] for t in packed], minlength=K)
        arrays.update(bias=bias, cost=cost, out_start=np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        return CompiledRouter(router, 1, modes, d, [], [], arrays, region_budget)
    raise TypeError(f"cannot compile {type(router).__name__}")


def kernel_shape_features(p, o, sp, cc, mp) -> tuple:
    """Feature set A as the C kernel computes it from a request's raw numbers (what its
    single decisions read); tested against :data:`dataset.features.FEATURE_FORMULAS`."""
    out = np.empty(len(FEATURE_SET_A), dtype=np.float64)
    library().shape_features(float(p), float(o), float(sp), float(cc), float(mp), _ptr(out, _F64))
    return tuple(float(v) for v in out)
