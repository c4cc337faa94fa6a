"""This study's modes beside another backend's, on the same requests.

Why: a mode's speed-up depends on the engine's kernels, not only on what the mode
does (the transformers backend's int8 and 4-bit modes are slower than its fp32
reference on a CPU without int8 kernels; llama.cpp's Q8_0 and Q4 decode faster). To
show that, the two backends must be compared on identical requests on the same kind of
machine. Another study's folder or archive (``--beside DIR``: its ``profile.parquet``
and the settings in its ``archive.json`` or ``study_state.json``) names which requests
it measured; the ``beside`` step measures this study's backend on exactly those
(same families, count, seed, conditions and length scale, this study's modes, trials
and threads) into ``beside_profile.parquet``, and the report sets the two per-mode
tables side by side on the requests whose shapes agree in both. A study of the same
backend and design measured on another kind of machine (an archive from there) needs
no step: its requests are this study's, and the report sets the two machines' modes
side by side, saying mode by mode whether the speed-up's direction agrees.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.dataset.errors import InputFileError
from modeswitch.dataset.io import write_csv
from modeswitch.dataset.workloads.conditions import ConditionDraw
from modeswitch.oracle.mode_table import mode_table
from modeswitch.study.markdown import md_table, passing_cell, value_cell

#: where the ``beside`` step (:mod:`modeswitch.study.steps.beside`) writes its profile
BESIDE_PROFILE = "beside_profile.parquet"
#: the columns that make two profiles' rows the same request (the prompt's length too, within
#: ``PROMPT_SLACK`` tokens: each backend counts the same text with its own tokenizer)
SHAPE = ("request_id", "family", "expected_output_tokens", "shared_prefix_tokens",
         "concurrent_requests", "memory_pressure")
PROMPT_SLACK = 2
#: a latency ratio this close to 1 has no direction to agree on
FLAT = 0.02
#: the settings files a study folder (state) or an archive keeps its config in
SETTINGS = ("archive.json", "study_state.json")


def other_settings(other_dir: Path) -> dict:
    """The other study's config (the ``config`` of its archive or state file)."""
    for name in SETTINGS:
        path = Path(other_dir) / name
        if path.exists():
            cfg = json.loads(path.read_text()).get("config")
            if not isinstance(cfg, dict):
                raise InputFileError(path, None, "config", "missing: cannot tell which requests it measured")
            return cfg
    raise InputFileError(Path(other_dir), None, None,
                         f"no {' or '.join(SETTINGS)}: cannot tell which requests it measured")


def beside_spec(spec, other: dict, other_modes=None):
    """This study's profile spec on the other study's requests, in the modes both
    measure (``other_modes``: the other profile's; the ones it lacks could not be set
    beside anything) and at the arrival group sizes this study draws."""
    try:
        draw = ConditionDraw.from_dict(other.get("conditions") or {}).to_dict()
    except (TypeError, ValueError) as exc:
        raise InputFileError(None, None, "conditions", f"the other study's: {exc}") from None
    modes = spec.modes
    if other_modes is not None:
        theirs = sorted(map(str, other_modes))
        modes = theirs if modes is None else [m for m in modes if m in theirs]
    return dataclasses.replace(
        spec, workloads=list(other.get("families") or spec.workloads), modes=modes,
        requests=int(other.get("requests_per_family", spec.requests)), seed=int(other.get("seed", spec.seed)),
        conditions=draw, length_scale=float(other.get("length_scale", spec.length_scale)),
        max_concurrency=_largest_group(spec, draw))


def _largest_group(spec, other_draw: dict) -> int | None:
    """This study's largest arrival group, where the other study drew larger ones: those
    units are left out (each costs this backend as much as its whole group) and the rest
    keep the ids the other study gave them. None: every unit of the other study."""
    if spec.conditions is None:
        return None
    ours = max(ConditionDraw.from_dict(spec.conditions).concurrency)
    return ours if max(other_draw["concurrency"]) > ours else None


def same_requests(a: pd.DataFrame, b: pd.DataFrame) -> set[str]:
    """Request ids whose shape (length, prefix, concurrency, pressure) agrees in both profiles."""
    cols = [c for c in SHAPE if c in a and c in b]
    keep = cols + ["prompt_tokens"]
    ua = a.loc[a["request_id"].notna(), keep].drop_duplicates(cols)
    ub = b.loc[b["request_id"].notna(), keep].drop_duplicates(cols)
    j = ua.merge(ub, on=cols, suffixes=("_a", "_b"))
    close = (j["prompt_tokens_a"] - j["prompt_tokens_b"]).abs() <= PROMPT_SLACK
    return set(j.loc[close, "request_id"].astype(str))


def wants_beside_profile(cfg, other_dir) -> bool:
    """Whether ``other_dir`` is a study of the same model on another backend with a
    profile to measure this backend again on (an unreadable folder: no)."""
    other = _same_model_study(cfg, other_dir)
    return other is not None and other.get("backend") != cfg.backend


def same_backend_elsewhere(cfg, other_dir) -> bool:
    """Whether ``other_dir`` is a study of this model on this backend with a profile (the
    same design measured on another kind of machine, say): set beside as it is."""
    other = _same_model_study(cfg, other_dir)
    return other is not None and other.get("backend") == cfg.backend


