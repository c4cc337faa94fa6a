"""The optimiser loop the project's own models share: the stdlib-trained test model
(:mod:`.tiny`) and SmolLM2's distilled draft (:mod:`.draft`).

Both train briefly from a cold start, so both warm the learning rate up linearly over
the first tenth of the steps and then follow a cosine down to a tenth of it; both
clip gradients at norm 1. One definition keeps the two recipes' behaviour the same
where the recipes do not say otherwise.
"""

from __future__ import annotations

import math


def warmup_cosine(opt, steps: int, floor: float = 0.1):
    """A ``LambdaLR`` over ``opt``: linear warm-up for ``steps // 10`` steps (at least
    one), then cosine from the recipe's rate to ``floor`` times it at ``steps``."""
    import torch  # lazy: torch is heavy, and these modules' recipes and cards need none

    warmup = max(1, steps // 10)

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))

    return torch.optim.lr_scheduler.LambdaLR(opt, lr_at)


def apply_step(loss, params, opt, sched, max_norm: float = 1.0) -> float:
    """Back-propagate ``loss``, clip ``params``' gradients, step the optimiser and the
    schedule, clear the gradients; returns the loss as a float."""
    import torch  # lazy: torch is heavy, and these modules' recipes and cards need none

    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()
