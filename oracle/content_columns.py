"""The training table's content columns: each request's prompt as the engine sends it,
and the content features read from it (:mod:`modeswitch.dataset.content_features`).

Why at table time: a synthetic request is a shape until the engine's prompt builder
gives it real text (``modeswitch.engine.prompts``, deterministic for a tokenizer and a corpus).
Building the same prompt here, with the model's own tokenizer, gives the table the
token ids the profile and the sweep ran and the features a server would read from
them; the ids are kept (``prompt_token_ids``) so a router routing the table's requests
reads the same ids.
"""

from __future__ import annotations

import pandas as pd

from modeswitch.dataset.content_features import CONTENT_FEATURES
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import list_workloads
from modeswitch.engine import prompts
from modeswitch.engine.content_table import content_table
from modeswitch.engine.profiler.plan import check_plan

#: the column holding each request's prompt token ids
TOKEN_IDS = "prompt_token_ids"


def prompt_ids(requests: list[Request], model: str,
               built_from: dict[str, Request] | None = None) -> dict[str, list[int]]:
    """Each request's prompt token ids, built as the engine builds them for ``model``.

    ``built_from``: request id -> the request its prompt was built from, where that is
    not the request itself. A profiled request's table row holds the unit's measured
    shape, not the budgets its prompt was built from, so it is rebuilt from the
    profile's plan (:func:`modeswitch.engine.profiler.plan.profiled_units`: the unit's first
    member), as the live check replays it.

    A request without its text or ids whose family is no registered workload (a profiled
    benchmark unit: the profile keeps its shape, not its prompt) is an error naming it:
    the builder would give it another prompt than the one measured."""
    from transformers import AutoTokenizer  # heavy: only when a table takes content columns

    built_from = built_from or {}
    check_plan(requests, built_from, "content columns")
    ids = [r.id for r in requests]  # the table's ids, whatever the prompt was built from
    requests = [built_from.get(r.id, r) for r in requests]
    registered = {w.name for w in list_workloads()}
    for r in requests:
        if r.prompt is None and r.prompt_token_ids is None and (r.family or r.workload) not in registered:
            raise InputError(f"request {r.id}: no prompt text or token ids, and its family {r.family!r} is no "
                             "registered workload, so its prompt cannot be rebuilt for content features (a "
                             "profiled benchmark unit?); build the table without --content-model, or without "
                             "--profiled")

    builder = prompts.PromptBuilder(AutoTokenizer.from_pretrained(str(model)))
    return {rid: builder.prepare(r)[1] for rid, r in zip(ids, requests)}


def content_columns(requests: list[Request], model: str,
                    built_from: dict[str, Request] | None = None) -> pd.DataFrame:
    """Per request (index: id): its prompt token ids and its content features
    (``built_from``: as in :func:`prompt_ids`)."""
    table = content_table(str(model))
    ids = prompt_ids(requests, model, built_from)
    feats = pd.DataFrame([table.features(v) for v in ids.values()], columns=list(CONTENT_FEATURES),
                         index=pd.Index(list(ids), name="request_id"))
    feats[TOKEN_IDS] = [list(v) for v in ids.values()]
    return feats
