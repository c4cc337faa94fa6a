"""``route``: route requests with a registered router (the rule baseline by default)
and print the decisions, with reasons on ``--explain``."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from modeswitch.cli.common import (
    _split,
    friendly_errors,
    reading,
)
from modeswitch.dataset.features import features_frame
from modeswitch.dataset.requests import read_requests
from modeswitch.display import console, frame_table
from modeswitch.routers import get_router

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("route")
@friendly_errors
def route_cmd(
    requests: Annotated[Path, typer.Option(help="Requests to route (.jsonl/.csv/.parquet).")],
    router: Annotated[str, typer.Option(help="Registered router name.")] = "rule",
    available_modes: Annotated[list[str] | None, typer.Option(help="Modes the target backend has (default: all registered).")] = None,
    explain: Annotated[bool, typer.Option(help="Print the rule or reason behind each decision.")] = False,
):
    """Route requests with a router and print the chosen mode per request."""
    with reading(requests):
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
