"""Workload registry: request populations registered by name.

Adding a workload is one small file in this package that calls
:func:`register_workload`; every module here is imported on first use, as
lm-evaluation-harness discovers its tasks.
"""

from __future__ import annotations

from modeswitch.dataset.registry import Registry, discover_package
from modeswitch.dataset.workloads.spec import CONDITIONS, WorkloadSpec

WORKLOADS: Registry[WorkloadSpec] = Registry("workload", discover_package(__name__, skip=("spec", "conditions")))


def register_workload(spec: WorkloadSpec) -> WorkloadSpec:
    return WORKLOADS.register(spec.name, spec)


def get_workload(name: str) -> WorkloadSpec:
    return WORKLOADS.get(name)


def list_workloads() -> list[WorkloadSpec]:
    return WORKLOADS.values()


__all__ = ["CONDITIONS", "WORKLOADS", "WorkloadSpec", "get_workload", "list_workloads", "register_workload"]
