"""(c) Export the best router as the MLflow `champion` and query it, in process and served.

    python examples/export_and_query.py --profiles runs/demo-*/profiles.parquet [--serve --model tiny]

Without --serve: the champion is loaded as `modeswitch serve` loads it and asked for
decisions. With --serve: `modeswitch serve` starts on loopback with that champion in
front of the engines and answers OpenAI-style completions; each answer says which
mode the router chose (header x-modeswitch-mode).
"""

import subprocess
import sys
import time
import urllib.request

from _data import table_from_args

from modeswitch.routers import api
from modeswitch.routers.scoring.offline import requests_from_table

if __name__ == "__main__":
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--serve", action="store_true")
    extra.add_argument("--model", default="tiny")
    extra.add_argument("--port", type=int, default=8799)
    opts, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    table, args = table_from_args(__doc__.splitlines()[0])
    train, test = api.split(table, "random", test_size=0.3)
    fitted = {name: api.fit(name, train) for name in ("dt", "lgbm")}
    scores = api.evaluate(fitted, test, decisions=500)
    best = max(fitted, key=lambda n: scores.loc[n, "latency_capture"])
    run_id = api.log_router(fitted[best], train, name=best, mlruns=args.mlruns)
    info = api.export_router(fitted[best], mlruns=args.mlruns, source_run_id=run_id)
    print(f"exported {best} (oracle capture {scores.loc[best, 'latency_capture']:.2f}) as {info['uri']}")

    champion = api.load_router(info["uri"], args.mlruns)
    for req in requests_from_table(test)[:5]:
        print(f"{req.id}: {req.prompt_tokens} prompt / {req.expected_output_tokens} output tokens, "
              f"x{req.concurrent_requests} -> {champion.route(req)} ({champion.path_})")

    if opts.serve:
        import openai

        cmd = [sys.executable, "-m", "modeswitch", "serve", "--router", info["uri"], "--model", opts.model,
               "--port", str(opts.port), "--mlruns", args.mlruns]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{opts.port}"
            for _ in range(240):
                try:
                    if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                        break
                except OSError:
                    time.sleep(0.5)
            client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
            for prompt, n in (("def read_config(path):", 8), ("import os\n" * 40 + "def main():", 8)):
                raw = client.completions.with_raw_response.create(model="modeswitch", prompt=prompt, max_tokens=n)
                print(f"served: {len(prompt)} chars -> mode {raw.headers.get('x-modeswitch-mode')}: "
                      f"{raw.parse().choices[0].text!r}")
        finally:
            server.terminate()
            server.wait(timeout=30)
