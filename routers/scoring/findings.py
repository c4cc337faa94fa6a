"""The findings paragraph of a scoring report, computed from its numbers.

Why: a report whose conclusions are typed by hand drifts from its tables the
first time someone reruns it. Every sentence here is a template filled from the
headline (offline) and live tables, and the comparisons it states (whether two
intervals overlap, which router is best) are computed, never asserted.
"""

from __future__ import annotations

import math

import pandas as pd

#: the study's figures we compare with (ModeSwitch-LLM, arXiv 2605.23057): its rule
#: controller's decision time, and the range of its learned routers'
STUDY_RULE_US = 9.6
STUDY_LEARNED_US = (4500.0, 50000.0)
BASELINES = ("reference", "rule", "oracle")


def _sig2(x: float) -> str:
    """Two significant figures, with thousands separators (a ratio of timings)."""
    if not math.isfinite(x) or x <= 0:
        return "-"
    return f"{float(f'{x:.2g}'):,.0f}" if x >= 10 else f"{x:.2g}"


def _ci(row, k):
    lo, hi = row.get(f"{k}_low"), row.get(f"{k}_high")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    return f" [{lo:.2f}, {hi:.2f}]"


def _overlap(a, b, k) -> bool | None:
    """Whether two rows' intervals of ``k`` overlap; None without two intervals to compare
    (no bounds, or a point: too few requests to resample, where two points two hundredths
    apart print alike and would read as "do not overlap")."""
    try:
        lows, highs = (a[f"{k}_low"], b[f"{k}_low"]), (a[f"{k}_high"], b[f"{k}_high"])
    except KeyError:
        return None
    if any(hi <= lo for lo, hi in zip(lows, highs)):
        return None
    return not (highs[0] < lows[1] or highs[1] < lows[0])


def _as_safe_as_the_safest(learned: pd.DataFrame, vcol: str | None) -> pd.DataFrame:
    """The learned routers whose violation rate is not beyond noise above the safest's:
    their interval reaches the safest one's upper end (point values without intervals)."""
    if vcol is None:
        return learned
    safest = learned[vcol].idxmin()
    if f"{vcol}_low" in learned:
        top = learned.loc[safest, f"{vcol}_high"]
        return learned[learned[f"{vcol}_low"] <= top]
    return learned[learned[vcol] <= learned.loc[safest, vcol]]


def findings(head: pd.DataFrame, live: pd.DataFrame | None = None) -> list[str]:
    """Sentences for the report: the best learned router offline (the fastest of those
    as safe as the safest learned one, see :func:`_as_safe_as_the_safest`), how it
    compares with the rule and the oracle, its routing overhead against the study's,
    and the same comparison live."""
    out = []
    learned = head.loc[[r for r in head.index if r not in BASELINES]]
    if learned.empty or "rule" not in head.index:
        return ["No learned router was scored next to the rule baseline."]
    rule = head.loc["rule"]
    vcol = "violation_rate_any" if "violation_rate_any" in head else None
    pool = _as_safe_as_the_safest(learned, vcol)
    best_name = pool["speedup"].idxmax()
    best = head.loc[best_name]
    out.append(
        f"Offline, the fastest learned router among those as safe as the safest ({', '.join(pool.index)}"
        f" of {len(learned)}: violation-rate intervals overlapping the lowest) is {best_name}: "
        f"speedup {best['speedup']:.2f}x{_ci(best, 'speedup')} against the rule's "
        f"{rule['speedup']:.2f}x{_ci(rule, 'speedup')}"
        + (f", violating a constraint on {best[vcol]:.1%} of requests against the rule's "
           f"{rule[vcol]:.1%}" if vcol else "") + ".")
    if "oracle" in head.index:
        o = head.loc["oracle"]
        ov = _overlap(best, o, "speedup")
        out.append(f"The oracle reaches {o['speedup']:.2f}x{_ci(o, 'speedup')}; {best_name}'s "
                   f"interval {'overlaps' if ov else 'does not overlap'} it" if ov is not None else
                   f"The oracle reaches {o['speedup']:.2f}x")
        out[-1] += (f" (oracle match {best['oracle_match']:.2f}, latency capture "
                    f"{best['latency_capture']:.2f})." if "latency_capture" in best else ".")
    if "overhead_p50_us" in head:
        p50, p99 = best["overhead_p50_us"], best["overhead_p99_us"]
        lo, hi = STUDY_LEARNED_US
        out.append(f"{best_name} decides in {p50:.2f} us at the median ({p99:.2f} us p99); the "
                   f"rule baseline here {rule['overhead_p50_us']:.2f} us; the study's rule "
                   f"controller took {STUDY_RULE_US} us and its learned routers {lo / 1000:g}-"
                   f"{hi / 1000:g} ms, {_sig2(lo / p50)}-{_sig2(hi / p50)}x {best_name}'s median.")
    if live is not None and len(live):
        lv = live.set_index("router") if "router" in live.columns else live
        if best_name in lv.index and "oracle" in lv.index:
            b, o = lv.loc[best_name], lv.loc["oracle"]
            ov = _overlap(b, o, "speedup")
            noise = "violation_rate_beyond_noise" in lv
            out.append(
                f"Live, {best_name} runs at {b['speedup']:.2f}x{_ci(b, 'speedup')} and the oracle's "
                f"picks at {o['speedup']:.2f}x{_ci(o, 'speedup')}"
                + ({True: ": the intervals overlap", False: ": the intervals do not overlap"}.get(ov,
                   ": too few requests for an interval"))
                + (f"; beyond noise they violate a constraint on {b['violation_rate_beyond_noise']:.1%} "
                   f"and {o['violation_rate_beyond_noise']:.1%} of requests"
                   if noise else "") + ".")
        if "rule" in lv.index:
            r = lv.loc["rule"]
            out.append(f"Live, the rule baseline runs at {r['speedup']:.2f}x{_ci(r, 'speedup')}"
                       + (f", violating on {r['violation_rate_any']:.1%} of requests"
                          if "violation_rate_any" in lv else "") + ".")
    return out
