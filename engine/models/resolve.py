"""``--model tiny|PATH`` and ``--draft-model PATH`` -> checkpoint folders."""

from __future__ import annotations

from pathlib import Path


def check_checkpoint(path: Path, flag: str) -> Path:
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{flag} {path}: not a Hugging Face checkpoint folder (no config.json); give a local "
            "folder saved with save_pretrained, or 'tiny' for the project's own model"
        )
    return path


def resolve_models(model: str = "tiny", draft_model: str | None = None, cache_dir=None,
                   progress=None, log=print) -> tuple[Path, Path | None, dict | None]:
    """(target folder, draft folder or None, build card when the tiny model is used)."""
    if model == "tiny":
        from engine.models.tiny import build_models

        built = build_models(cache_dir, progress=progress, log=log)
        draft = check_checkpoint(Path(draft_model), "--draft-model") if draft_model else built.draft
        return built.target, draft, built.card
    target = check_checkpoint(Path(model), "--model")
    draft = check_checkpoint(Path(draft_model), "--draft-model") if draft_model else None
    return target, draft, None
