"""Engines: inference modes, backends that run them, the profiler, energy meters, serving.

Importing this package is cheap: torch, transformers and vLLM load only inside the
backend that needs them. ``engine`` imports ``dataset`` and no other room; serving
takes any object with the router API, so it never imports ``routers``.
"""
