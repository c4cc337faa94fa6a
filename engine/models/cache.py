"""Where built and converted models are cached: ``$MODESWITCH_CACHE`` or
``~/.cache/modeswitch`` (each model in ``models/<name>-<key>/``, keyed by what made it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import sha256_file

#: the model card every build or conversion writes into its folder (the tiny model: above
#: its target/ and draft/ folders)
CARD = "modeswitch_model.json"


def default_cache_dir() -> Path:
    env = os.environ.get("MODESWITCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "modeswitch"


def source_id(folder: Path) -> str:
    """What identifies the checkpoint: its card (what made it) or its weights' SHA-256."""
    card = folder / CARD
    if card.exists():
        made = {k: v for k, v in json.loads(card.read_text()).items() if not k.endswith("_seconds")}
        return json.dumps(made, sort_keys=True)
    weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not weights:
        raise InputError(f"{folder}: no *.safetensors or *.bin weights")
    return "|".join(f"{p.name}:{sha256_file(p)}" for p in weights)
