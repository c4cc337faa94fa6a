"""The experimental boundary's warning: :class:`ExperimentalWarning`, and the decorators
that emit it once when a research add-on is first used (as Optuna's
``@experimental_class`` / ``@experimental_func`` do).

Why once per feature, not per call: a research class is instantiated many times in a
run (every ``clone`` in a tuning loop), and a warning a user has read once says nothing
new the second time. The standard library only: the research modules import these
decorators, so this module must cost nothing and import nothing of the project.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["ExperimentalWarning", "experimental_class", "experimental_func", "run_by_default",
           "warn_experimental"]


class ExperimentalWarning(UserWarning):
    """A research add-on of ModeSwitch was used: its interface and results may change
    between releases without notice. Silence it with
    ``warnings.filterwarnings("ignore", category=ExperimentalWarning)``, or from the shell
    with ``PYTHONWARNINGS="ignore:experimental add-on"``."""


#: features already warned about in this process
_warned: set[str] = set()
_lock = threading.Lock()
#: True while a core command runs a research step it runs by default (no opt-in to warn of)
_by_default: ContextVar[bool] = ContextVar("modeswitch_experimental_by_default", default=False)


def warn_experimental(feature: str, stacklevel: int = 2) -> bool:
    """Emit one :class:`ExperimentalWarning` naming ``feature``, the first time it is used
    in this process; True when it was emitted."""
    if _by_default.get():
        return False
    with _lock:
        if feature in _warned:
            return False
        _warned.add(feature)
    # the fixed start lets ``-W "ignore:experimental add-on"`` match every one of them
    warnings.warn(f"experimental add-on {feature} (modeswitch.experimental): its interface and "
                  "results may change without notice", ExperimentalWarning, stacklevel=stacklevel + 1)
    return True


@contextmanager
def run_by_default() -> Iterator[None]:
    """Around a research step that a core command runs unless told not to (``score``'s
    frontier and adaptive replay): the user opted into nothing, so nothing warns."""
    token = _by_default.set(True)
    try:
        yield
    finally:
        _by_default.reset(token)


def experimental_func(fn: Callable) -> Callable:
    """Mark a function experimental: its first call warns."""
    feature = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warn_experimental(feature)
        return fn(*args, **kwargs)

    return wrapper


def experimental_class(cls: type) -> type:
    """Mark a class experimental: its first instantiation warns. The class is kept (its
    ``__init__`` wrapped in place), so ``isinstance``, pickling and scikit-learn's
    ``get_params`` (which reads the signature through ``__wrapped__``) are unchanged."""
    feature = f"{cls.__module__}.{cls.__qualname__}"
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        warn_experimental(feature)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls
