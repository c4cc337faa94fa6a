"""Range checks for the numbers a user sets (options, TOML values), run before any work.

Why: a value outside its range, taken as it is, fails later, with a traceback, after
minutes of work (``length_scale = inf`` in the profile step), or never fails and
quietly does harm (a server with a negative memory budget refuses every request). These checks say which value and why
in one line: not finite, not positive, or more than this machine can hold.
"""

from __future__ import annotations

import math
import sys

from modeswitch.dataset.errors import InputError

#: memory one drawn request takes while a population is built (tracemalloc over 2,000
#: requests of a registered workload: 3.2 KB each); a population that cannot fit in
#: this machine's memory at that rate is refused before it is drawn
REQUEST_BYTES = 3 * 1024


def finite(name: str, value, *, positive: bool = False, minimum: float | None = None,
           below: float | None = None) -> None:
    """``value`` is a finite real number (> 0 with ``positive``, >= ``minimum``, < ``below``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{name} = {value!r}: must be a finite number")
    if positive and value <= 0:
        raise InputError(f"{name} = {value!r}: must be greater than 0")
    if minimum is not None and value < minimum:
        raise InputError(f"{name} = {value!r}: must be at least {minimum}")
    if below is not None and value >= below:
        raise InputError(f"{name} = {value!r}: must be below {below}")


def count(name: str, value, minimum: int = 1) -> None:
    """``value`` is a whole number from ``minimum`` up to what this machine can index."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name} = {value!r}: must be a whole number")
    if value < minimum:
        raise InputError(f"{name} = {value}: must be at least {minimum}")
    if value > sys.maxsize:
        raise InputError(f"{name} = {value:,}: larger than this machine can count ({sys.maxsize:,})")


def requests_fit(name: str, requests: int) -> None:
    """A population of ``requests`` requests fits in this machine's memory."""
    import psutil  # only when a population's size is checked

    total = psutil.virtual_memory().total
    if requests * REQUEST_BYTES > total:
        raise InputError(f"{name}: {requests:,} requests would take {requests * REQUEST_BYTES / 2**30:,.0f} GiB "
                         f"to draw; this machine has {total / 2**30:,.0f} GiB")
