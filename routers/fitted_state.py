"""What a fitted router's decision is, as plain data: the compiler's only input.

Why: the compiler (:mod:`modeswitch.routers.compiler`) used to dispatch on the estimator classes
it knew, so every new family needed a compiler edit and the compiler imported the
families that import it. Now each learned router describes its fitted decision with
the types here (``router.fitted_state()``), the way scikit-learn exposes ``tree_`` and
``coef_``, and the compiler reads nothing else. A family whose model is a tree
ensemble or a linear model compiles by describing it; nothing here imports a router.

* :class:`TreeEnsemble`: decision trees as node arrays, averaged (random forests:
  each leaf a vector over the outputs, inputs rounded to float32 as scikit-learn
  does) or summed (gradient boosting: each tree adds its leaf's one value to its own
  output, inputs compared as doubles);
* :class:`LinearModel`: one score per output, ``weights @ x + bias``, optionally on
  standardised numeric columns;
* :class:`CostDecision`: instead of the argmax, the cheapest mode whose every risk is
  at most a threshold (the cost-predicting routers).

The answer is ``classes[argmax(scores)]``; a model with one output and two classes
answers the second class where the score is positive (binary logistic regression,
binary LightGBM).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modeswitch.dataset.content_features import CONTENT_FEATURES, ContentTable
from modeswitch.dataset.features import FEATURE_SET_A


@dataclass(frozen=True)
class InputLayout:
    """The model's input columns: ``n_numeric`` numeric features (``numeric_names``; by
    default feature set A's first ``n_numeric`` in
    :data:`modeswitch.dataset.features.FEATURE_SET_A`'s order), then one-hot columns for the
    request's family, then for its benchmark suite (an unseen category: all zero).
    Numeric names beyond feature set A are content features, read from the prompt's
    token ids (:mod:`modeswitch.dataset.content_features`)."""

    n_numeric: int
    families: tuple[str, ...] = ()
    suites: tuple[str, ...] = ()
    numeric_names: tuple[str, ...] = ()

    def __post_init__(self):
        if self.numeric_names and len(self.numeric_names) != self.n_numeric:
            raise ValueError(f"input layout: {len(self.numeric_names)} numeric names for {self.n_numeric} columns")

    @property
    def n_features(self) -> int:
        return self.n_numeric + len(self.families) + len(self.suites)

    @property
    def numeric(self) -> tuple[str, ...]:
        """The numeric columns' names, in order."""
        if not self.numeric_names and self.n_numeric > len(FEATURE_SET_A):
            raise ValueError(f"input layout: {self.n_numeric} numeric columns and no names (feature set A has "
                             f"{len(FEATURE_SET_A)})")
        return self.numeric_names or FEATURE_SET_A[: self.n_numeric]

    @property
    def content(self) -> tuple[str, ...]:
        """The numeric columns read from the prompt's content (after feature set A's)."""
        return tuple(n for n in self.numeric if n in CONTENT_FEATURES)


def numeric_layout(columns) -> tuple[str, ...]:
    """``InputLayout.numeric_names`` for a model's numeric input columns: () for a prefix
    of feature set A (the default), else the names, which must be feature set A whole
    and then content features (what the compiled decision can compute from a request)."""
    cols = tuple(columns)
    if cols == FEATURE_SET_A[: len(cols)]:
        return ()
    if cols[: len(FEATURE_SET_A)] == FEATURE_SET_A and all(c in CONTENT_FEATURES for c in cols[len(FEATURE_SET_A):]):
        return cols
    raise ValueError("compiled routers expect feature set A's columns in order, then content features")


@dataclass(frozen=True)
class Tree:
    """One binary decision tree as node arrays (scikit-learn's ``tree_`` layout): node
    ``i`` goes to ``left[i]`` when ``x[feature[i]] <= threshold[i]``, else to
    ``right[i]``; ``left[i] < 0`` marks a leaf. ``value[i]`` is what leaf ``i`` adds:
    one number per output (an averaged ensemble) or one number to output ``output``
    (a summed one)."""

    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    output: int = 0


@dataclass(frozen=True)
class TreeEnsemble:
    """Trees whose leaves sum into ``n_outputs`` scores, in the trees' order (the order
    the original sums in, which a near-tie can depend on).

    ``combine``: ``"mean"`` (each leaf a row of ``n_outputs`` numbers, averaged over
    the trees) or ``"sum"`` (each leaf one number added to its tree's ``output``).
    ``float32_inputs``: inputs are rounded to float32 before every comparison (as
    scikit-learn's trees do); else compared as doubles (as LightGBM does). ``bias``:
    each output's starting score (None: zero)."""

    trees: tuple[Tree, ...]
    n_outputs: int
    combine: str
    float32_inputs: bool
    bias: np.ndarray | None = None


@dataclass(frozen=True)
class LinearModel:
    """``weights @ z + bias`` per output (``weights``: outputs x inputs), where ``z`` is
    the input with its first ``len(mean)`` (numeric) columns standardised,
    ``(x - mean) / scale``, when ``mean`` is given (the compiler folds that into the
    weights)."""

    weights: np.ndarray
    bias: np.ndarray
    mean: np.ndarray | None = None
    scale: np.ndarray | None = None


@dataclass(frozen=True)
class CostDecision:
    """How a cost-predicting router decides from its outputs: outputs ``0..n_modes-1``
    are each mode's predicted log latency ratio to the reference (mode ``reference``,
    whose output is unused), then ``n_constraints`` risk logits per mode (mode ``j``'s
    at ``n_modes + j * n_constraints + c``). The answer is the mode with the lowest
    ratio among those whose every risk probability is at most ``threshold`` (the
    reference always allowed, ratio 0; first on ties)."""

    n_modes: int
    n_constraints: int
    reference: int
    threshold: float


@dataclass(frozen=True)
class FittedState:
    """A fitted router's whole decision: the answer for each decision index
    (``classes``), the input columns, the model and how its scores decide (``decision``:
    None for the argmax). ``sample``: training inputs in the layout's columns, where the
    compiler spends a tree ensemble's region-tree budget first (None: by volume).
    ``content``: the :class:`~modeswitch.dataset.content_features.ContentTable` a raw request's
    token ids are read through, where the layout has content columns (None: the
    compiled router decides on ready rows only, and says so when asked to route)."""

    classes: tuple
    layout: InputLayout
    model: TreeEnsemble | LinearModel
    decision: CostDecision | None = None
    sample: np.ndarray | None = None
    content: ContentTable | None = None


def cut_logit(p: float) -> float:
    """The logit of a threshold ``p``, infinite at and beyond 0 and 1: the cut the
    compiled cost decision compares risk logits with (packing), and what a cost
    router's gated heads are shifted by (routers.families.cost)."""
    if p <= 0:
        return -np.inf
    if p >= 1:
        return np.inf
    return float(np.log(p / (1 - p)))
