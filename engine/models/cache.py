"""Where built and converted models are cached: ``$MODESWITCH_CACHE`` or
``~/.cache/modeswitch`` (each model in ``models/<name>-<key>/``, keyed by what made it)."""

from __future__ import annotations

import os
from pathlib import Path

#: the model card every build or conversion writes into its folder (the tiny model: above
#: its target/ and draft/ folders)
CARD = "modeswitch_model.json"


def default_cache_dir() -> Path:
    env = os.environ.get("MODESWITCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "modeswitch"
