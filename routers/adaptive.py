"""A risk threshold that moves online with the violations measured on served requests
(:class:`AdaptiveThresholdRouter`; the update rule alone: :class:`ThresholdTracker`).

Why: a certificate (:mod:`modeswitch.routers.certified`) answers for new requests that look like
its calibration rows; a family it never saw can break it (the held-out families of the
study), and one that is easier than the calibration rows leaves saving on the table
(a threshold chosen in hindsight can keep far more at the target than the certified
one; docs/results.md). Where the server
learns, after the fact, whether a served pick broke a limit (a shadow run of the
reference on a sample of requests: its output for ROUGE-L, its energy), the threshold
can follow the stream instead: adaptive conformal inference (Gibbs and Candès,
"Adaptive conformal inference under distribution shift", arXiv:2106.00170) moves its
level after every outcome, up after a miss and down after a hit, so that the long-run
miss rate is the target on *any* sequence, shifted or adversarial. Applied to the
threshold itself, not to a level mapped through a calibration quantile, the rule is
the quantile tracker of Angelopoulos, Candès and Tibshirani ("Conformal PID control
for time series prediction", arXiv:2307.16895):

    u <- min(u + eta * (target - violated), B)

with ``u`` the threshold's distance from the strictest end towards the loosest (the
threshold served is the strictest while ``u <= 0``, ``B`` the range's width): one step of
online gradient descent on the pinball loss. Each violation tightens it by
``eta * (1 - target)``, each clean pick loosens it by ``eta * target``. The guarantee
(their Proposition 1): summing the steps, ``eta * (sum of violations - target * T)`` is
at most the start's ``u`` minus the end's, and ``u`` never ends below
``-eta * (1 - target)`` (at or below 0 the reference answers, which never violates, so
``u`` only rises there), nor starts above ``B``. So after ``T`` outcomes the observed
violation rate exceeds the target by at most ``(B + eta) / (eta * T)`` (:meth:`slack`),
whatever the requests were: no probability, no exchangeability. The cap at ``B`` only
drops loosening steps, so it can only lower the rate (a stream easy enough that even
the loosest threshold stays under the target). The price: the bound is about the
stream's average, not any one request, and shrinks as ``1 / T``; ``u`` is not clipped
at the strict end, since a clip there would drop tightening steps and void the bound.

What it does not give: a rate per family (a family that arrives rarely can break the
target while the stream's average holds; the replay in :mod:`modeswitch.routers.scoring.adaptive`
reports both), and anything before feedback arrives (outcomes fed back ``d`` decisions
late widen the bound: :meth:`ThresholdTracker.slack` with ``delay``). Only routers that
answer the reference below a finite threshold can be adapted so (the cost-predicting
routers, below 0: :func:`tracker_for`); a mode classifier's strictest threshold is
infinite and answers its fallback.

Served compiled (:meth:`AdaptiveThresholdRouter.compile`): a compiled router has its
threshold built in (the margin's logit shifts its biases), and the risk router's own
pipeline decides in milliseconds, not microseconds (``bench/routing_overhead.py`` times
both). So the compiled form keeps one compiled router at
the threshold it was built for and, when the tracker has moved more than
``recompile_step`` of the range away from it, builds the next one on a background
thread and swaps it in; decisions never wait for a build. Once the tracker reaches the
strict end any lag at all starts a build. What that costs the bound: a violation
served while the tracker already sits at the strict end is one tightening step beyond
the bound's, and such decisions are those made while a build runs (milliseconds for
cost_linear, seconds for cost LightGBM's trees and region tree); between builds the served threshold trails the
tracker's by at most ``recompile_step`` of the range, on the loose side only while
the tracker tightens. The tracker lives in memory: a reload or a restart starts again
from the certified threshold. A certified router's distilled tree answers one
threshold only, so the adapted router decides with the ensemble it certified.
"""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.frozen import FrozenEstimator
from sklearn.utils.validation import check_is_fitted

from modeswitch.experimental import experimental_class
from modeswitch.routers.base import RouterMixin
from modeswitch.routers.risk_control import ALPHA

#: the update's step as a share of the threshold's range (the replay's and the router's default)
STEP_SIZE = 0.1


