"""The requests a study labels from estimates, and those its quality sweep measures.

Why apart from the steps: the quality step sweeps some of them and the dataset step
labels all of them, so both must draw the same ones; each is a function of the
study's settings alone (the same settings draw the same requests on every run).
"""

from __future__ import annotations

import dataclasses

from modeswitch.dataset.workloads import get_workload
from modeswitch.dataset.workloads.conditions import draw_units, scaled
from modeswitch.study.config import StudyConfig


def drawn_requests(cfg: StudyConfig) -> list:
    """The requests labelled from estimates: the profile's families at the same scale
    and condition draw, ids namespaced apart from the profiled ones."""
    if cfg.drawn_requests <= 0:
        return []
    per = max(1, cfg.drawn_requests // len(cfg.families))
    draw = cfg.condition_draw()
    out = []
    for i, name in enumerate(cfg.families):
        w = scaled(get_workload(name), cfg.length_scale)
        for du in draw_units(w, per, draw, seed=10_000 + cfg.seed * 100 + i, with_companions=False):
            out.append(dataclasses.replace(du.request, id=f"draw-{du.request.id}"))
    return out


def swept_requests(cfg: StudyConfig) -> list:
    """The drawn requests the quality step measures: each family's first
    ``swept_per_family`` of its random draw."""
    per: dict[str, list] = {}
    for r in drawn_requests(cfg):
        if len(per.setdefault(r.family, [])) < cfg.swept_per_family:
            per[r.family].append(r)
    return [r for rs in per.values() for r in rs]
