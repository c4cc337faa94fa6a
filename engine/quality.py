"""Output quality: ROUGE-L F1 (the rouge-score package) between two texts.

rouge-score's default tokenizer keeps only lower-cased alphanumeric runs, so an
output made of code punctuation (common for small models trained on source
code) would score 0 even against itself. We pass a tokenizer that keeps
punctuation as tokens, which leaves natural-language scores unchanged in
spirit and makes code outputs comparable.
"""

from __future__ import annotations

import re
from functools import lru_cache

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class WordAndSymbolTokenizer:
    """rouge-score tokenizer interface: ``tokenize(text) -> list[str]``."""

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower())


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer  # lazy: rouge-score is optional

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=WordAndSymbolTokenizer())


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 in [0, 1]; two texts with no tokens count as identical."""
    if not _TOKEN.search(candidate) and not _TOKEN.search(reference):
        return 1.0
    return float(_scorer().score(reference, candidate)["rougeL"].fmeasure)
