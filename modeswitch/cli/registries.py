"""What is registered, and requests drawn from it: ``modes`` (one mode's settings,
with overrides), ``workloads`` and ``requests`` (a population drawn from workloads).
No engine needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from pydantic import ValidationError

from modeswitch.cli.common import (
    _split,
    friendly_errors,
)
from modeswitch.cli.oracle_options import first_error
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import write_parquet, write_text
from modeswitch.dataset.requests import requests_frame
from modeswitch.dataset.workloads import get_workload, list_workloads
from modeswitch.display import console, frame_table
from modeswitch.engine.modes import get_mode, list_modes

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("modes")
@friendly_errors
def modes_cmd(
    show: Annotated[str | None, typer.Option(help="Show one mode's full settings.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="With --show: override a setting, key=value (e.g. speculative.num_speculative_tokens=3).")] = None,
):
    """List the registered inference modes (or show one, with overrides)."""
    if show:
        mode = get_mode(show)
        if set_:
            try:
                mode = mode.with_overrides(list(set_))
            except ValidationError as exc:
                field, msg = first_error(exc)
                raise InputError(f"--set {field}: {msg}") from None
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
@friendly_errors
def workloads_cmd():
    """List the registered workloads (request populations)."""
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
    names = _split(workloads) or [w.name for w in list_workloads()]
    reqs = [r for i, name in enumerate(names) for r in get_workload(name).sample(n, seed + i)]
    df = requests_frame(reqs)
    if output.suffix == ".parquet":
        write_parquet(df, output, overwrite=overwrite)
    else:
        write_text(df.to_json(orient="records", lines=True), output, overwrite=overwrite)
    console.print(f"wrote {len(reqs)} requests from {len(names)} workloads to {output}")