class ThresholdTracker:
    """The online update of one risk threshold (the module's docstring has the rule).

    ``start``: the threshold before any outcome (a certified one, typically);
    ``strictest`` / ``loosest``: the router's ends (``strictest`` answers the reference
    only); ``target``: the long-run violation rate sought; ``step_size``: ``eta`` as a
    share of the range ``|loosest - strictest|``."""

    def __init__(self, start: float, strictest: float, loosest: float, target: float = ALPHA,
                 step_size: float = STEP_SIZE):
        if not 0 < target < 1:
            raise ValueError(f"target violation rate {target}: must lie in (0, 1)")
        if not step_size > 0:
            raise ValueError(f"step_size {step_size}: must be positive")
        if not (np.isfinite(strictest) and np.isfinite(loosest)):
            raise ValueError(f"thresholds {strictest} .. {loosest}: both ends must be finite")
        if strictest == loosest:
            raise ValueError("the router's strictest and loosest thresholds coincide: nothing to adapt")
        self.strictest, self.sign = float(strictest), (1.0 if loosest > strictest else -1.0)
        self.width = abs(float(loosest) - self.strictest)
        self.eta = float(step_size) * self.width
        self.target = float(target)
        #: the distance from the strictest end towards the loosest (<= 0: the strictest)
        self.position = float(np.clip(self.sign * (float(start) - self.strictest), 0.0, self.width))
        self.observed = 0
        self.violations = 0

    @property
    def threshold(self) -> float:
        """The threshold to decide with now."""
        return self.strictest + self.sign * max(self.position, 0.0)

    def update(self, violated: bool) -> float:
        """One outcome of a served pick; returns the threshold for the next decision."""
        v = bool(violated)
        self.observed += 1
        self.violations += v
        self.position = min(self.position + self.eta * (self.target - v), self.width)
        return self.threshold

    @property
    def rate(self) -> float:
        """The violation rate observed so far (NaN before any outcome)."""
        return self.violations / self.observed if self.observed else float("nan")

    def slack(self, outcomes: int | None = None, delay: int = 0) -> float:
        """How far the violation rate over ``outcomes`` decisions (default: those observed)
        may exceed the target: ``(B + eta) / (eta * T)``; with each outcome fed back
        ``delay`` decisions late, ``(B + (delay + 1) * eta) / (eta * T) + delay / T`` (a
        violation can come ``delay`` tightening steps after the threshold reached the
        strictest end, and the last ``delay`` decisions are never fed back)."""
        t = self.observed if outcomes is None else int(outcomes)
        d = int(delay)
        return (self.width + (d + 1) * self.eta) / (self.eta * t) + d / t if t > 0 else float("inf")


def tracker_for(router, start: float | None, target: float, step_size: float) -> ThresholdTracker:
    """The tracker of ``router``'s risk threshold, from ``start`` (None: the strictest):
    its strict end just below ``router.reference_only_below`` (the cost-predicting routers:
    0), where the router answers the reference only. A router without such an end (a mode
    classifier: its strictest threshold is infinite and answers its fallback, which need
    not be the reference) cannot be adapted with the bound."""
    below = getattr(router, "reference_only_below", None)
    loosest = getattr(router, "loosest_threshold", lambda: None)()
    if below is None or loosest is None:
        raise ValueError(f"{type(router).__name__} cannot adapt its threshold online: that needs a finite "
                         "threshold below which it answers the reference only (reference_only_below: the "
                         "cost-predicting routers)")
    loosest = float(loosest)
    strict = float(np.nextafter(below, -np.inf if loosest > below else np.inf))
    return ThresholdTracker(strict if start is None else float(start), strict, loosest, target, step_size)


@experimental_class
class AdaptiveThresholdRouter(ClassifierMixin, RouterMixin, BaseEstimator):
    """``router`` (any router with a risk score; a :class:`~modeswitch.routers.certified.CertifiedRouter`
    starts at its certified threshold) with its threshold moved online by
    :meth:`observe`.

    ``target_violation_rate``: the long-run rate sought; ``step_size``: the update's step
    as a share of the threshold's range. To adapt a router that is already fitted (one
    loaded from MLflow), wrap it in ``sklearn.frozen.FrozenEstimator``: ``fit`` then
    fits nothing. The router given is never changed: the wrapper decides with a copy."""

    decision_path = "pipeline"

    def __init__(self, router, *, target_violation_rate=ALPHA, step_size=STEP_SIZE, recompile_step=0.05):
        self.router = router
        self.target_violation_rate = target_violation_rate
        self.step_size = step_size
        self.recompile_step = recompile_step

    def fit(self, X, y=None, **fit_params):
        self.__dict__.pop("_compiled", None)  # a compiled form follows the router it was built from
        fitted = clone(self.router).fit(X, y, **fit_params)
        fitted = fitted.estimator if isinstance(fitted, FrozenEstimator) else fitted
        certified = hasattr(fitted, "router_") and hasattr(fitted, "threshold_")
        decider = copy.deepcopy(fitted.router_ if certified else fitted)
        start = fitted.threshold_ if certified else getattr(decider, "threshold_", None)
        self.tracker_ = tracker_for(decider, start, self.target_violation_rate, self.step_size)
        decider.set_risk_threshold(self.tracker_.threshold)
        self.router_ = decider
        self.start_threshold_ = self.tracker_.threshold
        self.classes_ = decider.classes_
        self.modes_ = list(decider.modes_)
        return self

    @property
    def threshold_(self) -> float:
        check_is_fitted(self, "tracker_")
        return self.tracker_.threshold

    def observe(self, violated) -> float:
        """Outcomes of served picks (a bool, or several in the order they were served):
        each moves the threshold; returns the one the next decision uses."""
        check_is_fitted(self, "tracker_")
        for v in np.atleast_1d(np.asarray(violated, dtype=bool)):
            self.tracker_.update(bool(v))
        self.router_.set_risk_threshold(self.tracker_.threshold)
        compiled = self.__dict__.get("_compiled")
        if compiled is not None:
            compiled.follow(self.tracker_.threshold)
        return self.tracker_.threshold

    def state(self) -> dict:
        """What the server reports: the threshold, its start, outcomes seen, their rate and
        the bound's slack around the target."""
        t = self.tracker_
        compiled = self.__dict__.get("_compiled")
        return {"threshold": t.threshold, "start_threshold": self.start_threshold_, "target": t.target,
                "observed": t.observed, "violations": t.violations, "rate": t.rate, "slack": t.slack(),
                **({"compiled_threshold": compiled.threshold, "recompiles": compiled.builds - 1}
                   if compiled is not None else {})}

    def compile(self):
        """A compiled form that follows the threshold (:class:`CompiledAdaptive`), or None
        with the reason where the risk router has none; one per wrapper, which
        :meth:`observe` keeps current."""
        check_is_fitted(self, "router_")
        if self.__dict__.get("_compiled") is None:
            first = _compiled_at(self.router_, self.tracker_.threshold)
            if first is None:
                self.compile_reason_ = getattr(self.router_, "compile_reason_", "the risk router has no compiled form")
                return None
            self._compiled = CompiledAdaptive(self, first, self.tracker_.threshold)
        return self._compiled

    def __getstate__(self):
        # a compiled router holds the kernel's handles and a lock: built again after loading
        state = super().__getstate__()
        state.pop("_compiled", None)
        return state

    # -- the Router protocol: the risk router decides at the current threshold --------------
    def predict(self, X):
        check_is_fitted(self, "router_")
        return self.router_.predict(X)

    def predict_with_fallback(self, X):
        check_is_fitted(self, "router_")
        return self.router_.predict_with_fallback(X)

    def route(self, request) -> str:
        check_is_fitted(self, "router_")
        return self.router_.route(request)

    def explain(self, X) -> list[tuple[str, str]]:
        t = self.tracker_
        return [(m, f"{why} (threshold adapted online: {t.threshold:.3g} after {t.observed} outcomes)")
                for m, why in self.router_.explain(X)]


