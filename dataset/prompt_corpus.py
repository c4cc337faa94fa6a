"""Real text for synthetic requests: the benchmark prompt samples.

A workload family is a request *shape* (prompt and output lengths, shared prefix,
concurrency, memory pressure). Its prompts carry real text from the benchmark JSONL
files (``../shared/reference/benchmarks/`` beside a clone, or ``$MODESWITCH_PROMPTS``):
AlpacaEval and MT-Bench instructions, GSM8K, MMLU-Pro, TruthfulQA and GPQA questions.
Which suites end a family's prompts, and which fill its long context or shared
prefix, is declared on the family (:class:`modeswitch.dataset.workloads.spec.WorkloadSpec`'s
``questions`` and ``context``); the engine's prompt builder meets the lengths in
tokens (``engine/prompts.py``).

Context is made of *worked examples*: earlier questions of a suite with their gold
answers, as a few-shot prompt holds them. That is how long prompts and shared
prefixes arise in real serving (a few-shot or document prefix reused across
requests), and it keeps every token real text.

One question in :data:`DRAFT_SPLIT` (about 1 in 8, chosen by a hash of its id) is
held out of all of that: those questions are the speculative draft's distillation
prompts (:mod:`modeswitch.engine.models.draft`), so no profile, study or evaluation measures the
draft on text it was trained on. :func:`load_corpus` keeps them apart in
``PromptCorpus.draft_split``; ``pick`` never returns them.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from modeswitch.dataset.benchmarks import read_benchmark
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request

PROMPTS_ENV = "MODESWITCH_PROMPTS"
#: beside a clone of the project: ../shared/reference/benchmarks
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference" / "benchmarks"


#: one question in this many goes to the draft's distillation split
DRAFT_SPLIT = 8


def in_draft_split(question_id: str) -> bool:
    """Whether a question is one of the draft's distillation prompts (a fixed hash of its id,
    so the split is the same on every machine and does not move when files grow)."""
    return int(hashlib.sha256(f"draft-split:{question_id}".encode()).hexdigest()[:8], 16) % DRAFT_SPLIT == 0


def prompts_dir() -> Path:
    """``$MODESWITCH_PROMPTS``, else the benchmarks folder beside the clone."""
    env = os.environ.get(PROMPTS_ENV)
    path = Path(env) if env else DEFAULT_DIR
    if not path.is_dir() or not any(path.glob("*.jsonl")):
        raise InputError(f"no benchmark prompt files (*.jsonl) in {path}: synthetic requests take their text "
                         f"from them; point ${PROMPTS_ENV} at a folder of benchmark JSONL files")
    return path


@dataclass(frozen=True)
class PromptCorpus:
    """Every benchmark question by suite (as Requests: text, gold answer, scoring mode)."""

    folder: Path
    suites: dict[str, tuple[Request, ...]]
    #: the draft's distillation prompts by suite, held out of ``suites``
    draft_split: dict[str, tuple[Request, ...]] = field(default_factory=dict)

    def pick(self, suites: tuple[str, ...]) -> tuple[Request, ...]:
        """The questions of ``suites`` (every suite when empty), in a fixed order; a suite
        this corpus lacks is an error naming what it has."""
        names = suites or tuple(sorted(self.suites))
        missing = [s for s in names if s not in self.suites]
        if missing:
            raise InputError(f"benchmark suite(s) {', '.join(missing)} not in {self.folder} "
                             f"(it has {', '.join(sorted(self.suites))})")
        return tuple(q for s in names for q in self.suites[s])

    def draft_questions(self, salt: str, want: int, take=None) -> list[tuple[Request, object]]:
        """Up to ``want`` questions of the draft split, suites taken in turn (by name),
        each suite in a fixed order hashed from ``salt`` and the question's id, as
        (question, what ``take`` made of it). ``take(q)`` returns None to skip ``q``
        (the same suite's next question is tried); without it every question is kept.
        The draft's distillation prompts and vLLM checkpoints' calibration set are
        drawn so, each with its own salt."""
        take = take or (lambda q: q)
        queues = [sorted(qs, key=lambda q: hashlib.sha256(f"{salt}:{q.id}".encode()).hexdigest())
                  for _, qs in sorted(self.draft_split.items())]
        out: list[tuple[Request, object]] = []
        while len(out) < want and any(queues):
            for queue in queues:
                while queue and len(out) < want:
                    q = queue.pop(0)
                    made = take(q)
                    if made is not None:
                        out.append((q, made))
                        break
        return out


@lru_cache(maxsize=4)
def load_corpus(folder: Path | None = None) -> PromptCorpus:
    folder = Path(folder) if folder else prompts_dir()
    suites: dict[str, list[Request]] = {}
    held: dict[str, list[Request]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for q in read_benchmark(path):
            (held if in_draft_split(q.id) else suites).setdefault(q.benchmark_suite, []).append(q)

    def ordered(by_suite):
        return {k: tuple(sorted(v, key=lambda q: q.id)) for k, v in by_suite.items()}

    return PromptCorpus(folder, ordered(suites), ordered(held))


def worked_example(q: Request) -> str:
    """A question with its gold answer, as a few-shot prompt shows it (the answer letter
    for multiple choice, the number for GSM8K; questions without one stand alone)."""
    answer = (q.reference or "").partition("|")[0]
    return f"{q.prompt.strip()}\nAnswer: {answer}\n\n" if answer else f"{q.prompt.strip()}\n\n"
