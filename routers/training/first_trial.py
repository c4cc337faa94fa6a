"""The first trial of every Optuna study: the router family's own defaults.

Why: a study of a few trials is all TPE's random start-up draws (ten by default), and
none of them need be as good as the defaults the family was written with. Enqueued
first, the defaults are always among the candidates, so the study's best is at
least as good as they are on the tuning objective (Optuna's ``Study.enqueue_trial``,
meant for this)."""

from __future__ import annotations

import inspect

from modeswitch.routers.registry import get_family

#: the tuner's own parameters' defaults (not the estimator's): the plain, unweighted fit
TUNER_DEFAULTS = {"regret_weights": False}


def default_trial(family: str) -> dict:
    """Optuna parameters for the family's defaults: each parameter of its search space
    that the estimator's ``__init__`` gives a default lying inside that parameter's
    range (the others are left to the sampler), plus :data:`TUNER_DEFAULTS`."""
    import optuna  # heavy: only when tuning
    from optuna.distributions import CategoricalDistribution  # with optuna: only when tuning

    factory = get_family(family).factory
    # the space's distributions, as one throw-away in-memory trial defines them
    trial = optuna.create_study().ask()
    factory.search_space(trial)
    defaults = {n: p.default for n, p in inspect.signature(factory).parameters.items()
                if p.default is not inspect.Parameter.empty}
    out = {}
    for name, dist in trial.distributions.items():
        if name not in defaults:
            continue
        v = defaults[name]
        if isinstance(dist, CategoricalDistribution):
            inside = v in dist.choices
        else:
            step = getattr(dist, "step", None)
            inside = (isinstance(v, (int, float)) and not isinstance(v, bool) and dist.low <= v <= dist.high
                      and (not step or abs((v - dist.low) / step - round((v - dist.low) / step)) < 1e-9))
        if inside:
            out[name] = v
    return {**out, **TUNER_DEFAULTS}
