"""Python code generation for a single decision tree (the fastest single-decision path).

A depth-5 tree is five comparisons; as generated Python it runs without any call
into C, so one decision costs about as much as the rule baseline's own Python.
scikit-learn compares ``float32(x) <= threshold``; the generated code compares
the double ``x`` with the exact double boundary at which float32 rounding changes
the outcome, so results are identical.
"""

from __future__ import annotations

import math

import numpy as np

from modeswitch.dataset.features import FEATURE_FORMULAS, FEATURE_SET_A, NONE_CATEGORY
from modeswitch.routers.fitted_state import InputLayout, Tree


def float32_boundary(t: float) -> tuple[float, bool]:
    """(b, inclusive): float32(x) <= t  <=>  x <= b (inclusive) or x < b, for double x."""
    T = np.float32(t)
    if float(T) > t:
        T = np.nextafter(T, np.float32(-np.inf))
    up = np.nextafter(T, np.float32(np.inf))
    if not np.isfinite(up):
        return math.inf, True
    b = (float(T) + float(up)) / 2  # exact: float32 values have 24-bit mantissas
    even = (int(np.asarray(T).view(np.int32)) & 1) == 0
    return b, bool(even)


def _condition(f: int, name, threshold: float, float32_inputs: bool) -> str:
    """The test a node makes, as Python on the request's features."""
    if isinstance(name, tuple):  # one-hot column: x <= threshold (0.5) means "not this category"
        var = "fam" if name[0] == "family" else "suite"
        return f"{var} != {name[1]!r}" if threshold < 1 else "True"
    b, inclusive = float32_boundary(threshold) if float32_inputs else (threshold, True)
    return f"x{f} {'<=' if inclusive else '<'} {b!r}"


def tree_source(tree: Tree, classes, layout: InputLayout, float32_inputs: bool = True,
                name="route") -> str:
    """Source of ``def route(r): ...`` returning the class label for a Request ``r``: the
    class of the largest leaf value (scikit-learn's argmax, first on ties)."""
    if layout.content or layout.n_numeric > len(FEATURE_SET_A):
        raise ValueError("generated Python reads a request's shape fields only: a layout with content "
                         "columns routes through the kernel")
    n_num = layout.n_numeric
    feat_names = list(FEATURE_SET_A[:n_num]) + [("family", c) for c in layout.families] + \
        [("benchmark_suite", c) for c in layout.suites]
    left, right = np.asarray(tree.left), np.asarray(tree.right)
    feature, threshold = np.asarray(tree.feature), np.asarray(tree.threshold, np.float64)
    value = np.asarray(tree.value, np.float64)
    used = sorted({int(feature[i]) for i in range(len(left)) if left[i] >= 0})
    lines = [f"def {name}(r):"]
    for f in used:
        fn = feat_names[f]
        if isinstance(fn, str):
            lines.append(f"    x{f} = {FEATURE_FORMULAS[fn]}")
    if any(isinstance(feat_names[f], tuple) and feat_names[f][0] == "family" for f in used):
        lines.append(f"    fam = r.family or {NONE_CATEGORY!r}")
    if any(isinstance(feat_names[f], tuple) and feat_names[f][0] == "benchmark_suite" for f in used):
        lines.append(f"    suite = r.benchmark_suite or {NONE_CATEGORY!r}")

    def emit(node, depth):
        pad = "    " * depth
        if left[node] < 0:
            lines.append(f"{pad}return {str(classes[int(np.argmax(value[node]))])!r}")
            return
        f = int(feature[node])
        lines.append(f"{pad}if {_condition(f, feat_names[f], float(threshold[node]), float32_inputs)}:")
        emit(left[node], depth + 1)
        lines.append(f"{pad}else:")
        emit(right[node], depth + 1)

    emit(0, 1)
    return "\n".join(lines) + "\n"


def compile_tree(tree: Tree, classes, layout: InputLayout, float32_inputs: bool = True):
    """(the generated ``route`` function, its source) for one tree."""
    src = tree_source(tree, classes, layout, float32_inputs)
    ns = {"log1p": math.log1p, "inf": math.inf}
    exec(compile(src, "<modeswitch-tree>", "exec"), ns)  # noqa: S102 - our own generated code
    return ns["route"], src
