"""``costmodel``: per-mode cost models fitted from the profile and cross-validated;
none where the profile is too small, and the estimates are interpolated instead."""

from __future__ import annotations

from pathlib import Path

from modeswitch.oracle.costmodel import CostModel, enough_requests, fit_validated


def run(study) -> dict:
    profile = study._profile()
    why = enough_requests(profile)
    if why:  # as `--costmodel auto` does: the estimates are interpolated instead
        study.log(f"cost model: not fitted ({why}); estimates are interpolated (raise "
                  "[profile] requests_per_family for one)")
        return {"costmodel": None, "not_fitted": why}
    cm = fit_validated(profile, seed=study.cfg.seed, source=str(study.out / "profile.parquet"))
    path = cm.save(study.out / "costmodel.json", overwrite=True)
    v = cm.validation
    lat = v[v["metric"] == "latency_ms"].set_index("mode")["mape_costmodel"]
    ttft = v[v["metric"] == "ttft_ms"].set_index("mode")["mape_costmodel"]
    study.log(f"cost model: latency MAPE median {lat.median():.1%} (worst {lat.idxmax()} "
              f"{lat.max():.1%}); TTFT median {ttft.median():.1%}")
    return {"costmodel": str(path), "latency_mape": {k: float(x) for k, x in lat.items()},
            "ttft_mape": {k: float(x) for k, x in ttft.items()}}


def read_costmodel(out: Path) -> CostModel | None:
    """The step's cost model in the study folder ``out``, or None where the profile was
    too small to fit one."""
    path = out / "costmodel.json"
    return CostModel.load(path) if path.exists() else None
