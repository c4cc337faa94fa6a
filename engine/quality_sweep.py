"""Per-request quality of the lossy modes, measured apart from the latency profile.

Why apart: the latency profile measures few requests with care (interleaved trials,
contention flagged and measured again), so most of a training table's requests get
their quality from their family's mean, and a label that does not vary inside a
family teaches a router nothing about which request fails. Quality needs no timing
hygiene, only each mode's output, so the sweep runs many requests, in batches, one
engine at a time.

Per request and mode it records the output's ROUGE-L against the reference mode's
output for the same request in the same batch (so only the mode differs) and, where
the request's question has a gold answer, whether the answer is right. Lossless modes
are left out by default: their divergence is the reference's own floor, which the
profile reports. The sweep's time and throughput (requests per second per mode) are
part of its result.

Repeats (``repeats``): in some modes a request's verdict depends on the other requests
the engine served. The transformers backend generates each request alone, and only
prefix caching and continuous batching keep state across requests, so on one machine
the other modes give the same output in any batch. Prefix caching reuses KV that an earlier request computed, so the
prefill splits where the store's contents say; continuous batching runs the batch's
sequences in one forward. Both change the sums, INT8's per-call activation scales the
more, and a greedy answer near a tie turns (a jump in ROUGE-L, not a drift), so those
modes' verdicts can differ from one pass to another (two passes compared:
docs/results.md). The prefix
store carries over between a batch's requests and between passes run in one engine (a
resumed pass starts empty): unlike the profiler and the live check, which start each
request from a store primed with its own prefix (``start_unit``). vLLM batches every
mode. With ``repeats = k`` every mode runs every request k times, each
repeat in batches of other companions (the family's requests shuffled), and the table
keeps the worst repeat: a request is safe only where every batch judged it safe
(accuracy: a lossy mode's worst repeat against the reference's best). A family's mean,
which the family rule judges, is then a mean of worst passes: stricter than one pass's,
and the more so the more passes. A family that fits in one batch meets no other
companions, only another order. ``rouge_l_spread`` (best minus worst) and ``flipped``
(the repeats disagree on ROUGE-L >= 0.8, :data:`FLIP_AT`) say how often one pass would
have decided otherwise.

Resumable: every finished (mode, repeat, batch) is journalled (the profiler's
:class:`~modeswitch.engine.profiler.journal.Journal`), and a rerun with the same settings continues.
The number of passes is not part of the journal's identity: pass r plans the same
batches whatever the count, so a sweep with more passes continues one with fewer (a
finished 3-hour sweep gains a second pass without running the first again), and one
with fewer reads the first passes of a longer journal.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.dataset.benchmarks import score_answer
from modeswitch.dataset.errors import InputError, InputFileError
from modeswitch.dataset.io import write_parquet
from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads.conditions import arrival_group
from modeswitch.engine import prompts
from modeswitch.engine.backends import registry
from modeswitch.engine.backends.base import EngineSettings, context_for
from modeswitch.engine.hardware import hardware_string, other_kinds
from modeswitch.engine.modes import get_mode
from modeswitch.engine.profiler.journal import Journal
from modeswitch.engine.quality import rouge_l

#: the sweep's columns, one row per (request, mode)
COLUMNS = ("request_id", "family", "workload", "benchmark_suite", "mode", "reference_mode", "batch",
           "output_tokens", "rouge_l_vs_baseline", "accuracy", "repeats", "rouge_l_spread", "flipped",
           "model", "backend", "hardware")
#: the ROUGE-L that ``flipped`` reads: fixed at the quality rule's default
#: (``modeswitch.oracle.Constraints.min_rouge_vs_baseline``), whatever a study sets; accuracy not read
FLIP_AT = 0.8


@dataclass(frozen=True)
class SweepSpec:
    """What one sweep runs: the model, the modes and the requests (by id and shape).

    ``modes``: None, the reference and every lossy mode the engine can run; else these
    (the reference is added). ``batch_size``: requests generated together in one call.
    """

    model: str
    requests: tuple[Request, ...]
    draft_model: str | None = None
    backend: str = "transformers"
    device: str = "cpu"
    modes: tuple[str, ...] | None = None
    batch_size: int = 16
    threads: int | None = None
    checkpoints: dict = field(default_factory=dict)
    #: run each request with the companions that arrive with it
    #: (:func:`modeswitch.dataset.workloads.conditions.arrival_group`) and judge the group's joined
    #: output, as the profiler and the live check do; ``batch_size`` then counts sequences
    #: (a group is never split). False: the request's own output alone
    arrival_groups: bool = False
    #: passes over every request, each in batches of other companions; the table keeps
    #: the worst (see the module's docstring)
    repeats: int = 1

    def __post_init__(self):
        if self.batch_size < 1:
            raise InputError(f"batch size {self.batch_size}: at least 1")
        if self.repeats < 1:
            raise InputError(f"repeats {self.repeats}: at least 1")
        if not self.requests:
            raise InputError("the sweep has no requests")
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise InputError("the sweep's requests repeat ids: "
                             + ", ".join(sorted({i for i in ids if ids.count(i) > 1})[:5]))

    def identity(self) -> str:
        """Settings that change the result (the journal refuses to mix two runs)."""
        d = {**asdict(self), "requests": [r.to_dict() for r in self.requests]}
        if not self.arrival_groups:  # added later: sweeps journalled before it keep their identity
            d.pop("arrival_groups")
        # every journal row says its pass, and pass r's batches do not depend on the count:
        # more passes continue a journal of fewer (and sweeps before repeats keep their identity)
        d.pop("repeats")
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def group(self, req: Request) -> list[Request]:
        """What runs for ``req``: its arrival group, or the request alone."""
        return arrival_group(req) if self.arrival_groups else [req]

    def batches(self, repeat: int = 0) -> list[list[Request]]:
        """The requests in batches of ``batch_size`` sequences (a request's arrival group
        counts its members, and stays in one batch), each family's apart (one batch holds
        prompts of one shape range, as the server's batches of one workload do). Repeat 0
        keeps the requests' order; repeat r > 0 shuffles each family's (seeded by r), so a
        request meets other companions."""
        out = []
        families: dict[str, list[Request]] = {}
        for r in self.requests:
            families.setdefault(r.family or r.workload or "", []).append(r)
        for reqs in families.values():
            if repeat:
                reqs = [reqs[i] for i in np.random.default_rng(repeat).permutation(len(reqs))]
            batch, size = [], 0
            for r in reqs:
                n = len(self.group(r))
                if batch and size + n > self.batch_size:
                    out.append(batch)
                    batch, size = [], 0
                batch.append(r)
                size += n
            if batch:
                out.append(batch)
        return out


def planned_modes(spec: SweepSpec) -> tuple[list[str], dict[str, str]]:
    """(modes to run, the reference first; skipped mode -> why)."""
    be = registry.get_backend(spec.backend)
    settings = _settings(spec)
    caps, runnable, skipped = be.plan(settings, spec.modes)
    ref = caps.reference_mode
    if spec.modes is None:  # lossless modes are the floor's business, not the sweep's
        runnable = [m for m in runnable if m == ref or not get_mode(m).lossless]
    return runnable, skipped


def _settings(spec: SweepSpec) -> EngineSettings:
    return EngineSettings(spec.model, spec.draft_model, spec.device, threads=spec.threads,
                          checkpoints=dict(spec.checkpoints), max_context=context_for(spec.requests))


def run_sweep(spec: SweepSpec, output: Path, progress=None, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the sweep (resuming from ``output``'s journal) and write ``output`` (parquet).

    Returns (one row per request and mode, the per-mode throughput table)."""
    output = Path(output)
    if output.exists():
        raise FileExistsError(f"{output} already exists; choose a new path")
    modes, skipped = planned_modes(spec)
    for m, why in skipped.items():
        log(f"skipped {m}: {why}")
    journal = Journal(output.with_name(output.name + ".journal.jsonl"), spec)
    try:
        rows = _planned_rows(journal.rows, spec)
        here = hardware_string(spec.device)
        elsewhere = other_kinds(here, sorted({r["hardware"] for r in rows if "hardware" in r}))
        if elsewhere:  # a lossy mode's output depends on the kernels (docs/oracle.md)
            log(f"{journal.path}: rows measured on another kind of machine ({'; '.join(elsewhere)}) than this "
                f"one ({here}); their verdicts need not hold here, and the table names both")
        done = {(r["mode"], r.get("repeat", 0), r["batch"]) for r in rows}
        passes = [(rep, k, b) for rep in range(spec.repeats) for k, b in enumerate(spec.batches(rep))]
        _check_batches(journal.path, journal.rows, passes)
        be = registry.get_backend(spec.backend)
        settings = _settings(spec)
        task = progress.add_task("quality sweep", total=len(modes) * len(passes)) if progress else None
        if progress:
            progress.update(task, completed=len(done))
        builder = None
        for mode in modes:
            todo = [(rep, k, b) for rep, k, b in passes if (mode, rep, k) not in done]
            if not todo:
                continue
            engine = be.load(mode, settings)
            try:
                builder = builder or prompts.PromptBuilder(engine.tokenizer)
                for rep, k, batch in todo:
                    # every member of every request's group, with the request it belongs to
                    members = [(lead.id, i, m) for lead in batch for i, m in enumerate(spec.group(lead))]
                    group = [builder.prepare(m) for _, _, m in members]
                    # real text ends at the model's end of answer, as the profiler runs it
                    ignore_eos = not any(r.benchmark_suite or r.evaluation_mode for r, _ in group)
                    t0 = time.perf_counter()
                    gens = engine.run(group, ignore_eos=ignore_eos)
                    seconds = time.perf_counter() - t0
                    rows.append({"mode": mode, **({"repeat": rep} if rep else {}), "batch": k,
                                 "seconds": seconds, "requests": len(batch), "hardware": here,
                                 "outputs": [{"request_id": lead, "member": i, "text": g.text,
                                              "output_tokens": g.output_tokens, "reference": r.reference,
                                              "evaluation_mode": r.evaluation_mode}
                                             for (lead, i, _), (r, _), g in zip(members, group, gens)]})
                    journal.add(rows[-1])
                    if progress:
                        progress.update(task, advance=1, description=f"quality sweep: {mode}")
            finally:
                engine.close()
        frame, throughput = _results(spec, rows, modes[0], here)
        write_parquet(frame, output)
        return frame, throughput
    finally:
        journal.close()


