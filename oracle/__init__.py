"""The oracle: label each request with the fastest mode that meets the constraints.

It reads measured profiles (dataset's schema), checks mode names against the
engine's registry, and never falls back to the reference silently: a unit
without reference rows, a missing metric or an unknown mode is an error unless
the caller asks to skip incomplete data.
"""

from oracle.constraints import Constraints
from oracle.label import OracleError, label_profile, label_requests

__all__ = ["Constraints", "OracleError", "label_profile", "label_requests"]
