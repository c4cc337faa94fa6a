"""The scoring report: markdown summary, CSV tables, plots, and an MLflow scoring run.

Everything goes into a new folder (an existing one is refused: a run's results
are never overwritten); the MLflow run holds the same files and every router's
headline figures as metrics, tagged with the training runs it scored.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.dataset.io import atomic_path
from modeswitch.routers.scoring.capture import envelope, router_points
from modeswitch.routers.scoring.findings import findings
from modeswitch.routers.training.tracking import git_commit, log_table_input, setup, table_input

#: The study's per-decision overhead (arXiv 2605.23057), drawn for comparison.
STUDY_OVERHEAD_US = {"rule (study)": 9.6, "dt/lr (study)": 4500.0, "rf (study)": 50000.0}

HEADLINE = ["overhead_p50_us", "overhead_p99_us", "violation_rate_quality", "violation_rate_energy",
            "violation_rate_memory", "violation_rate_unmeasured", "violation_rate_any", "speedup",
            "energy_ratio",
            "rouge_delta", "accuracy_delta_pp", "oracle_match", "latency_capture", "energy_capture",
            "mean_regret", "fallback_rate"]


def headline_table(overall: pd.DataFrame, overhead: dict, weighting: str = "families",
                   intervals: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per router: the headline figures (equal family weights), with the 95 % bootstrap
    interval next to speedup, energy ratio and violation rate where ``intervals`` has them."""
    t = overall[overall["weighting"] == weighting].set_index("router").copy()
    t["overhead_p50_us"] = [overhead[r].p50_us if r in overhead else np.nan for r in t.index]
    t["overhead_p99_us"] = [overhead[r].p99_us if r in overhead else np.nan for r in t.index]
    cols = [c for c in HEADLINE if c in t.columns]
    if intervals is not None:
        t = t.join(intervals)
        out = []
        for c in cols:
            out.append(c)
            out += [f"{c}_low", f"{c}_high"] if f"{c}_low" in t else []
        cols = out
    return t[cols]


def _pyplot():
    """pyplot on the non-interactive backend: reports are written on machines without
    a display (and from worker threads)."""
    import matplotlib  # lazy: matplotlib is heavy

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is heavy

    return plt


def _fig(w=7, h=4):
    return _pyplot().subplots(figsize=(w, h))


def _reference_line(ax, vertical=False):
    """The reference mode's level (1.0): above or below it reads as better or worse."""
    (ax.axvline if vertical else ax.axhline)(1.0, color="grey", lw=1, ls="--")


def plots(out: Path, per_request: pd.DataFrame, per_family: pd.DataFrame, overall: pd.DataFrame,
          overhead: dict, live: pd.DataFrame | None = None, frontier=None, content_frontier=None,
          router_curves: pd.DataFrame | None = None, adaptive: pd.DataFrame | None = None) -> list[Path]:
    """Write the report's plots under ``out/plots``; returns their paths in order.
    Router-level plots use equal family weights, as the headline table does."""
    plt = _pyplot()
    paths = []

    def save(fig, name):
        p = out / "plots" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)

    eq = overall[overall["weighting"] == "families"].set_index("router")
    save(_speedup_energy_plot(eq), "speedup_energy.png")
    save(_capture_plot(eq), "oracle_capture.png")
    if overhead:
        save(_overhead_plot(overhead), "routing_overhead.png")
    save(_violations_plot(eq), "violations.png")
    save(_pareto_plot(eq), "pareto.png")
    save(_per_family_plot(per_family), "per_family_speedup.png")
    for r, g in per_request.groupby("router", sort=False):
        if r != "oracle":  # the oracle's picks are its labels: nothing to confuse
            save(_confusion_plot(r, g), f"confusion_{r}.png")
    if live is not None and len(live):
        save(_live_plot(live), "live_speedup_energy.png")
    if frontier is not None and len(frontier.curve):
        save(_frontier_plot(frontier, router_points(per_request), content_frontier, router_curves, adaptive),
             "capture_vs_violations.png")
    return paths


#: the right-hand panel of ``capture_vs_violations.png``: violation rates up to this (%)
FRONTIER_ZOOM_PCT = 10.0


