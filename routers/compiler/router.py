"""The compiled router: a fitted router's description registered in the C kernel.

:func:`compile` asks a router for its :class:`~modeswitch.routers.fitted_state.FittedState`
(``router.fitted_state()``), packs it (:mod:`modeswitch.routers.compiler.packing`) and registers it
in the kernel (:mod:`modeswitch.routers.compiler.kernel`); a single averaged tree also becomes
generated Python (:mod:`modeswitch.routers.compiler.codegen`), faster than a C call for a handful
of comparisons. :class:`CompiledRouter` keeps the estimator API (``predict``,
``classes_``) and adds ``route(request)``: features and decision from a raw request
in one call.
"""

from __future__ import annotations

import numpy as np

from modeswitch.dataset.content_features import (
    CONTENT_FEATURES,
    SHARE_FEATURES,
    SHARE_TOKENS,
    TAIL_TOKENS,
)
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import FEATURE_SET_A, NONE_CATEGORY
from modeswitch.routers.compiler.codegen import compile_tree
from modeswitch.routers.compiler.distil import distil as distil_state
from modeswitch.routers.compiler.kernel import F64, I32, I64, extension, library, pointer
from modeswitch.routers.compiler.packing import LINEAR, pack
from modeswitch.routers.fitted_state import FittedState, TreeEnsemble

#: region-tree budget: nodes, and tree nodes visited while building (~1 ns each)
REGION_NODES = 1 << 17
REGION_WORK = 2_000_000_000
#: a tree ensemble whose decisions on its training sample would walk more trees than
#: this on average (rows the region tree leaves undecided x trees) is distilled into
#: one tree (:mod:`modeswitch.routers.compiler.distil`): about the rule's decision cost
DISTIL_WALKED_TREES = 32
#: generated Python nests one block per tree level; CPython's tokenizer stops at 100
CODEGEN_MAX_DEPTH = 90


