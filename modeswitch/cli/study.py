"""``modeswitch study run``: profile, cost model, labels, training table, routers on every
split, offline and live scores and one report, from one ``study.toml``; resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from modeswitch.cli.common import (
    AdvancedOptionsCommand,
    RayAddress,
    RayCpus,
    RayFlag,
    RayWorkers,
    _split,
    friendly_errors,
    ray_options,
    reading,
)
from modeswitch.display import console, frame_table
from modeswitch.study import Study, StudyConfig

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)

study_app = typer.Typer(help="The study end to end, from one TOML file; resumable.", no_args_is_help=True)
app.add_typer(study_app, name="study")


@study_app.command("run", cls=AdvancedOptionsCommand)
@friendly_errors
def study_run_cmd(
    config: Annotated[Path, typer.Option(help="Study settings (TOML: [study] [model] [profile] [conditions] [dataset] [constraints] [train] [score]).")] = Path("study.toml"),
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Study folder (overrides [study] output).")] = None,
    only: Annotated[list[str] | None, typer.Option(help="Run only these steps (e.g. profile, train, score:random); the others must be done.")] = None,
    redo: Annotated[list[str] | None, typer.Option(help="Run these finished steps again (e.g. report after a change to it); a score report is moved aside, not overwritten.")] = None,
    beside: Annotated[Path | None, typer.Option(help="Another study's folder or archive: the report sets its per-mode, offline and live figures beside this one's, and, where it ran another backend, this backend is measured again on its requests (step `beside`) so both backends' modes stand side by side on the same requests.")] = None,
    from_archive: Annotated[Path | None, typer.Option(help="A study archive (`modeswitch study archive`): its profile, memory pass, cost model and quality sweep, where measured with this study's settings, are copied in instead of measured again.")] = None,
    ray: RayFlag = False,
    ray_address: RayAddress = None,
    ray_workers: RayWorkers = None,
    ray_cpus_per_worker: RayCpus = None,
):
    """Run (or resume) the study: every step not finished yet, each step's time printed."""
    with reading(config):
        cfg = StudyConfig.from_toml(config)
    if output is not None:
        cfg = cfg.replace(output=str(output))
    study = Study(cfg, console=console, ray=ray_options(ray, ray_address, ray_workers, ray_cpus_per_worker),
                  beside=beside, redo=_split(redo))
    console.print(f"study {cfg.name} in {study.out} (settings {cfg.identity()}); steps: "
                  + ", ".join(study.steps()))
    if from_archive is not None:
        study.seed_from(from_archive)
    # after seeding: a step asked for again is measured again, not taken from the archive
    for step in _split(redo):
        study.forget(step)
    study.run(_split(only) or None)
    if study.done("report"):
        console.print(f"report: {study.out}/README.md")
        table = study.out / "opening_table.csv"
        if table.exists():
            df = pd.read_csv(table).set_index("router")
            console.print(frame_table(df, title="opening table (offline and live, 95 % intervals)"))


@study_app.command("archive")
@friendly_errors
def study_archive_cmd(
    dest: Annotated[Path, typer.Argument(help="A new folder for the archive (never written over).")],
    config: Annotated[Path, typer.Option(help="The study's settings (TOML).")] = Path("study.toml"),
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Study folder (overrides [study] output).")] = None,
):
    """Keep a study's measurements (profile, memory pass, cost model, quality sweep) apart from its
    folder, for `study run --from-archive` to start another study from."""
    with reading(config):
        cfg = StudyConfig.from_toml(config)
    if output is not None:
        cfg = cfg.replace(output=str(output))
    manifest = Study(cfg).archive_to(dest)
    console.print(f"archived {', '.join(manifest['steps'])} of {cfg.output} in {dest}")
