"""Pure data for the framework: requests, workloads, features and the profile schema.

This room imports no other room of the project (engine, oracle, routers), so every
other room can depend on it without cycles.
"""

from modeswitch.dataset.features import (
    FEATURE_SET_A,
    FEATURE_SET_B,
    features_frame,
    request_features,
)
from modeswitch.dataset.requests import Request, read_requests

__all__ = [
    "FEATURE_SET_A",
    "FEATURE_SET_B",
    "Request",
    "features_frame",
    "read_requests",
    "request_features",
]
