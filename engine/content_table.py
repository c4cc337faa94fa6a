"""The content table of a checkpoint: what :mod:`modeswitch.dataset.content_features` reads.

Made once per checkpoint and cached (``$MODESWITCH_CACHE/content/``, keyed by the
checkpoint's path, its weight and tokenizer files' sizes and times, and the recipe): the tokenizer decodes every vocabulary entry for
its share flags, and the input embedding matrix (read alone from the safetensors
files, so an 8B model's other weights are never loaded) is centred and projected on
its top principal directions (an eigendecomposition of its hidden x hidden
covariance). The first build takes seconds; reading it from the cache, milliseconds.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from modeswitch.dataset.content_features import (
    CODE_CHARS,
    EMBED_COMPONENTS,
    ContentTable,
    token_flags,
)
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import atomic_path
from modeswitch.engine.models.cache import default_cache_dir

#: tensor names an input embedding matrix goes by (Llama/SmolLM, GPT-2, BLOOM, the tiny model)
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight",
                   "embed_in.weight")


def weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InputError(f"{folder}: no *.safetensors files; content and confidence features read a "
                         "Hugging Face checkpoint folder's weights")
    return files


#: bump when the table's recipe changes (flags, components): cached tables are then made again
RECIPE = 1


def checkpoint_key(folder: Path, files: list[Path], *recipe) -> str:
    """A cache key for what is made from a checkpoint: its path, ``files``' sizes and
    times, and the recipe's settings (JSON-able)."""
    stats = [(p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in files]
    return hashlib.sha256(json.dumps([str(folder.resolve()), stats, *recipe]).encode()).hexdigest()[:16]


def _key(folder: Path) -> str:
    files = weight_files(folder) + sorted(folder.glob("tokenizer*")) + sorted(folder.glob("vocab*"))
    return checkpoint_key(folder, files, EMBED_COMPONENTS, sorted(CODE_CHARS), RECIPE)


def input_embeddings(folder: Path) -> np.ndarray:
    """The checkpoint's input embedding matrix (vocabulary x hidden, float32), read alone."""
    from safetensors import safe_open  # comes with transformers; only when a table is made

    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                if name.endswith(EMBEDDING_NAMES):
                    return f.get_tensor(name).float().numpy()
    raise InputError(f"{folder}: no input embedding tensor (one ending in {', '.join(EMBEDDING_NAMES)})")


def make_content_table(model: str | Path) -> ContentTable:
    """A checkpoint's content table, computed (see the module's docstring)."""
    from transformers import (
        AutoTokenizer,  # heavy: only when a table is made, not when a cached one is read
    )

    folder = Path(model)
    emb = input_embeddings(folder).astype(np.float64)
    tok = AutoTokenizer.from_pretrained(str(folder))
    n = emb.shape[0]
    texts = tok.batch_decode([[i] for i in range(min(n, len(tok)))])
    flags = np.zeros((n, 3))
    flags[:len(texts)] = [token_flags(t) for t in texts]
    centred = emb - emb.mean(axis=0)
    _, vecs = np.linalg.eigh(centred.T @ centred / n)
    top = vecs[:, ::-1][:, :EMBED_COMPONENTS]
    top *= np.sign(top[np.abs(top).argmax(axis=0), range(top.shape[1])])  # a fixed sign per direction
    return ContentTable(str(folder), np.hstack([flags, centred @ top]))


@lru_cache(maxsize=4)
def content_table(model: str) -> ContentTable:
    """The checkpoint's content table, from the cache when made before."""
    folder = Path(model)
    if not folder.is_dir():
        raise InputError(f"content features: {model} is not a checkpoint folder")
    path = default_cache_dir() / "content" / f"{folder.name}-{_key(folder)}.npy"
    if path.exists():
        return ContentTable(str(folder), np.load(path))
    table = make_content_table(folder)
    with atomic_path(path, overwrite=True) as tmp, open(tmp, "wb") as fh:
        np.save(fh, table.rows)
    return table
