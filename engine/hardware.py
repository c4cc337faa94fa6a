"""What the measurements ran on, in one line: the CPU model, its cores, its caches and
its vector instruction sets.

Every profile row carries it (``hardware``), because latency on a CPU depends on
whether the model's weights fit in the last-level cache: the stdlib test model's
17 MB do in a 32 MB L3, the real model's 540 MB do not, and a table measured on one
cache size says little about another. Cache sizes come from Linux's sysfs (the
same numbers ``lscpu`` prints); elsewhere the line has the model and core count only.

The instruction sets (:data:`ISA_FLAGS`, from ``/proc/cpuinfo``) because the outputs
depend on them, not only the times: PyTorch's CPU kernels pick their code by what
the CPU offers, and two kernels sum in different orders, so a greedy answer near a
tie between two tokens changes. Two machines both named "AMD EPYC", with other L2
caches and instruction sets, gave the same SmolLM2 request different reference
answers and an INT8 mode a ROUGE-L of 1.0 on one and far below the limit on the other
(docs/results.md). So a quality label measured
on one holds on the other only as far as :func:`same_kind` says.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pandas as pd

CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")


def cpu_model() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return model


def cpu_caches(root: Path = CACHE_ROOT) -> list[str]:
    """``["L1d 48K", "L1i 32K", "L2 1024K", "L3 32768K"]``: cpu0's caches as sysfs
    lists them (per instance; an L3 is usually shared by every core); [] when unknown."""
    out = []
    for index in sorted(root.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out.append(f"L{level}{suffix} {size}")
    return out


#: the vector instruction sets a hardware line names where the CPU has them (x86's
#: AVX2 to AMX, Arm's NEON and SVE): the ones PyTorch's CPU kernels choose by
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "sve", "sve2")


def native_bf16(isa: list[str] | None = None) -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere PyTorch
    emulates it, slower than fp32. ``isa``: :func:`cpu_isa`'s list, read when None."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_isa() if isa is None else isa))


def cpu_isa(cpuinfo: str | None = None) -> list[str]:
    """The :data:`ISA_FLAGS` this CPU has, in that order (``cpuinfo``: the text of
    ``/proc/cpuinfo``, read when None); [] where unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags = set()
    for line in cpuinfo.splitlines():
        key = line.split(":", 1)[0].strip()
        if key in ("flags", "Features"):  # x86, Arm
            flags.update(line.split(":", 1)[1].split())
            break
    return [f for f in ISA_FLAGS if f in flags]


def same_kind(a: str, b: str) -> bool:
    """Whether two hardware lines name the same kind of machine: the same model, cores
    and caches, and the same instruction sets where both name them (a line written
    before they were recorded names none, and is matched on the rest)."""
    def parts(line: str) -> tuple[list[str], str | None]:
        head, _, detail = str(line).partition(" (")
        rest = [p.strip() for p in detail.rstrip(")").split(";") if p.strip()]
        isa = [p for p in rest if p.startswith("isa ")]
        return [head.strip()] + [p for p in rest if not p.startswith("isa ")], (isa[0] if isa else None)

    (ra, ia), (rb, ib) = parts(a), parts(b)
    return ra == rb and (ia is None or ib is None or ia == ib)


def recorded_hardware(profile) -> list[str]:
    """The hardware lines a profile file records (its ``hardware`` column; a quality
    sweep's names every machine a pair ran on, joined by `` | ``); [] where the file
    cannot be read or predates the column (the profile's reader names such faults where
    a step reads it)."""
    try:
        col = pd.read_parquet(profile, columns=["hardware"])["hardware"]
    except (ValueError, KeyError, OSError):
        return []
    return sorted({line for value in col.dropna().astype(str).unique() for line in value.split(" | ")})


def other_kinds(here: str, lines) -> list[str]:
    """The lines among ``lines`` that name another kind of machine than ``here``."""
    return [h for h in lines if not same_kind(here, h)]


def hardware_string(device: str) -> str:
    """``AMD EPYC (2 cores; L1d 48K, L1i 32K, L2 1024K, L3 32768K; isa avx2, avx512f)`` on a
    CPU, the GPU's name on ``cuda``."""
    if device.startswith("cuda"):
        import torch  # only on a GPU run: the CPU line needs no torch

        return torch.cuda.get_device_name(0)
    caches, isa = cpu_caches(), cpu_isa()
    detail = f"{os.cpu_count()} cores" + (f"; {', '.join(caches)}" if caches else "")
    detail += f"; isa {', '.join(isa)}" if isa else ""
    return f"{cpu_model()} ({detail})"
