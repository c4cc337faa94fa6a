"""What the oracle's commands (``label``, ``dataset build``) share: constraint thresholds
and the cost model choice.

One rule for thresholds: a flag overrides the TOML file, which overrides the study's
defaults (:class:`modeswitch.oracle.Constraints`); the help shows those defaults from the
dataclass itself (``deferred_help(CONSTRAINTS)``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from modeswitch.cli.common import reading
from modeswitch.dataset.errors import InputError
from modeswitch.display import console
from modeswitch.oracle import Constraints
from modeswitch.oracle.costmodel import CostModel, enough_requests, fit_validated

CONSTRAINTS = "modeswitch.oracle.constraints:Constraints"

#: flags whose name differs from their Constraints field
_FLAG_OF = {"on_incomplete": "--incomplete"}


def constraints(config: Path | None, **flags):
    """Constraints from the TOML ``config`` (or the defaults), then the non-None flags;
    a flag value the constraints refuse is an input error naming the flag."""

    if config:
        with reading(config):
            c = Constraints.from_toml(config)
    else:
        c = Constraints()
    try:
        return c.replace(**flags)
    except ValidationError as exc:
        field, msg = first_error(exc)
        raise InputError(f"{_FLAG_OF.get(field, '--' + field.replace('_', '-'))}: {msg}") from None


def first_error(exc) -> tuple[str, str]:
    """(dotted field, message) of a pydantic ValidationError's first error: the one line
    to show for a flag value pydantic refuses (its own text spans several)."""
    err = exc.errors()[0]
    return ".".join(map(str, err["loc"])), err["msg"]


def costmodel_for(choice: str, profile, source):
    """The cost model ``--costmodel`` names: a saved one, one fitted now, or none."""
    if choice == "none":
        return None
    if choice != "auto":
        with reading(choice):
            return CostModel.load(choice)
    why = enough_requests(profile)
    if why:
        console.print(f"cost model: not fitted ({why}); estimates are interpolated")
        return None
    cm = fit_validated(profile, source=source)
    better = sorted({f"{m}:{k}" for (m, _, k) in cm.groups if cm.prefers(m, k)})
    console.print(f"cost model: fitted and validated on the profile; used for {len(better)} "
                  "(mode, metric) pairs where it validated better than the interpolation")
    return cm
