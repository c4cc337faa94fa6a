"""``modeswitch``: one CLI for every step of the pipeline.

Heavy libraries are imported inside each command, so ``modeswitch --help`` is
quick. Errors in user input print one clear line (file, row, field) and exit 2.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer

from modeswitch.display import console, err_console, frame_table

app = typer.Typer(
    name="modeswitch",
    help="Learned routers over LLM inference modes: profile -> label -> train -> score -> "
    "export -> serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def friendly_errors(fn):
    """Turn expected user-input errors into one red line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from dataset.errors import InputFileError
        from oracle.cells import OracleError

        try:
            return fn(*args, **kwargs)
        except InputFileError as exc:
            report = getattr(exc, "report", None)
            err_console.print(f"[red]error:[/red] {report() if report else exc}")
        except (OracleError, FileExistsError, FileNotFoundError, LookupError, ValueError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            err_console.print(f"[red]error:[/red] {msg}")
        raise typer.Exit(2)

    return wrapper


def _split(values: list[str] | None) -> list[str]:
    out = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


# --------------------------------------------------------------------- modes
@app.command("modes")
@friendly_errors
def modes_cmd(
    show: Annotated[str | None, typer.Option(help="Show one mode's full settings.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="With --show: override a setting, key=value (e.g. speculative.num_speculative_tokens=3).")] = None,
):
    """List the registered inference modes (or show one, with overrides)."""
    import json

    import pandas as pd

    from engine.modes import get_mode, list_modes

    if show:
        mode = get_mode(show)
        if set_:
            mode = mode.with_overrides(list(set_))
        console.print_json(json.dumps(mode.to_dict()))
        return
    rows = []
    for m in list_modes():
        rows.append({
            "mode": m.name,
            "quant": m.quantization,
            "speculative": m.speculative.method if m.speculative else "-",
            "prefix": m.prefix_caching,
            "chunked": m.chunked_prefill,
            "batching": m.batching,
            "graphs": "common" if m.graph_capture is None else m.graph_capture,
            "kv": m.kv_cache_dtype,
            "phase": m.primary_phase,
            "substitutes": ", ".join(m.substitutes) or ("(reference)" if m.is_reference else "-"),
        })
    console.print(frame_table(pd.DataFrame(rows).set_index("mode"), title="Registered modes"))


@app.command("workloads")
def workloads_cmd():
    """List the registered workloads (request populations)."""
    import pandas as pd

    from dataset.workloads import list_workloads

    df = pd.DataFrame([{
        "workload": w.name, "condition": w.condition, "prompt": w.prompt_tokens,
        "output": w.expected_output_tokens, "shared_prefix": w.shared_prefix_tokens,
        "concurrent": w.concurrent_requests, "mem_pressure": w.memory_pressure,
        "description": w.description,
    } for w in list_workloads()]).set_index("workload")
    console.print(frame_table(df, title="Registered workloads"))


# ------------------------------------------------------------------ requests
@app.command("requests")
@friendly_errors
def requests_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="Requests file to write (.jsonl or .parquet).")],
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads to draw from (default: all).")] = None,
    n: Annotated[int, typer.Option("-n", help="Requests per workload.")] = 20,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
):
    """Draw a request population from registered workloads (shape spread included)."""
    from dataset.io import write_parquet, write_text
    from dataset.requests import requests_frame
    from dataset.workloads import get_workload, list_workloads

    names = _split(workloads) or [w.name for w in list_workloads()]
    reqs = [r for i, name in enumerate(names) for r in get_workload(name).sample(n, seed + i)]
    df = requests_frame(reqs)
    if output.suffix == ".parquet":
        write_parquet(df, output, overwrite=overwrite)
    else:
        write_text(df.to_json(orient="records", lines=True), output, overwrite=overwrite)
    console.print(f"wrote {len(reqs)} requests from {len(names)} workloads to {output}")