def _frontier_plot(frontier, points: pd.DataFrame, content_frontier=None, router_curves=None, adaptive=None):
    """Capture of the oracle's saving against the violation rate: each router a point,
    the measured ceiling (shape features, every latency known) a line, and beside it
    the ceiling with content features where it was measured; each certified router's
    own threshold swept over the held-out requests a thin line of its point's colour
    (routers.scoring.threshold_sweep: a hindsight diagnostic). Left every rate, right
    the low rates a target lives at (up to ``FRONTIER_ZOOM_PCT``), where the certified
    routers and their curves would otherwise sit on the axis. A certified router replayed
    with its threshold adapted online (``adaptive``) is a hollow diamond of its colour."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(13, 5))
    colours = {r: f"C{i % 10}" for i, r in enumerate(points["router"])}
    for ax in axes:
        if router_curves is not None:
            for r, c in router_curves.groupby("router", sort=False):
                c = c.dropna(subset=["capture", "violations"]).sort_values("threshold")
                ax.plot(c["violations"] * 100, c["capture"], color=colours.get(r, "grey"), lw=1, alpha=0.7,
                        label=f"{r}: its threshold swept over the held-out requests")
        env = envelope(frontier.curve)
        ax.plot(env["violations"] * 100, env["capture"], color="black", lw=1.5,
                label="ceiling: safety from the request's shape, latencies known")
        if content_frontier is not None and len(content_frontier.curve):
            env = envelope(content_frontier.curve)
            ax.plot(env["violations"] * 100, env["capture"], color="tab:purple", lw=1.5, ls="-.",
                    label="ceiling: safety from shape and prompt content, latencies known")
        for r in points.itertuples():
            ax.scatter(r.violations * 100, r.capture, s=60, marker="*" if r.router in ("oracle", "rule") else "o",
                       color=colours[r.router])
            if ax is axes[0] or r.violations * 100 <= FRONTIER_ZOOM_PCT:
                ax.annotate(r.router, (r.violations * 100, r.capture), textcoords="offset points", xytext=(5, 3))
        for r in (adaptive.itertuples() if adaptive is not None else ()):
            ax.scatter(r.violations * 100, r.capture, s=70, marker="D", facecolors="none",
                       edgecolors=colours.get(r.router, "grey"), label=f"{r.router}: threshold adapted online")
        ax.axvline(2.0, color="grey", lw=1, ls="--")
        ax.set_xlabel("held-out requests whose pick violates a constraint (%)")
    axes[0].set_ylabel("share of the oracle's latency saving kept")
    axes[1].set_xlim(-0.3, FRONTIER_ZOOM_PCT)
    axes[1].set_title(f"violation rates up to {FRONTIER_ZOOM_PCT:g} %")
    axes[0].set_title(f"capture vs violations, {frontier.split} split ({frontier.scored} requests inside the "
                      "training ranges)")
    axes[0].legend(loc="lower right", fontsize=8)
    return fig


def _speedup_energy_plot(eq):
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 4))
    eq["speedup"].plot.bar(ax=axes[0], color="tab:blue")
    _reference_line(axes[0])
    axes[0].set_title("latency speedup vs reference (overhead charged)")
    eq["energy_ratio"].plot.bar(ax=axes[1], color="tab:green")
    _reference_line(axes[1])
    axes[1].set_title("energy ratio vs reference (lower is better)")
    return fig


def _capture_plot(eq):
    fig, ax = _fig()
    eq[["latency_capture", "energy_capture"]].plot.bar(ax=ax)
    _reference_line(ax)
    ax.set_title("oracle capture (share of the oracle's saving achieved)")
    return fig


def _overhead_plot(overhead: dict):
    """This run's per-decision overhead next to the study's published figures, on a
    log scale (they span four orders of magnitude)."""
    fig, ax = _fig(8, 0.45 * (len(overhead) + len(STUDY_OVERHEAD_US)) + 1.5)
    names = list(overhead) + list(STUDY_OVERHEAD_US)
    p50 = [overhead[n].p50_us for n in overhead] + list(STUDY_OVERHEAD_US.values())
    p99 = [overhead[n].p99_us for n in overhead] + list(STUDY_OVERHEAD_US.values())
    colors = ["tab:blue"] * len(overhead) + ["tab:grey"] * len(STUDY_OVERHEAD_US)
    ax.barh(names, p50, color=colors, label="p50")
    ax.scatter(p99, names, color="black", marker="|", s=200, label="p99", zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel("microseconds per decision (log scale)")
    ax.set_title("routing overhead: this run (blue) vs the study's (grey)")
    ax.legend()
    return fig


def _violations_plot(eq):
    fig, ax = _fig()
    cols = [c for c in ("violation_rate_quality", "violation_rate_energy", "violation_rate_memory",
                        "violation_rate_unmeasured") if c in eq]
    eq[cols].rename(columns=lambda c: c.replace("violation_rate_", "")).plot.bar(stacked=True, ax=ax)
    ax.set_title("constraint violations by type (rate)")
    return fig


def _pareto_plot(eq):
    fig, ax = _fig(7, 5)
    for r, row in eq.iterrows():
        ax.scatter(row["speedup"], row["energy_ratio"], s=60)
        ax.annotate(r, (row["speedup"], row["energy_ratio"]), textcoords="offset points", xytext=(5, 3))
    _reference_line(ax, vertical=True)
    _reference_line(ax)
    ax.set_xlabel("latency speedup (higher is better)")
    ax.set_ylabel("energy ratio (lower is better)")
    ax.set_title("latency vs energy per router")
    return fig


def _per_family_plot(per_family):
    """Router x family speedup heatmap: where a router's average hides a family it loses."""
    piv = per_family.pivot(index="router", columns="family", values="speedup")
    fig, ax = _fig(1.2 * piv.shape[1] + 3, 0.5 * piv.shape[0] + 2)
    im = ax.imshow(piv.to_numpy(dtype=float), cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(piv.shape[1]), piv.columns, rotation=45, ha="right")
    ax.set_yticks(range(piv.shape[0]), piv.index)
    for i in range(piv.shape[0]):
        for j in range(piv.shape[1]):
            v = piv.iat[i, j]
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=ax, label="speedup")
    ax.set_title("speedup per workload family")
    return fig


