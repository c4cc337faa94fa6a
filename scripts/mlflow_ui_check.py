"""Look at a running MLflow UI as a user would, in headless Chromium (Debian's
`chromium`), and save screenshots: the scoring experiment's runs (Dataset column),
its per-router child runs charted side by side (speedup, violation_rate_quality),
and a training experiment's runs with their dataset.

    make ui &   # or: mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db --port 5000
    .venv/bin/python scripts/mlflow_ui_check.py --url http://127.0.0.1:5000 --mlruns mlruns --out ui-shots

Drives the page through Chrome's DevTools protocol (aiohttp's websocket client);
prints what each page shows (experiment kind, chart titles, dataset names).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import subprocess
from pathlib import Path

import mlflow

from modeswitch.routers.training.tracking import tracking_uri


class Page:
    def __init__(self, ws):
        self.ws, self.n = ws, 0

    async def send(self, method, **params):
        self.n += 1
        await self.ws.send_str(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == self.n:
                return msg.get("result", msg)

    async def js(self, expr):
        r = await self.send("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        return r.get("result", {}).get("value")

    async def shot(self, path: Path):
        r = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(r["data"]))
        print(f"saved {path}")


async def run(url: str, score_exp: str, train_exp: str, out: Path, port: int = 9333):
    import aiohttp  # optional: comes with MLflow's server, only this check needs it

    proc = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             "--window-size=1600,1100", f"--remote-debugging-port={port}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ml = "workflowType=machine_learning"
    search = "document.querySelector('input[placeholder=\"Search metric charts\"]')"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(100):
                try:
                    tabs = await (await s.get(f"http://127.0.0.1:{port}/json")).json()
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.3)
            tab = next(t for t in tabs if t["type"] == "page")
            async with s.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                p = Page(ws)
                await p.send("Page.enable")
                await p.send("Emulation.setDeviceMetricsOverride", width=1600, height=1100,
                             deviceScaleFactor=1, mobile=False)

                async def go(path, wait=15.0):
                    await p.send("Page.navigate", url=f"{url}/#{path}")
                    await asyncio.sleep(wait)

                await go(f"/experiments/{score_exp}", 20)
                print("without ?workflowType: GenAI overview shown:",
                      await p.js("document.body.innerText.includes('Traces') && "
                                 "document.body.innerText.includes('Overview')"))
                await go(f"/experiments/{score_exp}?{ml}")
                await p.shot(out / "score_runs.png")
                print("datasets:", await p.js("Array.from(document.querySelectorAll("
                                              "'[data-testid=open-dataset-drawer]')).map(e => e.innerText)"))
                await p.js("document.querySelector('.ag-row button[data-component-id*=runnamecellrenderer]').click()")
                await asyncio.sleep(2)
                print("runs:", await p.js("Array.from(document.querySelectorAll('.ag-row a'))"
                                          ".map(a => a.innerText).filter(t => t)"))
                await p.js("document.querySelector('input[value=CHART]').click()")
                await asyncio.sleep(5)
                for metric in ("speedup", "violation_rate_quality"):
                    await p.js(f"{search}.focus(); {search}.select()")
                    await p.send("Input.insertText", text=metric)
                    await asyncio.sleep(4)
                    await p.shot(out / f"score_chart_{metric}.png")
                    print(f"charts for {metric!r}:", await p.js(
                        "document.body.innerText.split('Model metrics')[1]?.split('MLflow Assistant')[0].replace(/\\s+/g, ' ')"))
                await go(f"/experiments/{train_exp}?{ml}")
                await p.shot(out / "train_runs.png")
                print("training runs' datasets:", await p.js(
                    "Array.from(document.querySelectorAll('[data-testid=open-dataset-drawer]')).map(e => e.innerText)"))
    finally:
        proc.terminate()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:5000")
    ap.add_argument("--mlruns", default="mlruns")
    ap.add_argument("--out", default="ui-shots")
    args = ap.parse_args()

    client = mlflow.MlflowClient(tracking_uri(Path(args.mlruns)))
    exps = {e.name: e for e in client.search_experiments()}
    score = exps["modeswitch-score"]
    train = next(e for n, e in exps.items() if n.startswith("modeswitch-train"))
    for e in (score, train):
        print(f"experiment {e.name}: mlflow.experimentKind = {e.tags.get('mlflow.experimentKind')}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args.url.rstrip("/"), score.experiment_id, train.experiment_id, out))


if __name__ == "__main__":
    main()