def _compiled_at(router, threshold: float):
    """``router`` compiled at ``threshold`` (a shallow copy takes the threshold: the fitted
    models are shared, read only), or None."""
    at = copy.copy(router)
    at.set_risk_threshold(threshold)
    return at.compile()


class CompiledAdaptive:
    """The compiled form of an :class:`AdaptiveThresholdRouter`: ``route`` asks one compiled
    router (built at ``threshold``), swapped for one built at the
    tracker's threshold on a background thread whenever the two differ by more than the
    wrapper's ``recompile_step`` of the range. ``observe`` and ``state`` are the wrapper's,
    so a server holding this form takes feedback as the wrapper would."""

    def __init__(self, owner: AdaptiveThresholdRouter, first, threshold: float):
        self.owner = owner
        self.classes_ = first.classes_
        self.modes_ = owner.modes_
        self.distilled_ = None
        self.threshold = float(threshold)
        self.builds = 1
        self._route = first.route
        self._lock = threading.Lock()
        self._building = False
        self._wanted = self.threshold
        self._step = float(owner.recompile_step) * owner.tracker_.width

    def route(self, request) -> str:
        # a method, not the compiled router's bound one: callers keep ``route`` (the
        # server, the overhead timer) and must see each swap
        return self._route(request)

    def observe(self, violated) -> float:
        return self.owner.observe(violated)

    def state(self) -> dict:
        return self.owner.state()

    def follow(self, threshold: float) -> None:
        """Build for ``threshold`` off the serving path if it moved far enough (one build
        at a time; a build that finishes behind the tracker starts the next)."""
        with self._lock:
            self._wanted = float(threshold)
            if self._building or not self._behind():
                return
            self._building = True
        threading.Thread(target=self._build, name="modeswitch-adaptive-compile", daemon=True).start()

    def _build(self) -> None:
        while True:
            with self._lock:
                target = self._wanted
            try:
                fast = _compiled_at(self.owner.router_, target)
            except Exception:  # noqa: BLE001 - the router compiled once; keep serving the last one built
                fast = None
            with self._lock:
                if fast is not None:
                    self._route, self.threshold = fast.route, target
                    self.builds += 1
                if fast is None or not self._behind():
                    self._building = False
                    return

    def _behind(self) -> bool:
        """Whether the compiled threshold lags the tracker's enough to rebuild: by more than
        the step, or at all once the tracker sits at the strict end (the bound needs the
        strict end served as soon as it is reached: there the reference answers)."""
        if self._wanted == self.threshold:
            return False
        return abs(self._wanted - self.threshold) > self._step or self._wanted == self.owner.tracker_.strictest

    def wait(self, timeout: float = 60.0) -> bool:
        """Until no build is running (tests, benchmarks; the serving path never waits);
        whether none is."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if not self._building:
                    return True
            time.sleep(0.001)
        return False
