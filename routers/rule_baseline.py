"""The ModeSwitch-LLM study's rule controller, as a scikit-learn estimator.

Policy, first match wins (thresholds are parameters, defaults are the study's):

1. ``concurrent_requests >= batch_threshold`` (4) -> int8_plus_continuous_batching
2. a shared prefix (``shared_prefix_tokens > 0``) -> gptq_plus_prefix_caching
3. memory pressure (``memory_pressure > 0``) -> gptq_4bit
4. the synthetic families: short/short -> gptq_4bit, short prompt/long output ->
   speculative_decoding, long/short -> gptq_4bit, long/long -> gptq_4bit
5. GSM8K -> speculative_decoding
6. MMLU-Pro, TruthfulQA, GPQA, MLU -> int8_quant
7. prompt <= 384 and output <= 64 -> speculative_decoding
8. externally judged benchmarks, or output >= 128 -> speculative_decoding
9. prefill-heavy (prefill score > 40) or prompt >= 768 -> int8_quant
10. otherwise -> int8_quant

Prefill score: +15 if prompt >= 384, +10 more if >= 768; +30 if output <= 8,
else +20 if <= 16; +20 if output/prompt <= 0.02, else +10 if <= 0.05; -20 if
output >= 64, -15 more if >= 128; +5 under memory pressure; clipped to [0, 100].

A mode the target backend lacks (``available_modes``) is mapped in ``fit`` to its
nearest substitute from the mode registry's documented table
(``engine/modes/study.py``); a mode with no available substitute is an error,
never a silent reference.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from modeswitch.dataset.features import FEATURE_SET_A, NONE_CATEGORY
from modeswitch.dataset.requests import Request
from modeswitch.engine.modes import mode_names, reference_mode, resolve_mode
from modeswitch.routers.base import RouterMixin
from modeswitch.routers.registry import RouterFamily, register_router

SYNTHETIC_FAMILIES = {
    "short_prompt_short_output": "gptq_4bit",
    "short_prompt_long_output": "speculative_decoding",
    "long_prompt_short_output": "gptq_4bit",
    "long_prompt_long_output": "gptq_4bit",
}
MC_SUITES = frozenset({"mmlu_pro", "truthfulqa", "gpqa", "mlu"})
JUDGED_SUITES = frozenset({"mt_bench", "alpacaeval2_lc", "alpacaeval"})
POLICY_MODES = (
    "int8_plus_continuous_batching",
    "gptq_plus_prefix_caching",
    "gptq_4bit",
    "speculative_decoding",
    "int8_quant",
)
#: Columns the rule reads; the numeric ones are feature set A's.
REQUIRED_COLUMNS = ("prompt_tokens", "expected_output_tokens", "shared_prefix_tokens",
                    "concurrent_requests", "memory_pressure")
CONTEXT_COLUMNS = ("family", "benchmark_suite", "evaluation_mode")


def prefill_score(prompt: float, output: float, memory_pressure: float) -> float:
    """The study's prefill-heaviness score in [0, 100]."""
    s = 0.0
    if prompt >= 384:
        s += 15
        if prompt >= 768:
            s += 10
    if output <= 8:
        s += 30
    elif output <= 16:
        s += 20
    ratio = output / prompt if prompt > 0 else float("inf")
    if ratio <= 0.02:
        s += 20
    elif ratio <= 0.05:
        s += 10
    if output >= 64:
        s -= 20
        if output >= 128:
            s -= 15
    if memory_pressure > 0:
        s += 5
    return min(max(s, 0.0), 100.0)


