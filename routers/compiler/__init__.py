"""Compiled routers: a learned decision for the price of a few comparisons.

ModeSwitch-LLM's learned routers (arXiv 2605.23057) cost milliseconds per decision because each went through
a pandas row and a scikit-learn pipeline. :func:`compile` turns a fitted router
into data for a small C kernel (``routers/compiler/native/kernels.c``, built once with the
system C compiler against this Python's headers and cached; it is both a CPython
extension, for single decisions, and a ctypes library, for batches).

The compiler reads plain data only: each router describes its fitted decision
(``router.fitted_state()``, :mod:`modeswitch.routers.fitted_state`: tree ensembles, a linear model,
a cost decision), so a new family of trees or linear models compiles without an edit
here. Files: ``kernel`` (native build and loading), ``packing`` (descriptions to the
kernel's arrays), ``router`` (:class:`CompiledRouter` and :func:`compile`), ``codegen``
(a single tree as Python), ``tree_checks`` (trees refused before anything walks them).

What the kernel does with them:

* trees (decision trees, random forests, LightGBM): each feature's split thresholds
  become sorted cuts and a request becomes one bin per feature, so nodes are 8 bytes
  comparing small integers; scikit-learn's float32 comparisons and LightGBM's double
  ones are reproduced exactly;
* **region tree** (tree models): the ensemble's argmax is constant on large boxes of
  the bin grid; the kernel finds them (bounding each tree's reachable leaves per box,
  cutting undecided boxes where the training sample ``X_sample_`` lies first) and
  stores them as one tree per family x suite combination, so most decisions are a
  binary search per feature and one short walk, whatever the ensemble's size; boxes
  the budget (``router.REGION_NODES``, ``REGION_WORK``) leaves undecided walk the trees;
* **lockstep walk** (the fallback): groups of trees walk together, branch-free, with
  an exact early exit once no remaining tree can change the leading class (suffix
  sums of each tree's least leaf-by-leaf difference between two classes);
* linear models (logistic regression): one dot product per class with the standard
  scaling folded into the weights and the one-hot categories as weight columns.

Every path returns what the original model returns (scores summed in its own tree
order wherever a near-tie could depend on it); ``tests/test_compiled.py`` checks
this on held-out rows and on random inputs.

The compiled object keeps the estimator API (``predict``; ``classes_``) and adds
``route(request)``: feature extraction and prediction from a raw request in one
C call (the request's fields are read in C). Unseen categories encode as all-zero
one-hot columns, as the pipeline's ``OneHotEncoder(handle_unknown="ignore")`` does.
"""

from modeswitch.routers.compiler.kernel import kernel_shape_features, library
from modeswitch.routers.compiler.router import CompiledRouter, compile, compile_state

__all__ = ["CompiledRouter", "compile", "compile_state", "kernel_shape_features", "library"]
