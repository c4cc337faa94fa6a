"""Serving: a router in front, one engine per mode behind, behind an OpenAI-compatible API.

``engine`` never imports ``routers``: the server takes any object with
``route(request) -> mode`` (and optionally ``modes``), so the rule baseline, a
compiled learned router and an exported MLflow model all plug in the same way.
"""

from engine.serving.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
