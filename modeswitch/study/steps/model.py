"""``model``: build or find the study's model (and the draft its modes need)."""

from __future__ import annotations

import modeswitch.engine.models.resolve as model_resolve


def run(study) -> dict:
    target, draft, card = model_resolve.resolve_models(study.cfg.model, study.cfg.draft_model, None, None,
                                                       study.log, modes=study.cfg.modes)
    return {"target": str(target), "draft": str(draft) if draft else None,
            "params": (card or {}).get("target_params")}


def resolve_quietly(cfg):
    """The study's (target, draft, card), as the model step left them, saying nothing:
    the later steps read the model again without repeating the model step's log."""
    return model_resolve.resolve_models(cfg.model, cfg.draft_model, None, None, lambda *a: None,
                                        modes=cfg.modes)