def _confusion_plot(router, picks):
    """One router's picks against the oracle labels, over every mode either names."""
    from sklearn.metrics import ConfusionMatrixDisplay  # lazy: scikit-learn is heavy

    labels = sorted(set(picks["label"].astype(str)) | set(picks["pick"].astype(str)))
    fig, ax = _fig(1.0 + 0.7 * len(labels), 1.0 + 0.6 * len(labels))
    ConfusionMatrixDisplay.from_predictions(picks["label"].astype(str), picks["pick"].astype(str),
                                            labels=labels, ax=ax, xticks_rotation="vertical",
                                            colorbar=False)
    ax.set_title(f"{router}: oracle label (rows) vs pick")
    return fig


def _quality_legend(live_summary) -> list[str]:
    """What the live quality columns mean: the study's rule and the per-request view
    are different figures and are named apart."""
    if "divergence_rate" not in live_summary:
        return []
    return ["- `violation_rate_quality`: the study's quality rule, judged per router, mode and "
            "family (mean ROUGE-L of the picks' outputs against the reference's, and their mean "
            "accuracy change, against the table's limits; `quality_scope` in the constraints above); "
            "a lossless pick's divergence is the reference's floor, not a violation "
            "(`lossless_at_floor`)",
            "- `divergence_rate`: the share of picks whose own output's ROUGE-L against the "
            "reference's is below the threshold: the per-request view, not a violation"]


def _live_plot(live):
    """Live speedup and energy ratio per router with their 95 % bootstrap intervals."""
    fig, ax = _fig()
    df = live.set_index("router")
    cols = ["speedup", "energy_ratio"]
    err = None
    if all(f"{c}_low" in df for c in cols):
        err = [[(df[c] - df[f"{c}_low"]).clip(lower=0).to_numpy(),
                (df[f"{c}_high"] - df[c]).clip(lower=0).to_numpy()] for c in cols]
    df[cols].plot.bar(ax=ax, yerr=err, capsize=3)
    _reference_line(ax)
    ax.set_title("live: speedup and energy ratio vs reference (95 % bootstrap intervals)")
    return fig


def _md_table(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join([df.index.name or ""] + cols) + " |",
             "|" + "---|" * (len(cols) + 1)]
    for idx, row in df.iterrows():
        cells = []
        for v in row:
            if isinstance(v, (float, np.floating)):
                cells.append("" if not np.isfinite(v) else format(v, floatfmt))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join([str(idx)] + cells) + " |")
    return "\n".join(lines)


