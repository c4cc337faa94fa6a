"""Workload registry: request populations registered by name.

Adding a workload is one small file in this package that calls
:func:`register_workload`; every module here is imported on first use, as
lm-evaluation-harness discovers its tasks.
"""

from __future__ import annotations

import importlib
import pkgutil

from dataset.workloads.spec import CONDITIONS, WorkloadSpec

_REGISTRY: dict[str, WorkloadSpec] = {}
_loaded = False


def register_workload(spec: WorkloadSpec) -> WorkloadSpec:
    if spec.name in _REGISTRY and _REGISTRY[spec.name] != spec:
        raise ValueError(f"workload {spec.name!r} is registered twice with different settings")
    _REGISTRY[spec.name] = spec
    return spec


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if info.name not in ("spec",):
            importlib.import_module(f"{__name__}.{info.name}")


def get_workload(name: str) -> WorkloadSpec:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown workload {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        ) from None


def list_workloads() -> list[WorkloadSpec]:
    _load_all()
    return list(_REGISTRY.values())


__all__ = ["CONDITIONS", "WorkloadSpec", "get_workload", "list_workloads", "register_workload"]
