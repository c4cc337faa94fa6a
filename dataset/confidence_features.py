"""Confidence features: how sure the reference model is at the end of the prompt.

Why: the answers a quantised copy flips are the ones where the full model was unsure,
a small gap between its two likeliest next tokens (arXiv 2407.09141, 2405.00632).

They cost the reference model's prefill of the prompt, about a million times a rule's
decision (``bench/confidence_prefill.py``; docs/results.md), so they are no router
feature set here: the oracle's per-request quality-risk model (``modeswitch.oracle.quality_risk``) reads them to judge
requests a quality sweep did not run, where one prefill is cheap beside running every
lossy mode. ``bench/confidence_prefill.py`` measures that prefill beside the rule's
decision.

This room holds the arithmetic on one logits vector; the engine runs the prefill
(``modeswitch.engine.prompt_confidence``).
"""

from __future__ import annotations

#: the columns, in order
CONFIDENCE_FEATURES = ("ref_entropy", "ref_top2_gap", "ref_top1_prob")


def confidence_from_logits(logits) -> tuple[float, float, float]:
    """(entropy in nats, top-1 minus top-2 log-probability, top-1 probability) of the
    next-token distribution a logits vector gives."""
    import numpy as np  # features of one vector; `modeswitch --help` imports no numpy

    z = np.asarray(logits, dtype=np.float64).ravel()
    if z.size < 2 or not np.isfinite(z).all():
        raise ValueError(f"confidence needs at least two finite logits (got {z.size}, "
                         f"finite: {bool(np.isfinite(z).all())})")
    z = z - z.max()
    logp = z - np.log(np.exp(z).sum())
    p = np.exp(logp)
    top2 = np.partition(logp, -2)[-2:]
    return float(-(p * logp).sum()), float(top2[1] - top2[0]), float(p.max())
