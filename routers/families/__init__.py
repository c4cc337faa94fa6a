"""Learned router families, one module each (estimator + search space + registration).

What they share: :mod:`~modeswitch.routers.families.base` (:class:`LearnedRouter`: the shared
keyword-only parameters and machinery), :mod:`~modeswitch.routers.families.classifier` (mode
classifiers: ``dt``, ``rf``, ``lr``, ``lgbm``), :mod:`~modeswitch.routers.families.cost`
(cost-predicting routers: ``cost_linear``, ``cost_lgbm``),
:mod:`~modeswitch.routers.families.lightgbm_params` (LightGBM's parameters, for both kinds) and
:mod:`~modeswitch.routers.families.readers` (fitted models read as plain data for the compiler).
Every module here is imported by the router registry on first lookup; a certified
threshold wraps any of them (:class:`modeswitch.routers.certified.CertifiedRouter`).
"""
