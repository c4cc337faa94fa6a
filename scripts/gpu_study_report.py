"""The GPU study's one report (`scripts/gpu_study.sh`'s last step), from its profiles.

    python scripts/gpu_study_report.py OUT_DIR PROFILE [PROFILE ...]

Writes ``OUT_DIR/README.md``: the GPU the script found, each step it ran with its
seconds and exit status, every profiled mode against the reference (the study's mode
table), each mode's measured medians, the modes the profile lacks with the vLLM
backend's reason, and links to the study's own report and the served router's answers.
The machine, steps and answers are read from files the script leaves in ``OUT_DIR``
(``gpu.txt``, ``steps.tsv``, ``answers.txt``, ``study/README.md``) where they exist, so
the report can also be made from a profile recorded elsewhere, without a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from modeswitch.dataset.profile_schema import read_profiles
from modeswitch.engine.backends.vllm_backend import capabilities
from modeswitch.engine.modes import list_modes
from modeswitch.oracle.mode_table import format_mode_table, mode_table
from modeswitch.study.markdown import md_table
from modeswitch.study.modes_section import model_lines

#: per-trial figures shown per mode (medians over the mode's measured trials)
FIGURES = ["latency_ms", "ttft_ms", "tokens_per_s", "energy_per_token_j", "peak_memory_mb"]


def measured_medians(profile: pd.DataFrame) -> pd.DataFrame:
    """Per mode: trials, and the median of each figure over its uncontended per-trial rows."""
    rows = profile[~profile["is_aggregate"].astype(bool)]
    if "contended" in rows:
        rows = rows[rows["contended"].fillna(False).astype(bool) == False]  # noqa: E712
    cols = [c for c in FIGURES if c in rows and rows[c].notna().any()]
    out = rows.groupby("mode")[cols].median()
    out.insert(0, "trials", rows.groupby("mode").size())
    return out.reset_index()


def missing_modes(profile: pd.DataFrame) -> pd.DataFrame:
    """Registered modes the profile lacks, with the vLLM backend's reason on CUDA without a
    draft or checkpoints where it refuses them then, else "supported, not in this profile"."""
    caps = capabilities("cuda", {}, draft=False)
    have = set(profile["mode"])
    rows = [{"mode": m.name, "why": caps.modes[m.name].reason if not caps.modes[m.name].supported
             else "supported, not in this profile"} for m in list_modes() if m.name not in have]
    return pd.DataFrame(rows, columns=["mode", "why"])


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def report(out: Path, profiles: list[Path]) -> Path:
    profile = read_profiles(profiles)
    md = ["# GPU study", "", f"Profiles: {', '.join(f'`{p}`' for p in profiles)} "
          f"({len(profile)} rows, {profile['mode'].nunique()} modes, {profile['family'].nunique()} families).", ""]
    gpu = _read(out / "gpu.txt")
    md += ["## GPU", "", "```", gpu, "```", ""] if gpu else \
        ["## GPU", "", "Not recorded here: this report was made from a recorded profile.", ""]
    steps = out / "steps.tsv"
    if steps.exists():
        md += ["## Steps", "", md_table(pd.read_csv(steps, sep="\t")), ""]
    md += ["## Modes on this model", "", *model_lines(profile, None, None)]
    if "energy_source" in profile:
        md += ["- energy source: " + ", ".join(sorted(map(str, profile["energy_source"].dropna().unique())))]
    md += ["", "Every mode against the reference over the profiled requests (the study's mode table: median "
           "latency ratio, below 1 is faster; ROUGE-L of its output against the reference's; 95 % "
           "bootstrap intervals over requests):", "", md_table(format_mode_table(mode_table(profile))), "",
           "Medians of each mode's measured trials (contended trials left out):", "",
           md_table(measured_medians(profile)), ""]
    missing = missing_modes(profile)
    if not missing.empty:
        md += ["## Modes not profiled", "", md_table(missing), ""]
    study = out / "study" / "README.md"
    md += ["## Routers", "", f"The study's report: `{study}`." if study.exists()
           else "No study report here (the study step did not run or did not finish).", ""]
    answers = _read(out / "answers.txt")
    md += ["## The served router", "", "```", answers, "```", ""] if answers else \
        ["## The served router", "", "No answers recorded (the serve step did not run or did not finish).", ""]
    path = out / "README.md"
    path.write_text("\n".join(md))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the study's output folder (README.md is written there)")
    ap.add_argument("profiles", type=Path, nargs="+", help="profile files (.parquet or .csv)")
    args = ap.parse_args(argv)
    for p in args.profiles:
        if not p.is_file():
            print(f"gpu_study_report: no profile at {p}", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"report: {report(args.out, args.profiles)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
