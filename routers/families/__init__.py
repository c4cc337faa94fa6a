"""Learned router families, one module each (estimator + search space + registration).

:mod:`routers.families.base` holds what they share (:class:`LearnedRouter`); every
other module here is imported by the router registry on first lookup.
"""