def _same_model_study(cfg, other_dir) -> dict | None:
    """The settings of ``other_dir`` where it is a study of this model with a profile;
    None otherwise (an unreadable folder included)."""
    other_dir = Path(other_dir)
    if not (other_dir / "profile.parquet").exists():
        return None
    try:
        other = other_settings(other_dir)
    except (InputFileError, ValueError):
        return None
    return other if other.get("model") == cfg.model else None


def side_by_side(this: pd.DataFrame, other: pd.DataFrame, constraints) -> tuple[pd.DataFrame, int]:
    """Per mode both backends' latency ratio (median over requests), ROUGE-L and families
    passing, each against its own reference on the shared requests; and their number."""
    ids = same_requests(this, other)
    if not ids:
        return pd.DataFrame(), 0
    ta = mode_table(this[this["request_id"].astype(str).isin(ids)], constraints).set_index("mode")
    tb = mode_table(other[other["request_id"].astype(str).isin(ids)], constraints).set_index("mode")
    a, b = column_names(this, other)
    kinds_differ = _kinds(this) != _kinds(other)
    rows = []
    for mode in list(ta.index) + [m for m in tb.index if m not in ta.index]:
        ra = ta.loc[mode] if mode in ta.index else None
        rb = tb.loc[mode] if mode in tb.index else None
        rows.append({"mode": mode,
                     f"latency ratio ({a})": value_cell(ra, "latency_ratio"),
                     f"latency ratio ({b})": value_cell(rb, "latency_ratio"),
                     f"ROUGE-L ({a})": value_cell(ra, "rouge_l_mean"), f"ROUGE-L ({b})": value_cell(rb, "rouge_l_mean"),
                     f"families passing ({a})": passing_cell(ra), f"families passing ({b})": passing_cell(rb)})
        if kinds_differ:
            rows[-1]["direction agrees"] = _direction_agrees(value_cell(ra, "latency_ratio"),
                                                             value_cell(rb, "latency_ratio"))
    return pd.DataFrame(rows), len(ids)


def column_names(this: pd.DataFrame, other: pd.DataFrame) -> tuple[str, str]:
    """What the table calls each study: its backend, or, where both ran one backend (the
    same design on two kinds of machine), "here" and "other machine"."""
    a, b = _name(this), _name(other)
    return (a, b) if a != b else (f"{a}, here", f"{b}, other machine")


def _direction_agrees(ra: float, rb: float) -> str:
    """Whether a mode is faster (ratio below 1) or not on both machines: "yes", "no", or
    "-" where either ratio is missing or within 2 % of 1 (no direction to speak of)."""
    if not (np.isfinite(ra) and np.isfinite(rb)) or abs(ra - 1) < FLAT or abs(rb - 1) < FLAT:
        return "-"
    return "yes" if (ra < 1) == (rb < 1) else "no"


def side_by_side_section(this: pd.DataFrame, other_dir: Path, constraints, out: Path) -> list[str]:
    """The report's section (and ``side_by_side.csv``), or a line saying why there is none."""
    other_dir = Path(other_dir)
    head = ["## Beside another study, same requests", ""]
    if not (other_dir / "profile.parquet").exists():
        return head + [f"`{other_dir}` holds no `profile.parquet`.", ""]
    other = pd.read_parquet(other_dir / "profile.parquet")
    table, n = side_by_side(this, other, constraints)
    if not n:
        return head + [f"No request of `{other_dir}` has the same shape here; nothing to set beside.", ""]
    write_csv(table, out / "side_by_side.csv", overwrite=True)
    hw = [f"- {_name(p)}: " + "; ".join(_kinds(p)) + (f", measured {_when(p)}" if _when(p) else "")
          for p in (this, other) if "hardware" in p]
    differ = (["The two ran on different kinds of machine: a mode's direction may differ by kernels "
               "alone, so read the columns as two machines' answers, not one machine's; \"direction "
               f"agrees\" says whether the mode is faster (or slower) than its reference on both ("
               f"\"-\": a ratio within {FLAT:.0%} of 1)."]
              if _kinds(this) != _kinds(other) else [])
    return head + [
        f"Both studies on the same {n} requests (`{other_dir}`'s), each mode against its own study's "
        "reference: median latency ratio (below 1 is faster), mean ROUGE-L against that reference, "
        "families in which the study's rule accepts the mode (`side_by_side.csv`). The machines:", "",
        *hw, "", *differ, *([""] if differ else []), md_table(table.round(3)), ""]


def _name(profile: pd.DataFrame) -> str:
    if "backend" in profile and profile["backend"].notna().any():
        return "/".join(sorted(map(str, profile["backend"].dropna().unique())))
    return "?"


def _kinds(profile: pd.DataFrame) -> list[str]:
    return sorted(map(str, profile["hardware"].dropna().unique())) if "hardware" in profile else []


def _when(profile: pd.DataFrame) -> str:
    if "measured_at" not in profile or not profile["measured_at"].notna().any():
        return ""
    days = pd.to_datetime(profile["measured_at"].dropna(), utc=True, format="ISO8601").dt.date
    return f"{days.min()}" if days.min() == days.max() else f"{days.min()} to {days.max()}"