class CompiledRouter:
    """A fitted router as flat arrays in the C kernel. Build with :func:`compile`."""

    def __init__(self, state: FittedState, region_budget: tuple | None = None):
        layout = state.layout
        kind, a = pack(state)  # copied by the kernel; not kept here
        self.kind = kind
        self.classes_ = np.asarray(state.classes, dtype=object)
        self.n_num = layout.n_numeric
        self.fam_cats = list(layout.families)
        self.suite_cats = list(layout.suites)
        self.fam_index = {c: i for i, c in enumerate(self.fam_cats)}
        self.suite_index = {c: i for i, c in enumerate(self.suite_cats)}
        self.n_features = layout.n_features
        lib = library()
        self._lib = lib
        nodes = a.get("nodes")
        self.handle = lib.register_model(
            kind, self.n_features, a["n_classes"], a.get("n_trees", 0), a.get("n_real_trees", 0), self.n_num,
            len(self.fam_cats), len(self.suite_cats), len(nodes) if nodes is not None else 0,
            nodes.ctypes.data if nodes is not None else None, pointer(a.get("value"), F64),
            pointer(a.get("roots"), I32), pointer(a.get("steps"), I32), pointer(a.get("tree_class"), I32),
            pointer(a.get("position"), I32), pointer(a.get("cuts"), F64), pointer(a.get("cut_start"), I32),
            pointer(a.get("cut_count"), I32), pointer(a.get("weights"), F64), pointer(a.get("bias"), F64),
            pointer(a.get("sufdiff"), F64))
        if self.handle < 0:
            raise RuntimeError("compiled router: the kernel refused the model (over 4096 models alive in this "
                               "process, more than 256 outputs or 512 features, or out of memory)")
        cost = a.get("cost")  # the cost decision over per-mode outputs (cost-predicting routers)
        if cost is not None and lib.set_cost_decision(self.handle, cost["n_modes"], cost["n_constraints"],
                                                      cost["ref"], cost["threshold"], cost["cut"]) < 0:
            lib.release_model(self.handle)
            raise RuntimeError("compiled router: the kernel refused the cost decision's layout")
        starts = a.get("out_start")
        if starts is not None and lib.set_output_ranges(self.handle, pointer(starts, I32)) < 0:
            lib.release_model(self.handle)
            raise RuntimeError("compiled router: the kernel refused the outputs' tree ranges")
        #: numeric input columns by name (feature set A's, then any content features)
        self.numeric_ = tuple(layout.numeric)
        self.content_ = state.content
        reads_content = bool(layout.content) and state.content is not None
        if reads_content and not self._set_content(state.content):
            lib.release_model(self.handle)
            raise RuntimeError("compiled router: the kernel refused the content table's layout")
        #: the model's owner in the kernel: a builtin function making one decision from a raw
        #: request in one C call (its content features included); the model is freed when
        #: this object is garbage
        self._owner = extension().make_router(
            self.handle, tuple(self.classes_), self.fam_index if self.fam_cats else None,
            self.suite_index if self.suite_cats else None,
            *((InputError, state.content.model) if reads_content else ()))
        self.route = self._owner
        if layout.content and state.content is None:
            self.route = self._no_content_table
        #: tree models: nodes of the region tree (the argmax as one tree over numeric bins)
        #: and the share of the bin grid it leaves undecided (those decisions walk the trees)
        self.region_nodes_, self.region_walk_share_ = 0, 1.0
        #: a :class:`~modeswitch.routers.compiler.distil.Distillation` where this is a distilled tree
        self.distilled_ = None
        #: what the kernel holds: outputs (classes, or per-mode costs and risks), trees, nodes
        self.size_ = _size(state)
        region_budget = region_budget or (REGION_NODES, REGION_WORK)
        if kind != LINEAR and region_budget[0] > 0:
            self._build_region(state.sample, region_budget)

    def _build_region(self, sample, region_budget):
        if sample is not None and np.shape(sample)[1:] != (self.n_features,):
            sample = None  # not the kernel's layout: spend the budget by volume alone
        sample = None if sample is None else np.ascontiguousarray(sample, dtype=np.float64)
        got = self._lib.build_region(self.handle, int(region_budget[0]), int(region_budget[1]),
                                     pointer(sample, F64), 0 if sample is None else len(sample))
        if got == -2:
            raise MemoryError("compiled router: out of memory building the region tree")
        self.region_nodes_ = max(0, got)
        self.region_walk_share_ = self._lib.region_walk_share(self.handle)

    def _set_content(self, table) -> bool:
        """Hand the kernel the content table (copied) for a layout with content columns:
        its single decisions then read a raw request's token ids in the same C call, as
        :meth:`modeswitch.dataset.content_features.ContentTable.features` does, several times
        faster than computing the features in Python first
        (``bench/routing_overhead.py --content-model`` times both). True where the
        kernel took it."""
        pick = np.array([CONTENT_FEATURES.index(c) for c in self.numeric_[len(FEATURE_SET_A):]], dtype=np.int32)
        rows = np.ascontiguousarray(table.rows, dtype=np.float64)
        return self._lib.set_content(self.handle, pointer(rows, F64), len(rows), rows.shape[1], len(SHARE_FEATURES),
                                     SHARE_TOKENS, TAIL_TOKENS, pointer(pick, I32)) == 0

    @staticmethod
    def _no_content_table(request):
        raise InputError("this compiled router reads the prompt's content and holds no content table "
                         "(fit it with content_model)")

    def content_features(self, token_ids) -> np.ndarray:
        """The content features (:data:`CONTENT_FEATURES`' order) the kernel computes from
        a prompt's token ids: what its single decisions read (tested against
        :meth:`~modeswitch.dataset.content_features.ContentTable.features`)."""
        if self.content_ is None or not self.numeric_[len(FEATURE_SET_A):]:
            raise ValueError("this compiled router reads no content")
        ids = np.ascontiguousarray(np.asarray(token_ids[-SHARE_TOKENS:], dtype=np.int64))
        out, bad = np.zeros(len(CONTENT_FEATURES)), np.zeros(1, dtype=np.int64)
        got = self._lib.content_features(self.handle, pointer(ids, I64), len(ids), pointer(out, F64),
                                         pointer(bad, I64))
        if got == -1:
            raise ValueError(f"token id {int(bad[0])} is negative: not an id of {self.content_.model}'s vocabulary")
        if got == -2:
            raise ValueError(f"token id {int(bad[0])} is outside {self.content_.model}'s vocabulary of "
                             f"{len(self.content_.rows)}: content features read ids of the model they were made for")
        if got:
            raise RuntimeError("compiled router: the kernel holds no content table")
        return out

    # ------------------------------------------------------------- decisions
    def matrix(self, X) -> np.ndarray:
        """The kernel's input matrix (numeric features + one-hot) from a feature frame or array."""
        if hasattr(X, "columns"):
            num = X[list(self.numeric_)].to_numpy(dtype=np.float64)
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
        if M.ndim != 2 or M.shape[1] != self.n_features or not M.flags.c_contiguous or M.dtype != np.float64:
            raise ValueError(f"expected a C-contiguous float64 matrix with {self.n_features} columns")
        out = np.empty(len(M), dtype=np.int32)
        self._lib.predict_batch(self.handle, pointer(M, F64), len(M), pointer(out, I32))
        if len(out) and out.min() < 0:
            raise MemoryError("compiled router: out of memory")
        return out

    def region_share(self, X) -> float:
        """Share of the rows the region tree decides without walking the trees."""
        M = self.matrix(X)
        if not len(M) or not self.region_nodes_:
            return 0.0
        return self._lib.region_hits(self.handle, pointer(M, F64), len(M)) / len(M)

    def predict(self, X) -> np.ndarray:
        return self.classes_[self.predict_matrix(self.matrix(X))]