def write_report(out: Path, *, per_request, per_family, overall, overhead: dict, context: dict,
                 live_per=None, live_summary=None, estimate=None, live_figures=None, live_runs=None,
                 live_family=None, intervals=None, coverage=None, frontier=None,
                 content_frontier=None, router_curves=None, certificate_price=None,
                 certificate_refusals=None, adaptive=None, adaptive_family=None) -> list[Path]:
    """Write the report folder (which must not exist yet); returns the files written."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already holds a report; choose a new folder (results are never overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    files = []

    def csv(df, name, **kw):
        p = out / name
        with atomic_path(p) as tmp:
            df.to_csv(tmp, **kw)
        files.append(p)

    head = headline_table(overall, overhead, intervals=intervals)
    csv(per_request, "per_request.csv", index=False)
    csv(per_family, "per_family.csv", index=False)
    csv(overall, "overall.csv", index=False)
    csv(pd.DataFrame([o.as_dict() for o in overhead.values()]), "routing_overhead.csv", index=False)
    csv(head, "headline.csv")
    if live_per is not None:
        csv(live_per, "live_per_request.csv", index=False)
        csv(live_summary, "live_summary.csv", index=False)
        if live_family is not None:
            csv(live_family, "live_per_family.csv", index=False)
    if estimate is not None:
        csv(estimate, "live_estimate_error.csv", index=False)
    if live_runs is not None:
        csv(live_runs, "live_runs.csv", index=False)
    if coverage is not None:
        csv(coverage["ranges"], "extrapolation_ranges.csv", index=False)
        for name, h in coverage["headlines"].items():
            csv(h, f"headline_{name}.csv")
        for name, h in coverage["live"].items():
            csv(h, f"live_summary_{name}.csv", index=False)
        if len(coverage["risk"]):
            csv(coverage["risk"], "risk_control.csv", index=False)
        if coverage.get("risk_family") is not None and len(coverage["risk_family"]):
            csv(coverage["risk_family"], "risk_control_by_family.csv", index=False)
    files += plots(out, per_request, per_family, overall, overhead, live_summary, frontier, content_frontier,
                   router_curves, adaptive)
    if router_curves is not None and len(router_curves):
        csv(router_curves, "router_curves.csv", index=False)
    if certificate_price is not None and len(certificate_price):
        csv(certificate_price, "certificate_price.csv", index=False)
    if certificate_refusals is not None and len(certificate_refusals):
        csv(certificate_refusals, "certificate_refusals.csv", index=False)
    if adaptive is not None and len(adaptive):
        csv(adaptive, "adaptive_replay.csv", index=False)
        csv(adaptive_family, "adaptive_replay_per_family.csv", index=False)
    if frontier is not None and len(frontier.curve):
        curves = [frontier.curve.assign(features="shape")]
        if content_frontier is not None and len(content_frontier.curve):
            curves.append(content_frontier.curve.assign(features="shape+content"))
        csv(pd.concat(curves, ignore_index=True), "frontier.csv", index=False)

    md = [f"# Router scoring: {context.get('name', out.name)}", ""]
    md += [f"- {k}: {v}" for k, v in context.items()]
    md += ["", "## Offline, held-out requests (equal family weights; overhead charged at its p50)", "",
           _md_table(head), "",
           "## Offline, request-weighted", "",
           _md_table(headline_table(overall, overhead, "requests")), "",
           "## Routing overhead (one decision from a raw request; batch on a ready frame)", "",
           _md_table(pd.DataFrame([o.as_dict() for o in overhead.values()]).set_index("router")), ""]
    if live_summary is not None:
        md += ["## Live (real engine runs on a held-out stream; equal family weights)", "",
               _md_table(live_summary.set_index("router")), "", *_quality_legend(live_summary), ""]
        if live_figures:
            md += [f"- {k}: {v}" for k, v in live_figures.items()] + [""]
    if coverage is not None:
        md += _coverage_md(coverage)
    if certificate_price is not None and len(certificate_price):
        md += _price_md(certificate_price)
    if certificate_refusals is not None and len(certificate_refusals):
        md += _refusals_md(certificate_refusals)
    if adaptive is not None and len(adaptive):
        md += _adaptive_md(adaptive, adaptive_family)
    md[2:2] = ["## Findings (computed from the tables below)", "",
               *findings(head, live_summary), ""]
    md += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in files if p.suffix == ".png"]
    p = out / "README.md"
    with atomic_path(p) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    files.append(p)
    return files


def _coverage_md(cov: dict) -> list[str]:
    """Report sections: certified targets next to achieved rates; covered and
    extrapolated held-out requests scored apart, with the ranges that differ."""
    md = []
    if len(cov["risk"]):
        md += ["## Certified violation targets (Learn then Test on held-out training rows)", "",
               _md_table(cov["risk"].set_index("router")), ""]
    fam = cov.get("risk_family")
    if fam is not None and len(fam):
        broken = fam[~fam["met"]]
        md += ["### The target next to each held-out family's own rate (`risk_control_by_family.csv`)", "",
               f"{len(broken)} of {len(fam)} (router, family) pairs exceed target + slack"
               + (": " + ", ".join(f"{r.router} in {r.family} ({r.held_out_rate:.1%}"
                                   + (f", its violations from {r.violating_sources} of the family's "
                                      f"{r.sources} measurement sources" if "sources" in fam else "") + ")"
                                   for r in broken.itertuples()) if len(broken) else "") + ".", "",
               _md_table(fam.set_index("router")), ""]
        new = cov.get("new_family")
        if new:
            md += [f"Each of these families was new to its certificate, which was held to its "
                   f"{new['calibration_families']} calibration families one by one. If families are "
                   f"exchangeable, a new family's rate is the highest of the {new['calibration_families'] + 1} "
                   f"with chance 1/{new['calibration_families'] + 1} = {new['chance']:.0%}, and only then can "
                   f"it break the target (the certificate's confidence aside): at most about {new['expected']:.1f} "
                   f"of these {new['pairs']} pairs by that alone; {new['broken']} did. More families, not "
                   "more requests, tighten it.", ""]
    md += [f"## Inside vs outside the training data ({cov['extrapolated']} of {cov['held_out']} "
           "held-out requests have a feature outside the training part's range)", ""]
    for name, h in cov["headlines"].items():
        md += [f"### Offline, {name} requests", "", _md_table(h), ""]
    for name, h in cov["live"].items():
        md += [f"### Live, {name} requests", "", _md_table(h.set_index("router")), ""]
    if len(cov["ranges"]):
        md += ["### Features outside the training range, per held-out family", "",
               _md_table(cov["ranges"].set_index("family")), ""]
    return md


def _price_md(price: pd.DataFrame) -> list[str]:
    """The section that splits a certified router's distance from the ceiling in two."""
    md = ["## What the certificate costs (held-out requests inside the training ranges, request-weighted)", "",
          "Each certified router's threshold swept over the held-out requests (`router_curves.csv`, the thin "
          "lines of `capture_vs_violations.png`). *Hindsight* is the curve's best capture at or below the "
          "target, its threshold chosen on the held-out outcomes: no router could serve it. From the "
          "ceiling (every latency known) to hindsight is what predicting a new family's latencies and "
          "risks costs; from hindsight to certified is what the certificate costs (its threshold chosen "
          "on training families only, each decided by a model fitted without it).", ""]
    for r in price.itertuples():
        ceiling, safe = getattr(r, "ceiling_capture", np.nan), getattr(r, "ceiling_safe_capture", np.nan)
        own = getattr(r, "ceiling_rule_capture", np.nan)
        said = ([f"by these routers' own rule, the fastest mode under a risk threshold: {own:.1%}"]
                if np.isfinite(own) else []) + ([f"counting safe picks' saving alone: {safe:.1%}"]
                                                if np.isfinite(safe) else [])
        md.append(f"- {r.router}: certified {r.certified_capture:.1%} at {r.certified_violations:.1%} violations; "
                  f"hindsight {r.hindsight_capture:.1%} at {r.hindsight_violations:.1%}; ceiling "
                  f"{ceiling:.1%} at <= {r.target:.0%}" + (f" ({'; '.join(said)})" if said else "") + ".")
    return md + ["", _md_table(price.set_index("router")), ""]


