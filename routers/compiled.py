"""Compiled routers: a learned decision for the price of a few comparisons.

The study's learned routers cost 4.5-50 ms per decision because each went through
a pandas row and a scikit-learn pipeline. :func:`compile` turns a fitted router
into packed nodes run by a small C kernel (``routers/native/kernels.c``, built
once with the system C compiler against this Python's headers and cached; it is
both a CPython extension, for single decisions, and a ctypes library, for batches):

* decision trees and random forests: node arrays; features compared as float32,
  leaf class-probability vectors normalised and averaged in the same order as
  scikit-learn, so predictions are identical;
* LightGBM: the booster's dumped trees, raw scores summed per class;
* logistic regression: one dot product per class with the standard scaling
  folded into the weights and the one-hot categories as weight columns.

Tree ensembles stop early, exactly: once no remaining tree can change the leading
class (per-class suffix sums of leaf maxima/minima bound what is left), the loop
ends; the answer is the one the full ensemble gives.

The compiled object keeps the estimator API (``predict``; ``classes_``) and adds
``route(request)``: feature extraction and prediction from a raw request in one
CPython fast call (the request's fields are read in C). Unseen categories encode as all-zero one-hot columns, as the pipeline's
``OneHotEncoder(handle_unknown="ignore")`` does.
"""

from __future__ import annotations

import ctypes
import functools
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
    lib = ctypes.CDLL(str(_build()))
    lib.register_model.restype = ctypes.c_int
    lib.register_model.argtypes = [ctypes.c_int] * 8 + [_I32, _F64, _I32, _I32, _F64, _I32, _I32,
                                                          _F64, _F64, _F64, _F64]
    lib.route.restype = ctypes.c_int
    lib.route.argtypes = [ctypes.c_int] + [ctypes.c_double] * 5 + [ctypes.c_int, ctypes.c_int]
    lib.predict_batch.restype = None
    lib.predict_batch.argtypes = [ctypes.c_int, _F64, ctypes.c_long, _I32]
    _LIB = lib
    return lib


def _ptr(a, kind):
    return a.ctypes.data_as(kind) if a is not None else ctypes.cast(None, kind)


class CompiledRouter:
    """A fitted router as flat arrays in the C kernel. Build with :func:`compile`."""

    def __init__(self, source, kind: int, classes, n_num: int, fam_cats, suite_cats, arrays: dict):
        self.source = source
        self.kind = kind
        self.classes_ = np.asarray(classes, dtype=object)
        self.n_num = n_num
        self.fam_cats = list(fam_cats)
        self.suite_cats = list(suite_cats)
        self.fam_index = {c: i for i, c in enumerate(self.fam_cats)}
        self.suite_index = {c: i for i, c in enumerate(self.suite_cats)}
        self.n_features = n_num + len(self.fam_cats) + len(self.suite_cats)
        self._arrays = arrays  # kept alive: the kernel holds pointers into them
        a = arrays
        lib = library()
        self._route = lib.route
        self._batch = lib.predict_batch
        n_nodes = len(a["feature"]) if "feature" in a else 0
        self.handle = lib.register_model(
            kind, self.n_features, a["n_classes"], a.get("n_trees", 0), n_num, len(self.fam_cats),
            len(self.suite_cats), n_nodes, _ptr(a.get("feature"), _I32),
            _ptr(a.get("threshold"), _F64), _ptr(a.get("left"), _I32), _ptr(a.get("right"), _I32),
            _ptr(a.get("value"), _F64), _ptr(a.get("roots"), _I32), _ptr(a.get("tree_class"), _I32),
            _ptr(a.get("weights"), _F64), _ptr(a.get("bias"), _F64), _ptr(a.get("sufmax"), _F64),
            _ptr(a.get("sufmin"), _F64))
        if self.handle < 0:
            raise RuntimeError("compiled router: the kernel refused the model (over 4096 models in this process, "
                               "more than 64 classes or 512 features, or out of memory)")
        #: one decision from a raw request: a C-level partial over the extension's fast call
        self.route = functools.partial(
            extension().route_request, self.handle, tuple(self.classes_),
            self.fam_index if self.fam_cats else None, self.suite_index if self.suite_cats else None)

    # ------------------------------------------------------------- decisions
    def route_features(self, p, o, sp=0.0, cc=1.0, mp=0.0, family=None, suite=None) -> str:
        return self.classes_[self._route(self.handle, p, o, sp, cc, mp,
                                         self.fam_index.get(family or NONE_CATEGORY, -1),
                                         self.suite_index.get(suite or NONE_CATEGORY, -1))]

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
        self._batch(self.handle, _ptr(M, _F64), len(M), _ptr(out, _I32))
        return out

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


