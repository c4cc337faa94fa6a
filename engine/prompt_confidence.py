"""The reference model's confidence at the end of each prompt (:mod:`modeswitch.dataset.confidence_features`).

One prefill per prompt, as the reference mode runs it (float32 on a CPU, float16 on a
GPU), one prompt at a time so no padding moves a position; the last position's logits
give the three features, and the prefill's own time is kept beside them
(``prefill_ms``: what reading this signal costs a request).

Results are cached (``$MODESWITCH_CACHE/confidence/``) per checkpoint (its path and its
weight files' sizes and times) and prompt ids, so a study's table is rebuilt without
running the model again (``prefill_ms`` is then the time of the run that made it).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pandas as pd

from modeswitch.dataset.confidence_features import CONFIDENCE_FEATURES, confidence_from_logits
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import write_parquet
from modeswitch.engine.backends.transformers_backend import quiet_transformers
from modeswitch.engine.content_table import checkpoint_key, weight_files
from modeswitch.engine.models.cache import default_cache_dir

#: bump when the recipe changes (dtype, features): cached results are then made again
RECIPE = 1


def _key(folder: Path, device: str) -> str:
    return checkpoint_key(folder, weight_files(folder) + sorted(folder.glob("config.json")), device, RECIPE)


def _ids_key(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:20]


def prompt_confidence(model: str, prompts: dict[str, list[int]], device: str = "cpu",
                      threads: int | None = None, progress=None) -> pd.DataFrame:
    """Per request id: the confidence features and ``prefill_ms`` (index: ``request_id``).

    ``prompts``: request id -> prompt token ids (as :mod:`modeswitch.oracle.content_columns` builds
    them). ``progress``: called with (done, total) after each prompt."""
    folder = Path(model)
    cache = default_cache_dir() / "confidence" / _key(folder, device)
    cache.mkdir(parents=True, exist_ok=True)
    store = cache / "prompts.parquet"
    cols = ["ids_key", *CONFIDENCE_FEATURES, "prefill_ms"]
    have = (pd.read_parquet(store) if store.exists() else pd.DataFrame(columns=cols)).set_index("ids_key")
    keys = {rid: _ids_key(list(v)) for rid, v in prompts.items()}
    todo = {k: list(prompts[rid]) for rid, k in keys.items() if k not in have.index}
    if todo:
        have = pd.concat([have, _run(folder, todo, device, threads, progress)])
        have = have[~have.index.duplicated(keep="last")]
        write_parquet(have.reset_index(), store, overwrite=True)
    out = have.loc[[keys[r] for r in prompts]].set_axis(pd.Index(list(prompts), name="request_id"))
    return out[[*CONFIDENCE_FEATURES, "prefill_ms"]].astype(float)


def _run(folder: Path, todo: dict[str, list[int]], device: str, threads, progress) -> pd.DataFrame:
    import torch  # heavy: only when prompts are not in the cache
    from transformers import AutoModelForCausalLM  # heavy: pulls torch

    quiet_transformers()
    if threads:
        torch.set_num_threads(threads)
    dtype = torch.float32 if device == "cpu" else torch.float16  # the reference mode's (transformers backend)
    net = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    rows = []
    with torch.inference_mode():
        for i, (key, ids) in enumerate(todo.items()):
            if not ids:
                raise InputError(f"prompt {key}: no token ids to read the reference's confidence from")
            x = torch.tensor([ids], device=device)
            t0 = time.perf_counter()
            logits = net(x, logits_to_keep=1).logits[0, -1]  # the last position's only
            if device != "cpu":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            rows.append((key, *confidence_from_logits(logits.float().cpu().numpy()), ms))
            if progress is not None:
                progress(i + 1, len(todo))
    return pd.DataFrame(rows, columns=["ids_key", *CONFIDENCE_FEATURES, "prefill_ms"]).set_index("ids_key")

