"""The CPU study end to end (``modeswitch study run``, ``make study``): config, steps, report."""

from modeswitch.study.config import StudyConfig
from modeswitch.study.runner import Study

__all__ = ["Study", "StudyConfig"]
