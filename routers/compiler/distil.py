"""A slow tree ensemble distilled into one tree that keeps its decisions.

Why: the region tree (:mod:`modeswitch.routers.compiler.router`) decides most requests of a tree
ensemble with one short walk, but on the study's own tables a many-output ensemble
(a cost-predicting LightGBM: one latency output per mode and one risk output per mode
and constraint, thousands of trees) leaves boxes undecided, and each decision there
sums thousands of trees, tens of times the rule's cost. The decision itself
is simple (a mode per box of a handful of features), so one tree can hold it.

How: the ensemble's own decisions label its training sample (``FittedState.sample``,
the rows the router was fitted on, in the kernel's input layout) and synthetic rows
around it: each training row with one numeric feature taken from another row (the
boundaries near real traffic), and rows whose every request field is drawn from
its own marginal (the space between); derived features (ratios, logs) are recomputed. A fully grown scikit-learn tree fits them;
on every training row it answers as the ensemble does (agreement 1.0 unless two rows
differ only below float32's resolution), and its agreement on fresh synthetic rows
is measured and reported, never assumed. The tree then compiles as any single tree
does (generated Python, or the kernel where it is too deep for that).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from modeswitch.dataset.features import FEATURE_FORMULAS, FEATURE_SET_A, _shape
from modeswitch.routers.fitted_state import FittedState, Tree, TreeEnsemble

#: the request fields feature set A's formulas read (the rest derive from them)
REQUEST_FIELDS = ("prompt_tokens", "expected_output_tokens", "shared_prefix_tokens", "concurrent_requests",
                  "memory_pressure")

#: synthetic rows labelled by the ensemble (on top of its training sample)
SYNTHETIC_ROWS = 20_000
#: fresh synthetic rows on which the distilled tree's agreement is measured
CHECK_ROWS = 5_000


@dataclass(frozen=True)
class Distillation:
    """What a distillation kept: the ensemble's size, the tree's, and agreement with
    the ensemble on its training rows and on fresh synthetic rows."""

    source_trees: int
    nodes: int
    depth: int
    agreement_train: float
    agreement_synthetic: float

    def describe(self) -> str:
        return (f"distilled from {self.source_trees} trees into one of {self.nodes} nodes; agreement "
                f"{self.agreement_train:.2%} on training rows, {self.agreement_synthetic:.2%} on synthetic ones")


def _recompute(rows: np.ndarray, n_numeric: int) -> np.ndarray:
    """Derived features (ratios, logs) recomputed from the request fields they derive
    from, so a synthetic row is a request that could exist."""
    names = FEATURE_SET_A[:n_numeric]
    fields = [n for n in names if FEATURE_FORMULAS[n] == f"float(r.{n})"]
    if len(fields) == len(names) or any(f not in names for f in REQUEST_FIELDS):
        return rows  # nothing derived, or a layout without every field a formula reads
    col = {n: i for i, n in enumerate(names)}
    for k in range(len(rows)):  # content columns (after A's) came whole from one sample row
        r = SimpleNamespace(**{f: rows[k, col[f]] for f in REQUEST_FIELDS})
        rows[k, :len(names)] = _shape(r)[:len(names)]
    return rows


def synthetic_rows(sample: np.ndarray, n_numeric: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` rows in the sample's layout: half are sample rows with one request field
    taken from another sample row, half draw each request field from its own marginal;
    derived features are recomputed from the fields, and the content columns (one
    prompt's) and the one-hot columns (family, suite) always come whole from one sample
    row, so every row is a request that could exist."""
    m = len(sample)
    names = FEATURE_SET_A[:n_numeric]
    base = [i for i, nm in enumerate(names) if nm in REQUEST_FIELDS] or list(range(n_numeric))
    half = n // 2
    near = sample[rng.integers(0, m, half)].copy()
    col = np.asarray(base)[rng.integers(0, len(base), half)] if n_numeric else np.zeros(half, int)
    if n_numeric:
        near[np.arange(half), col] = sample[rng.integers(0, m, half), col]
    far = sample[rng.integers(0, m, n - half)].copy()
    for j in base if n_numeric else []:
        far[:, j] = sample[rng.integers(0, m, n - half), j]
    return _recompute(np.vstack([near, far]), n_numeric)


def distil_rows(sample: np.ndarray, n_numeric: int, random_state: int = 0) -> np.ndarray:
    """The rows a distilled tree is fitted on: the training sample and
    ``SYNTHETIC_ROWS`` synthetic rows around it."""
    sample = np.ascontiguousarray(sample, dtype=np.float64)
    rng = np.random.default_rng(random_state)
    return np.vstack([sample, synthetic_rows(sample, n_numeric, SYNTHETIC_ROWS, rng)])


def check_rows(sample: np.ndarray, n_numeric: int, random_state: int = 0) -> np.ndarray:
    """Fresh synthetic rows (another draw than :func:`distil_rows`'s) to measure agreement on."""
    return synthetic_rows(np.ascontiguousarray(sample, dtype=np.float64), n_numeric, CHECK_ROWS,
                          np.random.default_rng(random_state + 1))


def fit_tree(rows: np.ndarray, decisions: np.ndarray, random_state: int = 0):
    """A fully grown scikit-learn tree answering ``decisions`` (class indices) on ``rows``."""
    from sklearn.tree import DecisionTreeClassifier  # lazy: only when an ensemble is distilled

    return DecisionTreeClassifier(random_state=random_state).fit(rows, decisions)


def tree_state(template: FittedState, clf) -> FittedState:
    """``template``'s decision as the one tree ``clf`` (fitted on class indices of
    ``template.classes``): its classes, input layout and sample; the argmax decides."""
    n_classes = len(template.classes)
    tr = clf.tree_
    # the tree's classes are the decision indices it saw: spread them over all classes
    value = np.zeros((tr.node_count, n_classes))
    value[:, clf.classes_.astype(int)] = tr.value[:, 0, :]
    value /= np.maximum(value.sum(axis=1, keepdims=True), 1e-300)
    tree = Tree(tr.feature, tr.threshold, tr.children_left, tr.children_right, value)
    return FittedState(template.classes, template.layout, TreeEnsemble((tree,), n_classes, "mean", True),
                       None, template.sample, template.content)


def distil(state: FittedState, decide, random_state: int = 0) -> tuple[FittedState, Distillation]:
    """(one tree deciding as ``state`` does, what was kept). ``decide(M)``: the
    ensemble's class indices for input rows ``M`` (the compiled ensemble's batch path,
    exact). Needs ``state.sample`` in the layout's columns."""
    sample = state.sample
    n_features = state.layout.n_features
    if sample is None or np.ndim(sample) != 2 or np.shape(sample)[1] != n_features or not len(sample):
        raise ValueError("nothing to distil from: the router kept no training sample in its input layout")
    sample = np.ascontiguousarray(sample, dtype=np.float64)
    n_num = state.layout.n_numeric
    X = distil_rows(sample, n_num, random_state)
    clf = fit_tree(X, decide(X), random_state)
    check = check_rows(sample, n_num, random_state)
    source = len(state.model.trees) if isinstance(state.model, TreeEnsemble) else 0
    kept = Distillation(
        source, int(clf.tree_.node_count), int(clf.tree_.max_depth),
        float((clf.predict(sample) == decide(sample)).mean()),
        float((clf.predict(check) == decide(check)).mean()))
    return tree_state(state, clf), kept