# ------------------------------------------------------------------- import
@app.command("import-profiles")
@friendly_errors
def import_profiles_cmd(
    files: Annotated[list[Path], typer.Argument(help="Published measurement CSV files.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Profile parquet to write.")],
    importer: Annotated[str | None, typer.Option(help="Force an importer (default: detect by columns).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
):
    """Convert external measurements (e.g. the study's A100 CSVs) into a profile table."""
    from dataset.importers import import_files
    from dataset.profile_schema import write_profile

    df = import_files(files, importer)
    write_profile(df, output, overwrite=overwrite)
    agg = int(df["is_aggregate"].sum())
    console.print(
        f"wrote {len(df)} rows ({len(df) - agg} per-trial, {agg} aggregate) covering "
        f"{df['mode'].nunique()} modes x {df['workload'].nunique()} workloads to {output}"
    )


@app.command("validate")
@friendly_errors
def validate_cmd(
    files: Annotated[list[Path], typer.Argument(help="Profile files (.parquet or .csv).")],
):
    """Validate profile files against the schema; report every problem with row and column."""
    from dataset.profile_schema import read_profile

    for f in files:
        df = read_profile(f)
        console.print(f"[green]ok[/green] {f}: {len(df)} rows")


# -------------------------------------------------------------------- label
@app.command("label")
@friendly_errors
def label_cmd(
    profiles: Annotated[list[str], typer.Option("--profiles", "-p", help="Profile parquet file(s); repeat or comma-separate.")],
    requests: Annotated[Path | None, typer.Option(help="Requests to label (.jsonl/.csv/.parquet); default: the profile's own units.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Labels parquet to write; candidates go to <stem>.candidates.parquet.")] = None,
    explain: Annotated[bool, typer.Option(help="Show every mode per unit with the constraint and margin that rejected it.")] = False,
    config: Annotated[Path | None, typer.Option(help="TOML file with constraint thresholds ([constraints] table).")] = None,
    max_energy_ratio: Annotated[float | None, typer.Option(help="Energy per token <= this x reference [1.00].")] = None,
    max_memory_ratio: Annotated[float | None, typer.Option(help="Peak memory <= this x reference [1.02].")] = None,
    max_accuracy_drop_pp: Annotated[float | None, typer.Option(help="Benchmark accuracy drop allowed, points [1.5].")] = None,
    min_rouge_vs_baseline: Annotated[float | None, typer.Option(help="ROUGE-L vs reference-mode output >= this [0.80].")] = None,
    max_rouge_vs_reference_drop: Annotated[float | None, typer.Option(help="ROUGE-L vs gold drop allowed [0.02].")] = None,
    latency_tie_rel: Annotated[float | None, typer.Option(help="Latencies within this relative gap tie [0].")] = None,
    incomplete: Annotated[str | None, typer.Option(help="error (default) or skip: what missing reference rows / metrics do.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
):
    """Label each unit (or request) with the fastest mode that meets every constraint."""
    from dataset.io import write_parquet
    from dataset.profile_schema import read_profiles
    from dataset.requests import read_requests, requests_frame
    from oracle import Constraints, label_profile, label_requests
    from oracle.explain import print_explanations, print_labels

    c = Constraints.from_toml(config) if config else Constraints()
    c = c.replace(
        max_energy_ratio=max_energy_ratio, max_memory_ratio=max_memory_ratio,
        max_accuracy_drop_pp=max_accuracy_drop_pp, min_rouge_vs_baseline=min_rouge_vs_baseline,
        max_rouge_vs_reference_drop=max_rouge_vs_reference_drop,
        latency_tie_rel=latency_tie_rel, on_incomplete=incomplete,
    )
    paths = _split(profiles)
    profile = read_profiles(paths)
    source = ", ".join(paths)
    if requests is not None:
        reqs = requests_frame(read_requests(requests))
        labels, cand, skipped = label_requests(profile, reqs, c, source=source)
    else:
        labels, cand, skipped = label_profile(profile, c, source=source)
    if output is not None:
        cand_path = output.with_name(output.stem + ".candidates.parquet")
        if cand_path.exists() and not overwrite:
            raise FileExistsError(f"{cand_path} already exists; pass --overwrite to replace it")
        write_parquet(labels.reset_index(), output, overwrite=overwrite)
        write_parquet(cand, cand_path, overwrite=overwrite)
    if explain:
        print_explanations(labels, cand, c, out=console)
    print_labels(labels, skipped, c, out=console)
    if output is not None:
        console.print(f"wrote {len(labels)} labels to {output} and the per-mode verdicts to {cand_path}")


# -------------------------------------------------------------------- route
@app.command("route")
@friendly_errors
def route_cmd(
    requests: Annotated[Path, typer.Option(help="Requests to route (.jsonl/.csv/.parquet).")],
    router: Annotated[str, typer.Option(help="Registered router name.")] = "rule",
    available_modes: Annotated[list[str] | None, typer.Option(help="Modes the target backend has (default: all registered).")] = None,
    explain: Annotated[bool, typer.Option(help="Print the rule or reason behind each decision.")] = False,
):
    """Route requests with a router and print the chosen mode per request."""
    import collections

    import pandas as pd

    from dataset.features import features_frame
    from dataset.requests import read_requests
    from routers import get_router

    reqs = read_requests(requests)
    X = features_frame(reqs)
    params = {"available_modes": _split(available_modes)} if available_modes else {}
    est = get_router(router, **params).fit(X)
    if explain and hasattr(est, "explain"):
        df = pd.DataFrame(est.explain(X), columns=["mode", "reason"], index=X.index)
        console.print(frame_table(df, title=f"{router} decisions"))
    counts = collections.Counter(est.predict(X))
    df = pd.DataFrame(sorted(counts.items()), columns=["mode", "requests"]).set_index("mode")
    console.print(frame_table(df, title=f"{router}: {len(reqs)} requests"))


# -------------------------------------------------------------------- model
model_app = typer.Typer(help="The project's own small model (built, not downloaded).",
                        no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("build")
@friendly_errors
def model_build_cmd(
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder [$MODESWITCH_CACHE or ~/.cache/modeswitch].")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if a cached build exists.")] = False,
):
    """Train the small default target model and its draft (cached; about 4 minutes on 2 cores)."""
    import json

    from rich.progress import Progress

    from engine.models.tiny import BuildRecipe, build_models

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


# ------------------------------------------------------------------ profile
@app.command("profile")
@friendly_errors
def profile_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="Profile parquet to write (its journal sits beside it).")],
    backend: Annotated[str, typer.Option(help="Engine backend.")] = "transformers",
    model: Annotated[str, typer.Option(help="'tiny' (built here) or a local Hugging Face checkpoint folder.")] = "tiny",
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint for speculative decoding.")] = None,
    modes: Annotated[list[str] | None, typer.Option(help="Modes to measure (default: every supported one).")] = None,
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads (default: the study's seven families).")] = None,
    requests: Annotated[int | None, typer.Option(help="Requests (or request groups) per workload [3; quick: 1].")] = None,
    trials: Annotated[int, typer.Option(help="Trials per (request, mode).")] = 1,
    benchmarks: Annotated[list[str] | None, typer.Option(help="Benchmark JSONL files to draw prompts from.")] = None,
    benchmark_requests: Annotated[int, typer.Option(help="Prompts per benchmark file.")] = 2,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    seed: Annotated[int, typer.Option(help="Request population seed.")] = 0,
    quick: Annotated[bool, typer.Option(help="One request per workload, one trial: a fast full sweep.")] = False,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: torch's choice).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Model cache folder.")] = None,
    interleave: Annotated[bool, typer.Option(help="Keep all engines loaded; measure each request in every mode back to back.")] = False,
    checkpoint: Annotated[list[str] | None, typer.Option(help="vLLM: pre-quantized checkpoint per mode, KEY=PATH with KEY int8, gptq_4bit or awq_4bit.")] = None,
):
    """Measure modes on workloads and write a validated, resumable profile table."""
    from rich.progress import Progress

    from engine.models.resolve import resolve_models
    from engine.profiler import DEFAULT_WORKLOADS, Profiler, ProfileSpec

    if backend not in ("transformers", "vllm"):
        raise ValueError(f"unknown backend {backend!r}; choose transformers or vllm")
    checkpoints = {}
    for item in _split(checkpoint):
        key, sep, path = item.partition("=")
        if not sep or key not in ("int8", "gptq_4bit", "awq_4bit"):
            raise ValueError(f"--checkpoint {item!r}: expected KEY=PATH with KEY int8, gptq_4bit or awq_4bit")
        checkpoints[key] = path
    if backend == "vllm" and interleave:
        raise ValueError("--interleave keeps every engine loaded; the vLLM backend runs one engine at a time")
    with Progress(console=console) as progress:
        target, draft, card = resolve_models(model, draft_model, cache_dir, progress, console.print)
    if card:
        console.print(f"model: project tiny model ({card['target_params'] / 1e6:.1f} M params, "
                      f"eval loss {card['target_eval_loss']}; draft acceptance "
                      f"{card['draft_acceptance_rate']:.2f})")
    spec = ProfileSpec(
        model=str(target), draft_model=str(draft) if draft else None, backend=backend,
        device=device, modes=_split(modes) or None,
        workloads=_split(workloads) or list(DEFAULT_WORKLOADS),
        requests=requests if requests is not None else (1 if quick else 3),
        trials=trials, seed=seed, benchmarks=_split(benchmarks),
        benchmark_requests=benchmark_requests, threads=threads, interleave=interleave,
        checkpoints=checkpoints,
    )
    df = Profiler(spec, target, draft, output, console=console).run()
    summary = df.groupby(["mode", "family"])["latency_ms"].mean().unstack("family")
    speed = (summary.loc["fp16_baseline"] / summary).round(2)
    speed.columns = [_short(c) for c in speed.columns]
    console.print(frame_table(speed, title="speedup vs the reference (reference latency / mode latency; >1 is faster)"))
    console.print(f"wrote {len(df)} rows ({df['mode'].nunique()} modes x "
                  f"{df['family'].nunique()} workload families) to {output}")


# ------------------------------------------------------------------ dataset
dataset_app = typer.Typer(help="Training tables: requests, features, oracle labels, per-mode costs.",
                          no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")


@dataset_app.command("build")
@friendly_errors
def dataset_build_cmd(
    profiles: Annotated[list[str], typer.Option("--profiles", "-p", help="Profile parquet file(s).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Training table parquet to write.")],
    requests: Annotated[int, typer.Option(help="Requests to draw in all (split evenly over workloads).")] = 2000,
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads to draw from (default: the profile's families that are registered).")] = None,
    benchmarks: Annotated[list[str] | None, typer.Option(help="Benchmark JSONL files to add prompts from.")] = None,
    benchmark_requests: Annotated[int, typer.Option(help="Prompts per benchmark file.")] = 50,
    seed: Annotated[int, typer.Option(help="Population seed.")] = 0,
    config: Annotated[Path | None, typer.Option(help="TOML constraint thresholds.")] = None,
    incomplete: Annotated[str | None, typer.Option(help="error (default) or skip.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
):
    """Draw requests, compute features, label them with the oracle, attach per-mode costs."""
    from dataset.benchmarks import read_benchmark
    from dataset.io import write_parquet
    from dataset.profile_schema import read_profiles
    from dataset.workloads import get_workload, list_workloads
    from oracle import Constraints
    from oracle.training_table import build_training_table

    c = Constraints.from_toml(config) if config else Constraints()
    c = c.replace(on_incomplete=incomplete)
    paths = _split(profiles)
    profile = read_profiles(paths)
    registered = {w.name for w in list_workloads()}
    names = _split(workloads) or [f for f in profile["family"].unique() if f in registered]
    if not names:
        raise ValueError("no registered workload families in the profile; pass --workloads")
    per = max(1, requests // len(names))
    reqs = [r for i, n in enumerate(names) for r in get_workload(n).sample(per, seed=seed * 100 + i)]
    for f in _split(benchmarks):
        reqs += read_benchmark(f, benchmark_requests, seed=seed)
    table = build_training_table(profile, reqs, c, source=", ".join(paths))
    write_parquet(table, output, overwrite=overwrite)
    counts = table["label"].value_counts()
    console.print(f"wrote {len(table)} requests x {table.shape[1]} columns to {output}")
    console.print("labels: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    console.print("label source: " + ", ".join(
        f"{k} {v}" for k, v in table["label_source"].value_counts().items()))


# -------------------------------------------------------------------- train
@app.command("train")
@friendly_errors
def train_cmd(
    data: Annotated[Path, typer.Option(help="Training table from `modeswitch dataset build`.")],
    routers: Annotated[str, typer.Option(help="Router families: dt,rf,lr,lgbm.")] = "dt,rf,lr,lgbm",
    feature_set: Annotated[str, typer.Option(help="A (request shape) or B (A + family/suite).")] = "A",
    split: Annotated[str, typer.Option(help="random, group (by family) or lofo.")] = "group",
    trials: Annotated[int, typer.Option(help="Optuna trials per router family.")] = 30,
    seed: Annotated[int, typer.Option(help="Split and sampler seed.")] = 42,
    unsafe_penalty: Annotated[float, typer.Option(help="Objective penalty per unsafe pick.")] = 1.0,
    safety_threshold: Annotated[float | None, typer.Option(help="Only predict modes whose P(safe) >= this.")] = None,
    fallback: Annotated[str, typer.Option(help="rule or reference, when no mode looks safe.")] = "rule",
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL [sqlite:///mlruns/optuna.db].")] = None,
    mlruns: Annotated[Path, typer.Option(help="MLflow/Optuna store folder.")] = Path("mlruns"),
    preset: Annotated[str | None, typer.Option(help="modeswitch-paper: the study's setup.")] = None,
):
    """Tune and train learned routers with Optuna; track everything in MLflow."""
    import pandas as pd
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from routers.training.trainer import TrainConfig, train

    table = pd.read_parquet(data)
    cfg = TrainConfig(routers=_split([routers]), feature_set=feature_set, split=split,
                      trials=trials, seed=seed, unsafe_penalty=unsafe_penalty,
                      safety_threshold=safety_threshold, fallback=fallback, storage=storage,
                      mlruns=str(mlruns), preset=preset)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=console) as progress:
        res = train(table, cfg, progress)
    cols = ["router", "split", "best_validation_objective", "test_objective", "test_oracle_match",
            "test_macro_f1", "test_mean_regret", "test_violation_rate_any", "rule_objective",
            "rule_oracle_match", "rule_violation_rate_any", "n_test"]
    console.print(frame_table(res.set_index("router")[cols[1:]],
                              title=f"best trial per router family (held-out requests; split {cfg.split})"))
    console.print("runs: " + ", ".join(f"{r.router}={r.run_id}" for r in res.itertuples())
                  + " — open them with `make ui`")


# -------------------------------------------------------------------- score
@app.command("score")
@friendly_errors
def score_cmd(
    data: Annotated[Path, typer.Option(help="Training table the routers were trained on.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="New report folder [reports/score-<time>].")] = None,
    run: Annotated[list[str] | None, typer.Option(help="Training run id(s) to score (default: latest per family).")] = None,
    live: Annotated[bool, typer.Option(help="Also run a held-out stream through the real engine.")] = False,
    live_requests: Annotated[int, typer.Option(help="Requests in the live stream.")] = 12,
    model: Annotated[str, typer.Option(help="Engine model for --live: 'tiny' or a checkpoint folder.")] = "tiny",
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint for --live.")] = None,
    compile_routers: Annotated[bool, typer.Option("--compile/--no-compile", help="Route with compiled routers (default) or the scikit-learn pipelines.")] = True,
    decisions: Annotated[int, typer.Option(help="Single decisions timed per router.")] = 20_000,
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
    seed: Annotated[int, typer.Option(help="Live stream seed.")] = 0,
):
    """Score trained routers against the rule baseline: overhead, violations, speedup, energy, quality."""
    from datetime import datetime

    import pandas as pd

    from modeswitch.display import fmt
    from routers.scoring.run import ScoreConfig, score_routers

    out = output or Path("reports") / f"score-{datetime.now():%Y%m%d-%H%M%S}"
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already holds a report; choose a new folder")
    cfg = ScoreConfig(mlruns=str(mlruns), run_ids=_split(run), compiled=compile_routers,
                      decisions=decisions, live=live, live_requests=live_requests, model=model,
                      draft_model=draft_model, seed=seed, name=out.name)
    with console.status("scoring") as status:
        res = score_routers(pd.read_parquet(data), cfg, out, progress=lambda m: status.update(m))
    head = res["headline"].copy()
    head.index.name = "router"
    cols = {"overhead_p50_us": "p50 us", "overhead_p99_us": "p99 us",
            "violation_rate_quality": "viol qual", "violation_rate_energy": "viol energy",
            "violation_rate_memory": "viol mem", "speedup": "speedup", "energy_ratio": "energy",
            "rouge_delta": "ROUGE-L d", "accuracy_delta_pp": "acc d pp",
            "oracle_match": "oracle match", "latency_capture": "capture lat",
            "energy_capture": "capture energy"}
    table = head[[c for c in cols if c in head.columns]].rename(columns=cols)
    if res["live_summary"] is not None:
        ls = res["live_summary"].set_index("router")
        table["live speedup"] = ls["speedup"].reindex(table.index)
        table["live energy"] = ls["energy_ratio"].reindex(table.index)
        table["live viol qual"] = ls["violation_rate_quality"].reindex(table.index)
    console.print(frame_table(table, title=f"routers vs the rule baseline — held-out requests, "
                                           f"equal family weights ({out})"))
    if res["live_summary"] is not None:
        console.print(f"live: {cfg.live_requests} requests; profile-estimate latency error "
                      f"(mean absolute %): {fmt(res['live_figures']['estimate_mape_pct'], 1)}")
    console.print(f"report: {out}/README.md; MLflow scoring run {res['mlflow_run_id']} (`make ui`)")


# ------------------------------------------------------------------- export
@app.command("export")
@friendly_errors
def export_cmd(
    run: Annotated[str | None, typer.Option(help="Training run id whose router to export.")] = None,
    best: Annotated[str | None, typer.Option(help="Export the best router of the latest scoring run by this metric (e.g. latency_capture, speedup, oracle_match).")] = None,
    max_violation_rate: Annotated[float | None, typer.Option(help="With --best: skip routers whose summed violation rate exceeds this.")] = None,
    name: Annotated[str, typer.Option(help="Registered model name.")] = "modeswitch-router",
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
):
    """Register a trained router in MLflow as a pyfunc model and alias it `champion`."""
    import mlflow
    import mlflow.sklearn

    from routers.export import best_from_scoring, export_router
    from routers.training.tracking import setup

    if (run is None) == (best is None):
        raise ValueError("give exactly one of --run RUN_ID or --best METRIC")
    extra = {}
    if best is not None:
        router_name, run, value, score_run = best_from_scoring(best, str(mlruns), max_violation_rate)
        console.print(f"best by {best}: {router_name} ({value:.4g}) from scoring run {score_run}")
        extra = {"selected_by": best, "selected_value": value, "scoring_run_id": score_run}
    setup(mlruns, "modeswitch-export")
    r = mlflow.MlflowClient().get_run(run)
    uri = r.data.tags.get("model_uri") or f"runs:/{run}/model"
    est = mlflow.sklearn.load_model(uri)
    info = export_router(est, name=name, mlruns=str(mlruns), source_run_id=run,
                         backend=r.data.tags.get("backends", "unknown"),
                         extra={"router_family": r.data.tags.get("router_family"), **extra})
    console.print(f"registered {info['name']} version {info['version']} as {info['uri']} "
                  f"(modes: {', '.join(info['meta']['modes'])}; backend {info['meta']['backend']})")


# -------------------------------------------------------------------- serve
@app.command("serve")
@friendly_errors
def serve_cmd(
    router: Annotated[str, typer.Option(help="models:/NAME@champion (an exported router), 'rule', or 'mode:NAME' (always that mode: a baseline).")] = "models:/modeswitch-router@champion",
    backend: Annotated[str, typer.Option(help="Engine backend.")] = "transformers",
    model: Annotated[str, typer.Option(help="'tiny' (built here) or a local Hugging Face checkpoint folder.")] = "tiny",
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint for speculative decoding.")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="MODESWITCH_API_KEY", help="Require 'Authorization: Bearer KEY'.")] = None,
    route_budget_us: Annotated[float, typer.Option(help="A slower routing decision falls back to the reference.")] = 5000.0,
    memory_budget_mb: Annotated[float, typer.Option(help="Weights kept loaded across engines (LRU unload).")] = 4096.0,
    compile_router: Annotated[bool, typer.Option("--compile/--no-compile", help="Compiled router (default) or the scikit-learn pipeline.")] = True,
    batch_across_requests: Annotated[bool, typer.Option("--batch-across-requests/--one-at-a-time", help="Concurrent requests routed to a continuous-batching engine share its batch (default), or every engine serves one request at a time.")] = True,
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
):
    """Serve an OpenAI-compatible API with the router in front of one engine per mode."""
    import logging

    import uvicorn

    from engine.models.resolve import resolve_models
    from engine.serving import ServerConfig, create_app
    from engine.serving.app import _supported_modes

    if backend not in ("transformers", "vllm"):
        raise ValueError(f"unknown backend {backend!r}; choose transformers or vllm")
    target, draft, _ = resolve_models(model, draft_model, None, None, console.print)
    cfg = ServerConfig(model_path=str(target), draft_path=str(draft) if draft else None,
                       backend=backend, device=device,
                       api_key=api_key, route_budget_us=route_budget_us,
                       memory_budget_mb=memory_budget_mb, batch_across_requests=batch_across_requests)
    modes = _supported_modes(cfg)

    def load():
        if router.startswith("mode:"):
            from routers.reference import FixedModeRouter

            fixed = router.split(":", 1)[1]
            if fixed not in modes:
                raise ValueError(f"--router {router}: the {backend} engine here runs {', '.join(modes)}")
            return FixedModeRouter(mode=fixed).fit()
        if router == "rule":
            from routers.rule_baseline import RuleBaselineRouter

            return RuleBaselineRouter(available_modes=modes, unavailable="reference").fit()
        from routers.export import load_router

        return load_router(router, str(mlruns), available_modes=modes, compiled=compile_router)

    # load once here, so a bad router fails with its reason before the server starts;
    # the server's start-up takes this one, reloads load afresh
    preloaded = [load()]

    def loader():
        return preloaded.pop() if preloaded else load()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    console.print(f"serving {target} on http://{host}:{port}/v1 with router {router}")
    uvicorn.run(create_app(loader, cfg, supported_modes=modes), host=host, port=port, log_level="info")


def _short(name: str) -> str:
    """Compact column labels for wide mode x family tables."""
    return {"short_prompt_short_output": "s/s", "short_prompt_long_output": "s/l",
            "long_prompt_short_output": "l/s", "long_prompt_long_output": "l/l",
            "shared_prefix_chat": "prefix", "memory_pressure_long_context": "mem",
            "batch_pressure": "batch"}.get(name, name)


def main():
    app()


if __name__ == "__main__":
    main()
