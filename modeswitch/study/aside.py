"""Moving a study's earlier file aside instead of writing over it.

Why: a study never overwrites a result. A redo, or an attempt interrupted half way,
leaves files (a score report, a quality sweep) that a researcher may still want to
compare; the step that writes them again first renames what is there.
"""

from __future__ import annotations

from pathlib import Path


def move_aside(path: Path, tag: str) -> Path:
    """Rename ``path`` to ``<name>.<tag>`` (``-2``, ``-3``... where that is taken: two
    moves within a second must not replace each other's) and return the new path."""
    dest, k = path.with_name(f"{path.name}.{tag}"), 2
    while dest.exists():
        dest, k = path.with_name(f"{path.name}.{tag}-{k}"), k + 1
    path.rename(dest)
    return dest