def _adaptive_md(adaptive: pd.DataFrame, per_family: pd.DataFrame) -> list[str]:
    """The section on each certified router with its threshold adapted online."""
    # behind the experimental boundary: loaded only when the report has a replay
    from modeswitch.routers.scoring.adaptive import summary_line

    md = ["## Adapted online (the held-out requests replayed as a stream)", "",
          "Each certified router served the held-out requests in a random order, its threshold moved "
          "after every pick by that pick's outcome (`routers.adaptive`: adaptive conformal inference on "
          "the threshold). Over each stream (every held-out request, extrapolated ones too) its violation "
          "rate exceeds the target by at most the stated slack, on any order; a family's own rate inside a "
          "mixed stream is not bound. It assumes the server learns every pick's outcome (a shadow run of "
          "the reference). Capture and violations are over the requests inside the training ranges, as "
          "every point in the plot, beside the certified threshold on the same requests and decider "
          "(`adaptive_replay.csv`, `adaptive_replay_per_family.csv`).", ""]
    md += [f"- {r.router}: {summary_line(r)}." for r in adaptive.itertuples()]
    md += ["", _md_table(adaptive.set_index("router")), ""]
    if per_family is not None and len(per_family):
        md += [_md_table(per_family.set_index(["router", "family"])), ""]
    return md


