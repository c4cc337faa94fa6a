"""Compiled routers: a fitted learned router as flat arrays in a small C kernel (or, for
a single decision tree, generated Python). See :mod:`routers.compiler.compiled`."""

from routers.compiler.compiled import CompiledRouter, compile

__all__ = ["CompiledRouter", "compile"]
