"""(a) Train two routers on your own profile table and compare them with the rule baseline.

    python examples/train_and_compare.py --profiles runs/demo-*/profiles.parquet
    python examples/train_and_compare.py --table my_costs.csv   # your own per-mode costs
"""

from _data import table_from_args

from modeswitch.routers import api

table, args = table_from_args(__doc__.splitlines()[0])
train, test = api.split(table, "random", test_size=0.3)

# a classifier (learns the oracle's labels) and a cost-predicting router (learns each
# mode's latency ratio and risks, so it can pick a mode it never saw as a label)
routers = {
    "lgbm": api.fit("lgbm", train, n_estimators=50),
    "cost_linear": api.fit("cost_linear", train),
}
scores = api.evaluate(routers, test)

cols = ["speedup", "speedup_low", "speedup_high", "violation_rate_any", "latency_capture",
        "oracle_match", "overhead_p50_us"]
print(f"{len(train)} training / {len(test)} held-out requests; equal family weights")
print(scores[cols].round(3).to_string())
best = scores.drop(index=["oracle", "reference"])["latency_capture"].idxmax()
print(f"best oracle capture: {best} ({scores.loc[best, 'latency_capture']:.2f})")
