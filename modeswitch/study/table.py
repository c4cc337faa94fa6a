"""The study's opening table and findings, read back from each split's score report.

Why read the reports instead of keeping results in memory: a resumed study skips
the splits already scored, and the table must come out the same whether a split
was scored a minute ago or yesterday. Every figure here is a cell of a score
report's ``headline.csv`` / ``live_summary.csv`` / ``live_per_family.csv``; the
findings are templates filled from those figures (which interval overlaps which,
where and by how much the learned routers fall short), never typed by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

#: the routers the table shows, in this order (the reference is the 1.00x everyone is divided by)
ROWS = ("rule", "dt", "rf", "lr", "lgbm", "cost_linear", "cost_lgbm", "oracle")
LEARNED = ("dt", "rf", "lr", "lgbm", "cost_linear", "cost_lgbm")


def _read(path: Path, index="router") -> pd.DataFrame | None:
    if not path.exists():
        return None
    df = pd.read_csv(path)
    return df.set_index(index) if index in df else df


def _ci(row, k, fmt="{:.2f}") -> str:
    v = row.get(k, math.nan)
    if v is None or not math.isfinite(v):
        return "-"
    lo, hi = row.get(f"{k}_low", math.nan), row.get(f"{k}_high", math.nan)
    txt = fmt.format(v)
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        txt += f" [{fmt.format(lo)}, {fmt.format(hi)}]"
    return txt


def _pct(row, k) -> str:
    return _ci({kk: vv * 100 for kk, vv in row.items() if kk.startswith(k) and isinstance(vv, float)},
               k, "{:.0f}%")


def split_figures(report: Path, split: str) -> pd.DataFrame:
    """One row per router of one split's score report: the numbers behind the table."""
    head = _read(report / "headline.csv")
    if head is None:
        raise FileNotFoundError(f"{report}/headline.csv is missing: the split {split!r} was not scored")
    live = _read(report / "live_summary.csv")
    risk = _read(report / "risk_control.csv")
    inside = _read(report / "headline_inside.csv")
    rows = []
    for r in ROWS:
        if r not in head.index:
            continue
        h = head.loc[r].to_dict()
        rec = {"split": split, "router": r, **{f"offline_{k}": v for k, v in h.items()}}
        if live is not None and r in live.index:
            rec.update({f"live_{k}": v for k, v in live.loc[r].to_dict().items()})
        if risk is not None and r in risk.index:
            rec.update({f"risk_{k}": v for k, v in risk.loc[r].to_dict().items()})
        if inside is not None and r in inside.index:
            rec.update({f"inside_{k}": v for k, v in inside.loc[r].to_dict().items()})
        rows.append(rec)
    return pd.DataFrame(rows)


def figures(reports: dict[str, Path]) -> pd.DataFrame:
    """Every split's :func:`split_figures`, stacked (split order as given)."""
    return pd.concat([split_figures(p, s) for s, p in reports.items()], ignore_index=True)


def _strip(row: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)}


def opening_table(fig: pd.DataFrame) -> pd.DataFrame:
    """The table a reader sees first: per (split, router), offline and live speedup and
    energy vs the reference with 95 % intervals, violation rates, oracle capture and
    routing overhead."""
    out = []
    for row in fig.to_dict(orient="records"):
        off, live = _strip(row, "offline_"), _strip(row, "live_")
        out.append({
            "split": row["split"], "router": row["router"],
            "speedup": _ci(off, "speedup"), "energy": _ci(off, "energy_ratio"),
            "violations": _pct(off, "violation_rate_any"),
            "oracle capture": "-" if not math.isfinite(off.get("latency_capture", math.nan))
            else f"{off['latency_capture']:.2f}",
            "overhead p50/p99 us": _overhead(off),
            "live speedup": _ci(live, "speedup"), "live energy": _ci(live, "energy_ratio"),
            "live violations": _pct(live, "violation_rate_any"),
            "live beyond noise": _pct(live, "violation_rate_beyond_noise"),
        })
    return pd.DataFrame(out)


def _num(v, fmt="{:.2f}") -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def generalisation_table(fig: pd.DataFrame) -> pd.DataFrame:
    """Per (split, router): on the held-out requests inside the training part's
    feature ranges, oracle capture, violation rate and speedup; next to it the
    certified target (where the router has one) and the rate reached held out."""
    out = []
    for row in fig.to_dict(orient="records"):
        ins = _strip(row, "inside_")
        risk = _strip(row, "risk_")
        if not (isinstance(risk.get("target"), (int, float)) and math.isfinite(risk["target"])):
            risk = {}  # the router has no certified threshold
        certified = risk.get("certified")
        out.append({
            "split": row["split"], "router": row["router"],
            "inside: oracle capture": _num(ins.get("latency_capture")),
            "inside: violations": _num(ins.get("violation_rate_any", math.nan) * 100, "{:.1f}%")
            if "violation_rate_any" in ins else "-",
            "inside: speedup": _num(ins.get("speedup")),
            "target": _num(risk.get("target", math.nan) * 100, "{:.0f}%") if risk else "-",
            "certified": "-" if not risk else ("yes" if certified in (True, "True") else
                                               certified if isinstance(certified, str) and "folds" in certified
                                               else "no"),
            "held-out violations vs target": "-" if not risk else
            _num(risk.get("held_out_rate", math.nan) * 100, "{:.1f}%"),
        })
    return pd.DataFrame(out)


