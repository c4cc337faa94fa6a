"""The first trials of every Optuna study: the router family's own defaults, and the
best of the study its search space replaced.

Why: a study of a few trials is all TPE's random start-up draws (ten by default), and
none of them need be as good as the defaults the family was written with. Enqueued
first, the defaults are always among the candidates, so the study's best is at
least as good as they are on the tuning objective (Optuna's ``Study.enqueue_trial``,
meant for this). Likewise when a family's search space grows (its
``search_space_version``): the new study starts anew, and twenty trials over one more
dimension need not find the old best again (the per-request study's group cost
LightGBM, its space grown by ``limit_gate``, ended at 0.535 against the old study's
0.494), so the old best, with the new parameters at their defaults, is its second
trial (:func:`carried_trial`)."""

from __future__ import annotations

import inspect

from modeswitch.routers.registry import get_family

#: the tuner's own parameters' defaults (not the estimator's): the plain, unweighted fit
TUNER_DEFAULTS = {"regret_weights": False}


def _space(family: str) -> dict:
    """The family's search space as Optuna distributions (one throw-away in-memory trial)."""
    import optuna  # heavy: only when tuning

    trial = optuna.create_study().ask()
    get_family(family).factory.search_space(trial)
    return trial.distributions


def carried_trial(family: str, best_params: dict) -> dict:
    """An earlier study's best parameters, as a trial of the family's space now: each that
    still lies in it, the new ones at :func:`default_trial`'s values (the sampler draws
    any without a default), the tuner's own (``regret_weights``) as they were."""
    space = _space(family)
    out = {k: v for k, v in default_trial(family).items() if k in space}
    for name, value in best_params.items():
        dist = space.get(name)
        if dist is not None and _inside(dist, value):
            out[name] = value
    for name in TUNER_DEFAULTS:
        out[name] = best_params.get(name, TUNER_DEFAULTS[name])
    return out


def _inside(dist, value) -> bool:
    """Whether ``value`` is one a distribution of the space can draw."""
    from optuna.distributions import CategoricalDistribution  # with optuna: only when tuning

    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    step = getattr(dist, "step", None)
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and dist.low <= value <= dist.high
            and (not step or abs((value - dist.low) / step - round((value - dist.low) / step)) < 1e-9))


def default_trial(family: str) -> dict:
    """Optuna parameters for the family's defaults: each parameter of its search space
    that the estimator's ``__init__`` gives a default lying inside that parameter's
    range (the others are left to the sampler), plus :data:`TUNER_DEFAULTS`."""
    factory = get_family(family).factory
    defaults = {n: p.default for n, p in inspect.signature(factory).parameters.items()
                if p.default is not inspect.Parameter.empty}
    out = {name: defaults[name] for name, dist in _space(family).items()
           if name in defaults and _inside(dist, defaults[name])}
    return {**out, **TUNER_DEFAULTS}