def _refusals_md(refusals: pd.DataFrame, top: int = 5) -> list[str]:
    """The section that names what stopped each certificate: its largest groups of
    violating calibration picks at the first threshold it refused."""
    md = ["## What the certificate refused (calibration rows, each decided without its family)", "",
          "Each certificate walks its thresholds from the strictest and stops at the first whose "
          "calibration picks violate too often. The picks that broke a limit there, by the family they "
          "came from, the mode picked and the limit broken (`certificate_refusals.csv`, every group): "
          "what a better model has to fix before the certificate can loosen.", ""]
    for (router, held), g in refusals.groupby(["router", "held_out"], sort=False):
        lead = g.head(top)
        where = f" (held out: {held})" if held else ""
        total = int(g["violations"].sum())
        md.append(f"- {router}{where}: certified {g['threshold'].iloc[0]:.3f}, refused "
                  f"{g['refused_threshold'].iloc[0]:.3f} with {total} violating pick(s); most: "
                  + "; ".join(f"{r.mode} on {r.family} ({r.limit}) {int(r.violations)} of "
                              f"{int(r.calibration_rows)}, latency {r.median_latency_ratio:.2f}x"
                              for r in lead.itertuples()) + ".")
    return md + [""]


def _router_kind(name: str) -> str:
    """What a scored router is, for the child run's ``router_kind`` tag."""
    if name in ("reference", "rule", "oracle"):
        return {"reference": "fixed reference mode", "rule": "rule baseline",
                "oracle": "oracle (upper bound)"}[name]
    return "cost-predicting" if name.startswith("cost_") else "classifier"


def log_to_mlflow(out: Path, mlruns: Path, head: pd.DataFrame, context: dict,
                  router_runs: dict[str, str], live_summary=None, table: pd.DataFrame | None = None) -> str:
    """One MLflow run in experiment ``modeswitch-score`` holding the report, and one
    child run per router under it with the same metric names for all (the headline's
    figures; ``live_*`` for the live ones; NaN where a figure does not apply), so the
    UI's chart and compare views put the routers side by side (the parent holds no
    per-router metrics: prefixed copies, ``lgbm.speedup``, made 140 charts of one bar
    each). ``table`` (the training table scored on) is logged as every run's input. Returns
    the parent's id."""
    import mlflow  # lazy: MLflow is slow to import

    setup(Path(mlruns), "modeswitch-score")
    dataset = table_input(table) if table is not None else None
    commit = git_commit()

    def number(v) -> float:
        return float(v) if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
            else float("nan")

    live = live_summary.set_index("router") if live_summary is not None else None
    live_cols = [c for c in live.columns if pd.api.types.is_numeric_dtype(live[c])] if live is not None else []
    with mlflow.start_run(run_name=context.get("name", out.name)) as run:
        mlflow.set_tags({"git_commit": commit, "router_run_ids": json.dumps(router_runs),
                         **{f"router_run.{k}": v for k, v in router_runs.items()},
                         **{f"context.{k}": str(v)[:500] for k, v in context.items()}})
        if table is not None:
            log_table_input(table, "scoring", dataset)
        for r, row in head.iterrows():
            with mlflow.start_run(run_name=str(r), nested=True):
                mlflow.set_tags({"router": str(r), "router_family": str(r),
                                 "router_kind": _router_kind(str(r)), "git_commit": commit,
                                 **({"training_run_id": router_runs[r]} if r in router_runs else {}),
                                 **{f"context.{k}": str(v)[:500] for k, v in context.items()}})
                metrics = {str(k): number(v) for k, v in row.items()}
                if live is not None:
                    metrics.update({f"live_{k}": number(live.loc[r, k]) if r in live.index else float("nan")
                                    for k in live_cols})
                mlflow.log_metrics(metrics)
                if table is not None:
                    log_table_input(table, "scoring", dataset)
        mlflow.log_artifacts(str(out), artifact_path="report")
        return run.info.run_id
