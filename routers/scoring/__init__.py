"""Scoring routers against the rule baseline and the oracle: decision overhead, violations,
speed-up, energy and quality, offline on a held-out table and live through the engines
(``run.py`` drives a scoring run; ``report.py`` writes its report)."""