def _overhead(off: dict) -> str:
    p50, p99 = off.get("overhead_p50_us", math.nan), off.get("overhead_p99_us", math.nan)
    if not (math.isfinite(p50) and math.isfinite(p99)):
        return "-"  # the oracle: it reads the answer, it does not decide
    return f"{p50:.2f} / {p99:.2f}"


def _overlaps(a: dict, b: dict, k: str) -> bool | None:
    vals = [a.get(f"{k}_low"), a.get(f"{k}_high"), b.get(f"{k}_low"), b.get(f"{k}_high")]
    if any(v is None or not math.isfinite(v) for v in vals):
        return None
    return not (vals[1] < vals[2] or vals[3] < vals[0])


def _best_learned(rows: dict, prefix: str) -> str | None:
    """The learned router with the highest ``prefix`` speedup among those whose
    violation rate is the lowest any learned router reached (+2 points)."""
    cand = {r: _strip(rows[r], prefix) for r in LEARNED if r in rows}
    cand = {r: v for r, v in cand.items() if math.isfinite(v.get("speedup", math.nan))}
    # a router that fell back on every request (a threshold certified for nothing) is
    # the reference under another name: not a candidate
    always = {r for r in cand if rows[r].get("offline_fallback_rate", 0.0) >= 0.999}
    cand = {r: v for r, v in cand.items() if r not in always} or cand
    if not cand:
        return None
    low = min(v.get("violation_rate_any", 0.0) for v in cand.values())
    safe = {r: v for r, v in cand.items() if v.get("violation_rate_any", 0.0) <= low + 0.02}
    return max(safe, key=lambda r: safe[r]["speedup"])


def findings(fig: pd.DataFrame, reports: dict[str, Path]) -> list[str]:
    """Sentences computed from the figures: per split, the best learned router live
    (else offline) against the oracle and the rule; on the splits that hold families
    out, the family where it falls furthest short."""
    lines = []
    for split, g in fig.groupby("split", sort=False):
        rows = {r["router"]: r for r in g.to_dict(orient="records")}
        has_live = any(math.isfinite(r.get("live_speedup", math.nan)) for r in rows.values())
        prefix = "live_" if has_live else "offline_"
        where = "live" if has_live else "offline"
        best = _best_learned(rows, prefix)
        if best is None or "oracle" not in rows:
            continue
        b, o = _strip(rows[best], prefix), _strip(rows["oracle"], prefix)
        ru = _strip(rows.get("rule", {}), prefix)
        ov = _overlaps(b, o, "speedup")
        text = (f"**{split}** ({where}): the best learned router is {best}, "
                f"{_ci(b, 'speedup')}x speedup with {b.get('violation_rate_any', math.nan):.0%} of requests "
                f"violating a constraint; the oracle {_ci(o, 'speedup')}x with "
                f"{o.get('violation_rate_any', math.nan):.0%}")
        if ru:
            text += f"; the rule baseline {_ci(ru, 'speedup')}x with {ru.get('violation_rate_any', math.nan):.0%}"
        text += ". "
        if ov is True:
            text += "Its speedup interval overlaps the oracle's."
        elif ov is False:
            gap = o["speedup"] - b["speedup"]
            text += (f"Its speedup interval lies {'below' if gap > 0 else 'above'} the oracle's "
                     f"({abs(gap):.2f}x {'short' if gap > 0 else 'ahead'}).")
        if has_live and split != "random":
            fam = _read(reports[split] / "live_per_family.csv", index=None)
            if fam is not None and {"router", "family", "speedup"} <= set(fam.columns):
                piv = fam.pivot_table(index="family", columns="router", values="speedup")
                if best in piv and "oracle" in piv:
                    short = (piv["oracle"] - piv[best]).dropna().sort_values(ascending=False)
                    if len(short) and short.iloc[0] > 0:
                        f = short.index[0]
                        text += (f" It falls furthest short on {f}: {piv.loc[f, best]:.2f}x against the "
                                 f"oracle's {piv.loc[f, 'oracle']:.2f}x.")
        lines.append(text)
    return lines
