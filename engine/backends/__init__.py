"""Backends run registered modes; each declares how it implements a mode or why it cannot."""

from modeswitch.engine.backends.base import BackendCapabilities, ModeSupport

__all__ = ["BackendCapabilities", "ModeSupport"]
