"""``serve``: an OpenAI-compatible API with the router in front of one engine per mode.

Thin over its config dataclass (:class:`modeswitch.engine.serving.ServerConfig`): one option per
user-settable field, with the field's default; tests/test_cli_options.py holds it to
that, and lists the fields left out on purpose.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Annotated

import typer
import uvicorn

import modeswitch.engine.models.resolve as model_resolve
from modeswitch.cli.common import (
    ADVANCED,
    CheckpointOption,
    backend_name,
    backend_names,
    deferred_help,
    friendly_errors,
    parse_checkpoints,
    reading,
)
from modeswitch.dataset.errors import InputError
from modeswitch.display import console
from modeswitch.engine.models.resolve import MODEL_HELP
from modeswitch.engine.serving import LoadedRouter, ServerConfig, create_app, supported_modes
from modeswitch.engine.serving.connections import uvicorn_options
from modeswitch.routers.export import check_available_modes, load_router
from modeswitch.routers.reference import FixedModeRouter
from modeswitch.routers.rule_baseline import RuleBaselineRouter
from modeswitch.routers.training.tracking import use_tracking_uri

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


def _load_exported(uri: str, mlruns, tracking_uri, modes, compiled: bool, trust_pickle: bool):
    """An exported router for the server (its modes checked against ``modes`` when given)."""
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
    checkpoint: CheckpointOption = None,
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="MODESWITCH_API_KEY", help="Require 'Authorization: Bearer KEY' (better: $MODESWITCH_API_KEY or --api-key-file; argv is visible to every user).")] = None,
    api_key_file: Annotated[Path | None, typer.Option(help="Read the API key from this file (first line).")] = None,
    admin_key: Annotated[str | None, typer.Option(rich_help_panel=ADVANCED, envvar="MODESWITCH_ADMIN_KEY", help="Key POST /admin/feedback requires (not the API key; better: $MODESWITCH_ADMIN_KEY). Without one, feedback is off.")] = None,
    feedback_window_s: Annotated[float, typer.Option(rich_help_panel=ADVANCED, help="An outcome is taken for a request at most this many seconds after it was routed.")] = 600.0,
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
    max_receiving_bodies: Annotated[int, typer.Option(help="Connections sending a request body at once (all addresses); one more closes the one sending longest. Such a connection holds no request slot.")] = 1024,
    raw_completions: Annotated[bool, typer.Option(help="/v1/completions sends the prompt as written, not as a user turn in an instruct model's chat template.")] = False,
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking store holding the router's registry [$MLFLOW_TRACKING_URI, else SQLite in --mlruns].")] = None,
    trust_pickle: Annotated[bool, typer.Option(help="Also load a router stored as a pickle (exports made before skops): it runs whatever code the file holds.")] = False,
):
    """Serve an OpenAI-compatible API with the router in front of one engine per mode."""
    # every limit checked before any work (the model path is filled in once resolved)
    cfg = ServerConfig(model_path=str(model), backend=backend, device=device,
                       checkpoints=parse_checkpoints(checkpoint), served_name=served_name,
                       max_tokens_limit=max_tokens_limit, route_budget_us=route_budget_us,
                       memory_budget_mb=memory_budget_mb, batch_across_requests=batch_across_requests,
                       max_body_bytes=max_body_bytes, max_in_flight=max_in_flight, context_tokens=context_tokens,
                       header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                       max_connections_per_peer=max_connections_per_peer,
                       max_receiving_bodies=max_receiving_bodies, raw_completions=raw_completions,
                       admin_key=admin_key, feedback_window_s=feedback_window_s)
    if api_key_file is not None:
        if api_key is not None:
            raise InputError("give --api-key (or $MODESWITCH_API_KEY) or --api-key-file, not both")
        with reading(api_key_file):
            lines = api_key_file.read_text().splitlines()
        api_key = lines[0].strip() if lines and lines[0].strip() else None
        if api_key is None:
            raise InputError(f"{api_key_file}: the first line holds no key")
    if admin_key is not None and admin_key == api_key:
        raise InputError("--admin-key must differ from the API key: feedback steers the router")
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
            fixed = router.split(":", 1)[1]
            if fixed not in modes:
                raise InputError(f"--router {router}: the {backend} engine here runs {', '.join(modes)}")
            return FixedModeRouter(mode=fixed).fit()
        if router == "rule":
            return RuleBaselineRouter(available_modes=modes, unavailable="reference").fit()
        return _load_exported(router, mlruns, tracking_uri, modes, compile_router, trust_pickle)

    # load once here, so a bad router fails with its reason before the server starts;
    # the server's start-up takes this one, reloads load afresh
    if preloaded:
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