def _planned_rows(rows: list[dict], spec: SweepSpec) -> list[dict]:
    """The journal's rows of this sweep's passes: a sweep with fewer passes than its
    journal holds reads the first ones (the table of a one-pass sweep stays one pass's)."""
    return [r for r in rows if r.get("repeat", 0) < spec.repeats]


def _check_batches(path: Path, rows: list[dict], passes: list) -> None:
    """Every journalled batch holds the requests this sweep plans for it. A pass's batches
    come from a seeded shuffle; another numpy could draw them otherwise, and a resumed
    sweep would then run some requests twice and others never."""
    planned = {(rep, k): {r.id for r in b} for rep, k, b in passes}
    reps = {rep for rep, _, _ in passes}
    for i, row in enumerate(rows):
        key = (row.get("repeat", 0), row["batch"])
        if key[0] not in reps:  # a later pass than this sweep runs: not read
            continue
        got = {o["request_id"] for o in row["outputs"]}
        if planned.get(key) != got:
            raise InputFileError(path, i, "outputs",
                                 f"pass {key[0]}, batch {key[1]} ({row['mode']}) holds other requests than this "
                                 "sweep plans for it (its batches were drawn otherwise); start a new sweep")


def _results(spec: SweepSpec, rows: list[dict], reference: str,
             hardware: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-(request, mode) table and the per-mode throughput, from the journal."""
    by_id = {r.id: r for r in spec.requests}
    batch_of = {r.id: k for k, b in enumerate(spec.batches()) for r in b}
    outputs: dict[tuple[str, str, int], list[dict]] = {}
    hardware = hardware or hardware_string(spec.device)  # this machine's
    # where each (request, mode) ran: rows journalled before the field ran here
    ran_on: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        for o in row["outputs"]:
            outputs.setdefault((o["request_id"], row["mode"], row.get("repeat", 0)), []).append(o)
            ran_on.setdefault((o["request_id"], row["mode"]), set()).add(row.get("hardware", hardware))

    def joined(group: list[dict]) -> str:
        # a group's output is its members' joined, as the profiler and the live check judge it
        return "\n".join(o["text"] for o in sorted(group, key=lambda o: o.get("member", 0)))

    per_repeat: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for (rid, mode, rep), group in sorted(outputs.items(), key=lambda kv: kv[0][2]):
        ref = outputs.get((rid, reference, rep))  # the reference in the same batch
        acc = [score_answer(o["text"], o["reference"], o["evaluation_mode"]) for o in group]
        acc = [a for a in acc if a is not None]
        per_repeat.setdefault((rid, mode), []).append(
            (rouge_l(joined(group), joined(ref)) if ref else float("nan"),
             float(np.mean(acc)) if acc else float("nan"),
             int(sum(o["output_tokens"] for o in group))))
    out = []
    for (rid, mode), reps in per_repeat.items():
        req = by_id[rid]
        rouge = np.array([r for r, _, _ in reps])
        known = rouge[~np.isnan(rouge)]
        acc = [a for _, a, _ in reps if not np.isnan(a)]
        out.append({"request_id": rid, "family": req.family, "workload": req.workload,
                    "benchmark_suite": req.benchmark_suite, "mode": mode, "reference_mode": reference,
                    # batch and length: the first pass's (what a one-pass sweep records)
                    "batch": batch_of[rid], "output_tokens": reps[0][2],
                    # the worst repeat: safe only where every batch judged it safe
                    "rouge_l_vs_baseline": float(known.min()) if len(known) else float("nan"),
                    # accuracy: a lossy mode's worst repeat, the reference's best (the drop the
                    # rule reads is then the largest the repeats show)
                    "accuracy": float((max if mode == reference else min)(acc)) if acc else float("nan"),
                    "repeats": len(known),  # passes judged (a pass without the reference is not)
                    "rouge_l_spread": float(known.max() - known.min()) if len(known) else float("nan"),
                    "flipped": bool(len(known) and (known >= FLIP_AT).any() and (known < FLIP_AT).any()),
                    "model": spec.model, "backend": spec.backend,
                    # the verdict compares two outputs: every machine either ran on
                    "hardware": " | ".join(sorted(ran_on.get((rid, mode), {hardware})
                                                  | ran_on.get((rid, reference), set())))})
    frame = pd.DataFrame(out, columns=list(COLUMNS)).sort_values(["request_id", "mode"]).reset_index(drop=True)
    per = pd.DataFrame([{"mode": r["mode"], "requests": r.get("requests", len(r["outputs"])),
                         "seconds": r["seconds"]} for r in rows]).groupby("mode")[["requests", "seconds"]].sum()
    per["requests_per_s"] = per["requests"] / per["seconds"]
    return frame, per.reset_index()


def flipped_share(frame: pd.DataFrame) -> float:
    """The share of (request, lossy mode) pairs whose passes disagree on ROUGE-L >=
    :data:`FLIP_AT` (NaN for a sweep without lossy rows): how often one pass would have
    judged otherwise."""
    lossy = frame[frame["mode"] != frame["reference_mode"]]
    return float(lossy["flipped"].mean()) if len(lossy) else float("nan")


def sweep_passes(frame: pd.DataFrame) -> int:
    """How many passes a sweep's table judged (its ``repeats``; 1 for a table written
    before repeats)."""
    return int(frame["repeats"].max()) if "repeats" in frame.columns and frame["repeats"].notna().any() else 1


def read_sweep(path) -> pd.DataFrame:
    """A sweep's table (from :func:`run_sweep`), checked: the columns the training table
    reads, one row per (request, mode), ROUGE-L in [0, 1]. Errors name file, row, column."""
    path = Path(path)
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise InputFileError(path, None, None, f"cannot be read as a sweep ({exc})") from None
    for col in ("request_id", "mode", "reference_mode", "rouge_l_vs_baseline", "accuracy"):
        if col not in df.columns:
            raise InputFileError(path, None, col, "missing (not a table from `modeswitch quality-sweep`)")
    dup = df.duplicated(["request_id", "mode"])
    if dup.any():
        k = int(dup.to_numpy().argmax())
        raise InputFileError(path, k, "request_id", f"({df['request_id'].iloc[k]!r}, {df['mode'].iloc[k]!r}) "
                             "appears twice")
    bad = ~df["rouge_l_vs_baseline"].between(0, 1) & df["rouge_l_vs_baseline"].notna()
    if bad.any():
        k = int(bad.to_numpy().argmax())
        raise InputFileError(path, k, "rouge_l_vs_baseline", f"{df['rouge_l_vs_baseline'].iloc[k]} is not in [0, 1]")
    return df
