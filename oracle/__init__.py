"""The oracle: label each request with the fastest mode that meets the constraints.

It reads measured profiles (dataset's schema), checks mode names against the
engine's registry, and never falls back to the reference silently: a unit
without reference rows, a missing metric or an unknown mode is an error unless
the caller asks to skip incomplete data.
"""

from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.external_table import read_cost_table
from modeswitch.oracle.label import OracleError, label_profile, label_requests
from modeswitch.oracle.training_table import build_training_table

__all__ = ["Constraints", "OracleError", "build_training_table", "label_profile", "label_requests",
           "read_cost_table"]
