"""Serving: a router in front, one engine per mode behind, behind an OpenAI-compatible API.

``engine`` never imports ``routers``: the server asks a router only for
``route(request) -> mode``, so the rule baseline, a compiled learned router and an
exported MLflow model all plug in the same way. A loader that wants ``/health`` to
say how its router decides returns it wrapped in :class:`LoadedRouter`.
"""

from modeswitch.engine.serving.app import create_app
from modeswitch.engine.serving.config import ServerConfig, supported_modes
from modeswitch.engine.serving.state import LoadedRouter, ServerState

__all__ = ["LoadedRouter", "ServerConfig", "ServerState", "create_app", "supported_modes"]
