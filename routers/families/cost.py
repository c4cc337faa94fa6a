"""Cost-predicting routers: per mode, the latency ratio to the reference and each
constraint's risk, predicted from the request; the fastest mode predicted safe wins
(:mod:`routers.cost_predicting`)."""

from __future__ import annotations

from routers.cost_predicting import LightGBMCostRouter, LinearCostRouter
from routers.registry import RouterFamily, register_router

register_router(RouterFamily("cost_linear", LinearCostRouter,
                             "cost-predicting: ridge latency ratio + logistic risk per mode"))
register_router(RouterFamily("cost_lgbm", LightGBMCostRouter,
                             "cost-predicting: LightGBM latency ratio + risk per mode"))