def _suffix_bounds(leaf_max: np.ndarray, leaf_min: np.ndarray) -> dict:
    """Per tree position t and class k: the most / least the trees t.. can still add."""
    zero = np.zeros((1, leaf_max.shape[1]))
    sufmax = np.vstack([np.cumsum(leaf_max[::-1], axis=0)[::-1], zero])
    sufmin = np.vstack([np.cumsum(leaf_min[::-1], axis=0)[::-1], zero])
    return dict(sufmax=np.ascontiguousarray(sufmax.reshape(-1)),
                sufmin=np.ascontiguousarray(sufmin.reshape(-1)))


def _sklearn_trees(trees, n_classes):
    feature, threshold, left, right, value, roots = [], [], [], [], [], []
    offset = 0
    for t in trees:
        tr = t.tree_
        roots.append(offset)
        feature.append(np.where(tr.feature < 0, 0, tr.feature))
        threshold.append(tr.threshold)
        left.append(np.where(tr.children_left < 0, -1, tr.children_left + offset))
        right.append(np.where(tr.children_right < 0, -1, tr.children_right + offset))
        v = tr.value[:, 0, :n_classes].astype(np.float64)
        norm = v.sum(axis=1, keepdims=True)
        norm[norm == 0.0] = 1.0
        value.append(v / norm)
        offset += tr.node_count
    leaves = [(val[t.tree_.children_left < 0]) for val, t in zip(value, trees)]
    bounds = _suffix_bounds(np.array([lv.max(axis=0) for lv in leaves]),
                            np.array([lv.min(axis=0) for lv in leaves]))
    return dict(**bounds,feature=np.concatenate(feature).astype(np.int32),
                threshold=np.concatenate(threshold).astype(np.float64),
                left=np.concatenate(left).astype(np.int32),
                right=np.concatenate(right).astype(np.int32),
                value=np.ascontiguousarray(np.concatenate(value).reshape(-1)),
                roots=np.asarray(roots, dtype=np.int32), n_trees=len(trees), n_classes=n_classes)


def _lightgbm_trees(booster, n_features):
    dump = booster.dump_model()
    k = dump["num_tree_per_iteration"]
    feature, threshold, left, right, value, roots, tree_class = [], [], [], [], [], [], []

    def walk(node):
        idx = len(feature)
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
            left[idx] = walk(node["left_child"])
            right[idx] = walk(node["right_child"])
        else:
            value[idx] = float(node["leaf_value"])
        return idx

    leaf_max, leaf_min = [], []
    for i, info in enumerate(dump["tree_info"]):
        start = len(feature)
        roots.append(walk(info["tree_structure"]))
        tree_class.append(i % k)
        leaf = [value[j] for j in range(start, len(feature)) if left[j] < 0]
        hi, lo = np.zeros(k), np.zeros(k)
        hi[i % k], lo[i % k] = max(leaf), min(leaf)
        leaf_max.append(hi)
        leaf_min.append(lo)
    return dict(**_suffix_bounds(np.array(leaf_max), np.array(leaf_min)),feature=np.asarray(feature, np.int32), threshold=np.asarray(threshold, np.float64),
                left=np.asarray(left, np.int32), right=np.asarray(right, np.int32),
                value=np.asarray(value, np.float64), roots=np.asarray(roots, np.int32),
                tree_class=np.asarray(tree_class, np.int32), n_trees=len(roots), n_classes=k)


def compile(router) -> CompiledRouter:  # noqa: A001 - the issue's name for the entry point
    """Compile a fitted learned router (dt, rf, lr, lgbm) for the C kernel."""
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
        from routers.codegen import compile_tree

        comp = CompiledRouter(router, 0, classes, n_num, fam, suite, _sklearn_trees([clf], len(classes)))
        # single decisions: generated Python beats a C call for a handful of comparisons
        comp.route, comp.source_code = compile_tree(clf, classes, n_num, fam, suite)
        return comp
    if isinstance(clf, RandomForestClassifier):
        return CompiledRouter(router, 0, classes, n_num, fam, suite,
                              _sklearn_trees(clf.estimators_, len(classes)))
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
                              _lightgbm_trees(clf.booster_, n_features))
    raise TypeError(f"cannot compile {type(clf).__name__}")
