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

from dataset.features import FEATURE_FORMULAS, FEATURE_SET_A, NONE_CATEGORY


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


def tree_source(tree, classes, n_num: int, fam_cats, suite_cats, name="route") -> str:
    """Source of ``def route(r): ...`` returning the class label for a Request ``r``."""
    tr = tree.tree_
    feat_names = list(FEATURE_SET_A[:n_num]) + [("family", c) for c in fam_cats] + \
        [("benchmark_suite", c) for c in suite_cats]
    used = sorted({int(f) for f in tr.feature if f >= 0})
    lines = [f"def {name}(r):"]
    for f in used:
        fn = feat_names[f]
        if isinstance(fn, str):
            lines.append(f"    x{f} = {FEATURE_FORMULAS[fn]}")
    if any(isinstance(feat_names[f], tuple) and feat_names[f][0] == "family" for f in used):
        lines.append(f"    fam = r.family or {NONE_CATEGORY!r}")
    if any(isinstance(feat_names[f], tuple) and feat_names[f][0] == "benchmark_suite" for f in used):
        lines.append(f"    suite = r.benchmark_suite or {NONE_CATEGORY!r}")
    value = tr.value[:, 0, :]

    def emit(node, depth):
        pad = "    " * depth
        if tr.children_left[node] < 0:
            v = value[node]
            norm = v.sum() if v.sum() != 0 else 1.0
            lines.append(f"{pad}return {str(classes[int(np.argmax(v / norm))])!r}")
            return
        f = int(tr.feature[node])
        fn = feat_names[f]
        if isinstance(fn, tuple):  # one-hot column: x <= threshold (0.5) means "not this category"
            var = "fam" if fn[0] == "family" else "suite"
            cond = f"{var} != {fn[1]!r}" if tr.threshold[node] < 1 else "True"
        else:
            b, inclusive = float32_boundary(float(tr.threshold[node]))
            cond = f"x{f} {'<=' if inclusive else '<'} {b!r}"
        lines.append(f"{pad}if {cond}:")
        emit(tr.children_left[node], depth + 1)
        lines.append(f"{pad}else:")
        emit(tr.children_right[node], depth + 1)

    emit(0, 1)
    return "\n".join(lines) + "\n"


def compile_tree(tree, classes, n_num, fam_cats, suite_cats):
    src = tree_source(tree, classes, n_num, fam_cats, suite_cats)
    ns = {"log1p": math.log1p, "inf": math.inf}
    exec(compile(src, "<modeswitch-tree>", "exec"), ns)  # noqa: S102 - our own generated code
    return ns["route"], src