def _cat(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return NONE_CATEGORY
    return str(value).lower()


class RuleBaselineRouter(RouterMixin, ClassifierMixin, BaseEstimator):
    """The study's hand-written controller. ``fit`` learns nothing from data; it
    resolves the policy's modes against the backend's ``available_modes`` (a mode with no
    available substitute is an error, or with ``unavailable="reference"`` the reference)."""

    def __init__(self, available_modes=None, batch_threshold=4, short_prompt_max=384,
                 short_output_max=64, long_output_min=128, prefill_score_min=40,
                 long_prompt_min=768, unavailable="error"):
        self.available_modes = available_modes
        self.unavailable = unavailable
        self.batch_threshold = batch_threshold
        self.short_prompt_max = short_prompt_max
        self.short_output_max = short_output_max
        self.long_output_min = long_output_min
        self.prefill_score_min = prefill_score_min
        self.long_prompt_min = long_prompt_min

    # -- estimator API -------------------------------------------------------
    def fit(self, X=None, y=None):
        available = list(self.available_modes) if self.available_modes is not None else mode_names()
        if self.unavailable not in ("error", "reference"):
            raise ValueError(f"unavailable={self.unavailable!r}: choose 'error' or 'reference'")
        self.mode_map_ = {}
        for m in POLICY_MODES:
            try:
                self.mode_map_[m] = resolve_mode(m, available)
            except LookupError:
                # a small mode set (a partial profile) may lack a rule's mode and all its
                # substitutes: either say so, or run the reference for that rule
                ref = reference_mode().name
                if self.unavailable == "error" or ref not in available:
                    raise
                self.mode_map_[m] = ref
        self.classes_ = np.array(sorted(set(self.mode_map_.values())))
        self.modes_ = [str(m) for m in self.classes_]
        if X is not None:
            self._check_columns(X)
            self.n_features_in_ = X.shape[1]
            if hasattr(X, "columns"):
                self.feature_names_in_ = np.asarray(X.columns, dtype=object)
        return self

    def predict(self, X) -> np.ndarray:
        return np.array([label for label, _ in self.explain(X)], dtype=object)

    def explain(self, X) -> list[tuple[str, str]]:
        """(label, reason) per row: which rule fired, and any backend mapping."""
        check_is_fitted(self, "mode_map_")
        X = self._check_columns(X)
        cols = {c: X[c].to_numpy() if c in X.columns else None for c in
                REQUIRED_COLUMNS + CONTEXT_COLUMNS}
        n = len(X)
        out = []
        for i in range(n):
            mode, reason = self.decide(
                cols["prompt_tokens"][i], cols["expected_output_tokens"][i],
                cols["shared_prefix_tokens"][i], cols["concurrent_requests"][i],
                cols["memory_pressure"][i],
                None if cols["family"] is None else cols["family"][i],
                None if cols["benchmark_suite"] is None else cols["benchmark_suite"][i],
                None if cols["evaluation_mode"] is None else cols["evaluation_mode"][i],
            )
            out.append(self._mapped(mode, reason))
        return out

    def route(self, request: Request) -> str:
        """One decision from a raw request, without pandas (the serving path)."""
        mode, _ = self.decide(
            request.prompt_tokens, request.expected_output_tokens,
            request.shared_prefix_tokens, request.concurrent_requests,
            request.memory_pressure, request.family, request.benchmark_suite,
            request.evaluation_mode,
        )
        return self.mode_map_[mode]

    # -- policy --------------------------------------------------------------
    def decide(self, prompt, output, shared_prefix, concurrent, memory_pressure,
               family=None, suite=None, evaluation_mode=None) -> tuple[str, str]:
        """The study's policy on raw numbers: (study mode, reason)."""
        family, suite, evaluation_mode = _cat(family), _cat(suite), _cat(evaluation_mode)
        if concurrent >= self.batch_threshold:
            return "int8_plus_continuous_batching", (
                f"rule 1: {concurrent:g} concurrent requests >= {self.batch_threshold}")
        if shared_prefix > 0:
            return "gptq_plus_prefix_caching", f"rule 2: shared prefix of {shared_prefix:g} tokens"
        if memory_pressure > 0:
            return "gptq_4bit", f"rule 3: memory pressure {memory_pressure:g}"
        if family in SYNTHETIC_FAMILIES:
            return SYNTHETIC_FAMILIES[family], f"rule 4: synthetic family {family}"
        if suite == "gsm8k":
            return "speculative_decoding", "rule 5: GSM8K"
        if suite in MC_SUITES:
            return "int8_quant", f"rule 6: multiple-choice benchmark {suite}"
        if prompt <= self.short_prompt_max and output <= self.short_output_max:
            return "speculative_decoding", (
                f"rule 7: prompt {prompt:g} <= {self.short_prompt_max} and output {output:g} "
                f"<= {self.short_output_max}")
        if evaluation_mode == "external_judge" or suite in JUDGED_SUITES:
            return "speculative_decoding", f"rule 8: externally judged benchmark {suite}"
        if output >= self.long_output_min:
            return "speculative_decoding", f"rule 8: output {output:g} >= {self.long_output_min}"
        score = prefill_score(float(prompt), float(output), float(memory_pressure))
        if score > self.prefill_score_min:
            return "int8_quant", f"rule 9: prefill score {score:g} > {self.prefill_score_min}"
        if prompt >= self.long_prompt_min:
            return "int8_quant", f"rule 9: prompt {prompt:g} >= {self.long_prompt_min}"
        return "int8_quant", f"rule 10: default (prefill score {score:g})"

    # -- helpers -------------------------------------------------------------
    def _mapped(self, mode: str, reason: str) -> tuple[str, str]:
        target = self.mode_map_[mode]
        if target != mode:
            reason += f" -> {mode}, which the backend lacks; nearest available: {target}"
        else:
            reason += f" -> {mode}"
        return target, reason

    @staticmethod
    def _check_columns(X) -> pd.DataFrame:
        if not hasattr(X, "columns"):
            X = np.asarray(X, dtype=float)
            if X.ndim != 2 or X.shape[1] < len(FEATURE_SET_A):
                raise ValueError(
                    "RuleBaselineRouter needs a DataFrame with columns "
                    f"{', '.join(REQUIRED_COLUMNS)} (or an array in feature set A's order)")
            X = pd.DataFrame(X[:, : len(FEATURE_SET_A)], columns=list(FEATURE_SET_A))
        missing = [c for c in REQUIRED_COLUMNS if c not in X.columns]
        if missing:
            raise ValueError(f"RuleBaselineRouter: feature frame lacks column(s) {', '.join(missing)}")
        return X


register_router(RouterFamily("rule", RuleBaselineRouter, "the study's rule controller (baseline)",
                             learned=False))
