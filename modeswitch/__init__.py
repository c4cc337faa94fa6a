"""ModeSwitch: learned routers over LLM inference modes. The CLI lives in ``modeswitch.cli``."""

__version__ = "0.1.0"
