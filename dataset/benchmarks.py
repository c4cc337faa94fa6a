"""Benchmark prompts from JSONL files, and how their answers are scored.

Format (as in the study's samples): one JSON object per line with ``id``,
``prompt``, ``benchmark_suite``, ``evaluation_mode`` and, where auto-scored,
``reference`` (+ ``valid_labels`` for multiple choice). Scoring:

* ``multiple_choice_accuracy``: the first standalone option letter in the output
  (one of ``valid_labels``) must equal the reference letter;
* ``final_answer_exact_match``: the last number in the output must equal the
  reference number;
* ``external_judge``: not scored here (None).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from modeswitch.dataset.errors import InputFileError
from modeswitch.dataset.requests import Request

#: Output budget per evaluation mode (max_new_tokens).
OUTPUT_TOKENS = {"multiple_choice_accuracy": 8, "final_answer_exact_match": 96, "external_judge": 128}
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def read_benchmark(path, n: int | None = None, seed: int = 0, skip=None) -> list[Request]:
    """Up to ``n`` prompts (a seeded sample) as Requests; prompt_tokens is a rough
    count until an engine tokenises the prompt. ``skip(id)``: rows left out before the
    sample is drawn (the draft's distillation prompts, for an evaluation)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"benchmark file {path} does not exist")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputFileError(path, i, None, f"not valid JSON ({exc.msg})") from None
            for key in ("id", "prompt", "benchmark_suite", "evaluation_mode"):
                if not rec.get(key):
                    raise InputFileError(path, i, key, "required field is missing or empty")
            if rec["evaluation_mode"] not in OUTPUT_TOKENS:
                raise InputFileError(path, i, "evaluation_mode",
                                     f"unknown evaluation mode {rec['evaluation_mode']!r}")
            if skip is None or not skip(str(rec["id"])):
                rows.append(rec)
    if n is not None and n < len(rows):
        rows = random.Random(seed).sample(rows, n)
    out = []
    for rec in rows:
        suite = str(rec["benchmark_suite"])
        labels = rec.get("valid_labels")
        ref = rec.get("reference")
        out.append(Request(
            id=str(rec["id"]), prompt=rec["prompt"], prompt_tokens=max(1, len(rec["prompt"]) // 4),
            expected_output_tokens=OUTPUT_TOKENS[rec["evaluation_mode"]], family=suite,
            workload=suite, benchmark_suite=suite, evaluation_mode=rec["evaluation_mode"],
            reference=None if ref is None else (f"{ref}|{','.join(labels)}" if labels else str(ref)),
        ))
    return out


def score_answer(output: str, reference: str | None, evaluation_mode: str | None) -> float | None:
    """1.0 / 0.0 for auto-scored benchmarks, None when not scorable here."""
    if reference is None or evaluation_mode not in ("multiple_choice_accuracy", "final_answer_exact_match"):
        return None
    if evaluation_mode == "multiple_choice_accuracy":
        letter, _, labels = reference.partition("|")
        valid = labels.split(",") if labels else list("ABCDEFGHIJ")
        pattern = r"\b(" + "|".join(re.escape(v) for v in valid) + r")\b"
        m = re.search(pattern, output)
        return float(bool(m) and m.group(1) == letter)
    nums = _NUM.findall(output)
    if not nums:
        return 0.0
    try:
        return float(abs(float(nums[-1].replace(",", "")) - float(reference.replace(",", ""))) < 1e-6)
    except ValueError:
        return 0.0
