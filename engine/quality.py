"""Output quality: ROUGE-L F1 (the rouge-score package) between two texts."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 in [0, 1]; two empty texts count as identical."""
    if not candidate.strip() and not reference.strip():
        return 1.0
    return float(_scorer().score(reference, candidate)["rougeL"].fmeasure)
