"""The tiny test model's training text: the standard library's own sources, which
every machine with Python has.

Used only to train the project's stdlib model (the test suite's fast fixture);
prompts take their text from the benchmark samples (:mod:`modeswitch.dataset.prompt_corpus`). The file list is sorted and filtered the same way everywhere,
so the corpus depends only on the Python version (recorded with the model).
"""

from __future__ import annotations

import hashlib
import sysconfig
from functools import lru_cache
from pathlib import Path

_SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "__pycache__"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts) & _SKIP_PARTS)]
    return sorted(files, key=lambda p: str(p.relative_to(root)))


@lru_cache(maxsize=4)
def stdlib_text(max_bytes: int = 6_000_000) -> str:
    """Concatenated stdlib sources, up to ``max_bytes`` characters."""
    parts, size = [], 0
    for f in stdlib_files():
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "\n".join(parts)[:max_bytes]


def corpus_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
