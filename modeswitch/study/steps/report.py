"""``report``: the study's README (the opening table across splits, findings, each
step's time) and its MLflow run, from every other step's outputs
(:mod:`modeswitch.study.report`)."""

from __future__ import annotations

from modeswitch.study.report import write_study_report


def run(study) -> dict:
    return write_study_report(study)