def _size(state: FittedState) -> dict:
    model = state.model
    if isinstance(model, TreeEnsemble):
        return {"outputs": int(model.n_outputs), "trees": len(model.trees),
                "nodes": int(sum(len(t.left) for t in model.trees))}
    return {"outputs": int(np.shape(model.weights)[0]), "trees": 0, "nodes": 0}


def walked_trees(comp: CompiledRouter, state: FittedState) -> float:
    """Trees a decision walks on average over the training sample: the share of its
    rows the region tree leaves undecided times the ensemble's trees (an upper bound:
    the lockstep walk may stop early). 0 for linear models and lone trees."""
    model, sample = state.model, state.sample
    if not isinstance(model, TreeEnsemble) or len(model.trees) < 2:
        return 0.0
    if sample is None or np.shape(sample)[1:] != (comp.n_features,) or not len(sample):
        return float(len(model.trees))  # no sample to tell: assume every decision walks
    walk = 1.0 - comp.region_share(np.ascontiguousarray(sample, dtype=np.float64))
    return walk * len(model.trees)


def compile_state(state: FittedState, region_budget: tuple | None = None,
                  distil: str = "auto") -> CompiledRouter:
    """The compiled form of a fitted router's description. ``distil``: ``"auto"``
    distils a tree ensemble that walks more than ``DISTIL_WALKED_TREES`` trees per
    decision (:func:`walked_trees`) into one tree, which records its measured agreement
    (``distilled_``); ``"always"`` distils any tree ensemble with a sample; ``"never"``
    keeps the exact ensemble."""
    if distil not in ("auto", "always", "never"):
        raise ValueError(f"distil {distil!r}: choose auto, always or never")
    comp = CompiledRouter(state, region_budget)
    model = state.model
    has_sample = state.sample is not None and np.shape(state.sample)[1:] == (comp.n_features,) \
        and len(state.sample) > 0
    if distil != "never" and isinstance(model, TreeEnsemble) and has_sample and (
            distil == "always" or (len(model.trees) > 1 and walked_trees(comp, state) > DISTIL_WALKED_TREES)):
        small, kept = distil_state(state, comp.predict_matrix)
        comp = compile_state(small, region_budget, distil="never")
        comp.distilled_ = kept
        return comp
    if isinstance(model, TreeEnsemble) and len(model.trees) == 1 and model.combine == "mean" \
            and state.decision is None and not state.layout.content and _depth(model.trees[0]) <= CODEGEN_MAX_DEPTH:
        # single decisions: generated Python beats a C call for a handful of comparisons
        comp.route, comp.source_code = compile_tree(model.trees[0], state.classes, state.layout,
                                                    model.float32_inputs)
    return comp


def _depth(tree) -> int:
    left, right = np.asarray(tree.left), np.asarray(tree.right)
    depth, todo = 0, [(0, 0)]
    while todo:
        node, d = todo.pop()
        depth = max(depth, d)
        if left[node] >= 0:
            todo += [(int(left[node]), d + 1), (int(right[node]), d + 1)]
    return depth


def compile(router, region_budget: tuple | None = None, distil: str = "auto") -> CompiledRouter:  # noqa: A001
    """Compile a fitted learned router (any family whose ``fitted_state()`` describes a
    tree ensemble or a linear model).

    ``region_budget``: (nodes, work) for the region tree of tree models; default
    (``REGION_NODES``, ``REGION_WORK``); nodes 0 = no region tree (always walk).
    ``distil``: see :func:`compile_state`."""
    describe = getattr(router, "fitted_state", None)
    if describe is None:
        raise TypeError(f"{type(router).__name__} has no fitted_state(): nothing to compile")
    return compile_state(describe(), region_budget, distil)
