"""What the measurements ran on, in one line: the CPU model, its cores and its caches.

Every profile row carries it (``hardware``), because latency on a CPU depends on
whether the model's weights fit in the last-level cache: the stdlib test model's
17 MB do in a 32 MB L3, the real model's 540 MB do not, and a table measured on one
cache size says little about another. Cache sizes come from Linux's sysfs (the
same numbers ``lscpu`` prints); elsewhere the line has the model and core count only.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

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


def hardware_string(device: str) -> str:
    """``AMD EPYC (2 cores; L1d 48K, L1i 32K, L2 1024K, L3 32768K)`` on a CPU, the GPU's
    name on ``cuda``."""
    if device.startswith("cuda"):
        import torch  # only on a GPU run: the CPU line needs no torch

        return torch.cuda.get_device_name(0)
    caches = cpu_caches()
    detail = f"{os.cpu_count()} cores" + (f"; {', '.join(caches)}" if caches else "")
    return f"{cpu_model()} ({detail})"
