"""Hostile and careless use of `modeswitch serve` and the CLI, rerun as one table.

The hardening issue's cases (bad clients, oversized and invalid requests, tampered
routers, CLI input errors, bad profile files) against the real server on the
project's tiny model and the real CLI, each in its own process as a user would run
them. One row per case: what was sent, what came back (HTTP status or exit code),
whether a Python traceback reached the user, and whether the outcome is the one
the server or CLI documents; then the totals the issue's "done when" asks for
(tracebacks shown, 5xx answers, requests left in flight after the disconnects,
the server's peak RSS under load against its memory budget).

    .venv/bin/python bench/hardening_cases.py [--disconnects 50] [--memory-budget-mb 1536]

Takes 3-5 minutes on 2 cores (most of it starting Python processes and the load).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.helpers import CODE_RUNNERS, crafted_skops, free_port, synthetic_table  # noqa: E402

#: the workload families of the training tables the CLI cases and the exported router use
FAMILIES = ("short_prompt_short_output", "batch_pressure")

ROWS: list[tuple[str, str, str, bool, bool, bool]] = []  # group, case, got, traceback, 5xx, as documented


def row(group: str, case: str, got: str, ok: bool, traceback: bool = False, five: bool = False):
    ROWS.append((group, case, got, traceback, five, ok))
    print(f"  {'ok ' if ok else 'BAD'} {group:<8} {case:<58} {got}", flush=True)


# ------------------------------------------------------------------------ the CLI
def cli(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    try:
        p = subprocess.run([sys.executable, "-m", "modeswitch", *args], cwd=cwd, capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:  # e.g. a `serve` that started: not the refusal expected
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        return 124, out + f"\n(still running after {timeout:.0f} s: stopped)"
    return p.returncode, p.stdout + p.stderr


def cli_case(group: str, case: str, args: list[str], cwd: Path, want_exit: int | tuple = 2, must_say: str = "",
             **kw):
    code, out = cli(args, cwd, **kw)
    tb = "Traceback (most recent call last)" in out
    said = must_say.lower() in out.lower()
    lines = [ln.strip() for ln in out.splitlines() if ln.strip() and not set(ln.strip()) <= set("╭╮╰╯─│ ")]
    last = next((ln for ln in reversed(lines) if ln.lower().startswith("error")), lines[-1] if lines else "")
    want = want_exit if isinstance(want_exit, tuple) else (want_exit,)
    row(group, case, f"exit {code}: {last[:90]}", code in want and not tb and said, traceback=tb)


def tables(tmp: Path) -> dict[str, Path]:
    """Training tables and profile files for the CLI cases (the tests' synthetic profile)."""
    import numpy as np
    import pandas as pd

    from tests.helpers import synthetic_profile

    table = synthetic_table(FAMILIES, 30)
    out = {}
    one = table[table["label"] == table["label"].iloc[0]].copy()
    out["one_class"] = tmp / "one_class.parquet"
    one.to_parquet(out["one_class"])
    out["three_rows"] = tmp / "three.parquet"
    table.head(3).to_parquet(out["three_rows"])
    prof = synthetic_profile()
    out["profile"] = tmp / "profile.parquet"
    prof.to_parquet(out["profile"])
    out["no_latency"] = tmp / "no_latency.parquet"
    prof.drop(columns=["latency_ms"]).to_parquet(out["no_latency"])
    out["inf_latency"] = tmp / "inf.parquet"
    prof.assign(latency_ms=np.inf).to_parquet(out["inf_latency"])
    out["twice"] = tmp / "twice.parquet"
    pd.concat([prof, prof]).to_parquet(out["twice"])
    out["string_latency"] = tmp / "string.csv"
    prof.assign(latency_ms="fast").to_csv(out["string_latency"], index=False)
    out["empty"] = tmp / "empty.parquet"
    out["empty"].write_bytes(b"")
    out["binary"] = tmp / "binary.csv"
    out["binary"].write_bytes(os.urandom(4096))
    trials = REPO.parent / "shared" / "reference" / "a100" / "profiles_a100_curated_sweep_trials.csv"
    if trials.exists():
        t = pd.read_csv(trials)
        idx = next(c for c in t.columns if "trial" in c.lower())
        wl = next(c for c in t.columns if "workload" in c.lower())
        out["trials"] = tmp / "trials.csv"
        t.head(20).to_csv(out["trials"], index=False)
        out["fractional_trial"] = tmp / "fractional.csv"
        t.assign(**{idx: t[idx].astype(float) + 0.5}).head(20).to_csv(out["fractional_trial"], index=False)
        out["empty_workload"] = tmp / "empty_workload.csv"
        t2 = t.head(20).copy()
        t2[wl] = t2[wl].astype(object)
        t2.loc[t2.index[0], wl] = ""
        t2.to_csv(out["empty_workload"], index=False)
    return out


def cli_cases(tmp: Path, mlruns: Path, uri: str):
    print("CLI")
    t = tables(tmp)
    for bad in ("models:/nope@champion", "models:/modeswitch-router@nosuchalias", "models:/modeswitch-router/99",
                "models:/", "runs:/deadbeef/model", "garbage::uri"):
        cli_case("cli", f"serve --router {bad}", ["serve", "--router", bad, "--mlruns", str(mlruns)], tmp)
    cli_case("cli", "serve --port 70000", ["serve", "--router", "rule", "--port", "70000"], tmp)
    cli_case("cli", "export --run deadbeef", ["export", "--run", "deadbeef", "--mlruns", str(mlruns)], tmp)
    if "fractional_trial" in t:
        for key in ("fractional_trial", "empty_workload"):
            cli_case("cli", f"import-profiles ({key.replace('_', ' ')})",
                     ["import-profiles", str(t[key]), "-o", str(tmp / f"{key}.parquet")], tmp)
    else:
        row("cli", "import-profiles cases", "skipped: ../shared/reference/a100 absent", True)
    ro = tmp / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    as_root = os.geteuid() == 0  # root writes through a read-only mode bit
    target = Path("/proc/modeswitch-out.parquet") if as_root else ro / "out.parquet"
    cli_case("cli", "requests -o onto a read-only path", ["requests", "--workloads", "batch_pressure", "-n", "4",
                                                          "-o", str(target)], tmp)
    cli_case("cli", "requests -o onto a directory", ["requests", "--workloads", "batch_pressure", "-n", "4",
                                                     "-o", str(tmp)], tmp)
    m2 = tmp / "mlruns-train"
    cli_case("cli", "train lr on a one-class table", ["train", "--data", str(t["one_class"]), "--routers", "lr",
                                                      "--trials", "2", "--split", "random", "--mlruns", str(m2)],
             tmp, want_exit=(0, 2))
    cli_case("cli", "train --split group on 3 rows", ["train", "--data", str(t["three_rows"]), "--routers", "dt",
                                                      "--trials", "2", "--split", "group", "--mlruns", str(m2)],
             tmp)
    half = _half_written_runs(m2)
    row("cli", "train: MLflow runs left RUNNING", f"{half} running", half == 0)
    print("profile files")
    for key in ("no_latency", "inf_latency", "twice", "string_latency", "empty", "binary"):
        cli_case("files", f"validate ({key.replace('_', ' ')})", ["validate", str(t[key])], tmp)
    if "trials" in t:
        cli_case("files", "import-profiles of one file twice",
                 ["import-profiles", str(t["trials"]), str(t["trials"]), "-o", str(tmp / "dup.parquet")], tmp)
    journal = tmp / "torn.parquet.journal.jsonl"
    journal.write_text("")
    code, out = cli(["profile", "--quick", "--modes", "fp16_baseline", "--workloads", "short_prompt_short_output",
                     "--requests", "1", "--trials", "1", "-o", str(tmp / "torn.parquet")], tmp, timeout=600)
    tb = "Traceback (most recent call last)" in out
    row("files", "profile over an empty journal (killed before its header)", f"exit {code}",
        code == 0 and not tb and (tmp / "torn.parquet").exists(), traceback=tb)


def _half_written_runs(mlruns: Path) -> int:
    import mlflow

    db = mlruns / "mlflow.db"
    if not db.exists():
        return 0
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    return sum(r.info.status == "RUNNING" for r in runs)


# --------------------------------------------------------------------- the server
class Server:
    def __init__(self, args: list[str], tmp: Path):
        self.port = free_port()
        self.log = open(tmp / f"serve-{self.port}.log", "w")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen([sys.executable, "-m", "modeswitch", "serve", "--port", str(self.port), *args],
                                     cwd=tmp, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    self.base_mb = self.rss_mb()  # before any engine: they load on first use
                    return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"the server did not start; see {self.log.name}")

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            c.close()

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def in_flight(self, key: str) -> float:
        _, body, _ = self.get("/metrics", headers={"Authorization": f"Bearer {key}"})
        for line in body.decode().splitlines():
            if line.startswith("modeswitch_in_flight "):
                return float(line.split()[1])
        return float("nan")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def openai_shaped(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
        return isinstance(err, dict) and {"message", "type"} <= set(err)
    except (ValueError, KeyError, TypeError):
        return False


def server_cases(tmp: Path, key: str, disconnects: int, budget: float, mlruns: Path, uri: str):
    print("server")
    keyfile = tmp / "key"
    keyfile.write_text(key + "\n")
    srv = Server(["--router", "rule", "--api-key-file", str(keyfile), "--memory-budget-mb", str(budget),
                  "--max-in-flight", "256"], tmp)
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        def post(path, payload, raw: bytes | None = None, headers=None):
            body = raw if raw is not None else json.dumps(payload).encode()
            return srv.request("POST", path, body, {**auth, **(headers or {})})

        def case(name, path, payload, want: int, raw=None, headers=None, says: str = ""):
            t0 = time.perf_counter()
            status, body, _ = post(path, payload, raw, headers)
            took = time.perf_counter() - t0
            shaped = status == 200 or openai_shaped(body)
            said = says.lower() in body.decode(errors="replace").lower()
            row("server", name, f"{status} in {took * 1000:.0f} ms" + ("" if shaped else ", not OpenAI's shape")
                + ("" if said else f", without {says!r}"), status == want and shaped and said, five=status >= 500)

        chat = "/v1/chat/completions"
        msg = [{"role": "user", "content": "hello"}]
        case("a normal chat request", chat, {"model": "modeswitch", "messages": msg, "max_tokens": 4}, 200)
        case("a 200,000-character prompt", "/v1/completions",
             {"model": "modeswitch", "prompt": "word " * 40_000, "max_tokens": 4}, 400)
        case("a 20 MB body", "/v1/completions", None, 413, raw=b'{"prompt": "' + b"a" * 20_000_000 + b'"}')
        case("max_tokens over the server's limit", "/v1/completions",
             {"model": "modeswitch", "prompt": "hello", "max_tokens": 4000}, 400, says="limit")
        case("prompt + max_tokens over the context", "/v1/completions",
             {"model": "modeswitch", "prompt": "x " * 3800, "max_tokens": 1000}, 400, says="context")
        case("a lone surrogate in the prompt", "/v1/completions", None, 400,
             raw=b'{"model": "modeswitch", "prompt": "\\ud800", "max_tokens": 4}')
        for name, extra, want in (("n=2", {"n": 2}, 400), ("temperature=-1", {"temperature": -1}, 400),
                                  ("top_p=7", {"top_p": 7}, 400), ("max_tokens: true", {"max_tokens": True}, 400),
                                  ("unknown model", {"model": "gpt-5"}, 404)):
            case(name, chat, {"model": "modeswitch", "messages": msg, "max_tokens": 4, **extra}, want)
        case("role 'hacker'", chat, {"model": "modeswitch", "messages": [{"role": "hacker", "content": "x"}]}, 400)
        case("an undecodable body", chat, None, 400, raw=b"\xff\xfe{not json")
        case("a JSON array body", chat, None, 400, raw=b"[1, 2, 3]")
        status, body, _ = srv.request("GET", "/v1/nothing-here", headers=auth)
        row("server", "GET an unknown path", f"{status}", status == 404 and openai_shaped(body), five=status >= 500)
        status, body, _ = srv.request("DELETE", chat, headers=auth)
        row("server", "DELETE /v1/chat/completions", f"{status}", status == 405 and openai_shaped(body),
            five=status >= 500)
        for path in ("/docs", "/openapi.json"):
            status, _, _ = srv.get(path)
            row("server", f"GET {path} without the key", f"{status}", status == 401)
        status, _, _ = srv.get("/metrics")  # documented: liveness and metrics stay open to probes
        row("server", "GET /metrics without the key (open to probes)", f"{status}", status == 200)
        status, _, _ = srv.request("POST", chat, json.dumps({"messages": msg}).encode(),
                                   {"Authorization": "Bearer wrong", "Content-Type": "application/json"})
        row("server", "a wrong key", f"{status}", status == 401)
        # clients that hang up: half streamed, half whole, some after the first bytes
        body = lambda stream: json.dumps({"model": "modeswitch", "messages": msg, "max_tokens": 512,  # noqa: E731
                                          "stream": stream}).encode()
        socks = []
        for i in range(disconnects):
            s = socket.create_connection(("127.0.0.1", srv.port))
            b = body(i % 2 == 0)
            s.sendall(f"POST {chat} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n".encode() + b)
            if i % 4 == 0:
                s.recv(64)
            socks.append(s)
        time.sleep(0.5)
        busy = srv.in_flight(key)
        for s in socks:
            s.close()
        t_closed, left = time.time(), None
        while time.time() < t_closed + 60:
            left = srv.in_flight(key)
            if left == 0:
                break
            time.sleep(0.1)
        took = time.time() - t_closed
        # 50 x 512 tokens would take minutes on this model: back to 0 in seconds means
        # the hung-up requests stopped generating
        row("server", f"{disconnects} clients hang up mid-request (max_tokens 512)",
            f"in flight {busy:.0f} before, {left:.0f} {took:.1f} s after", left == 0 and took < 10)
        st, after, _ = post(chat, {"model": "modeswitch", "messages": msg, "max_tokens": 4})
        mode = json.loads(after).get("modeswitch", {}).get("mode", "?") if st == 200 else "-"
        row("server", "the next request after them", f"{st}, routed to {mode}", st == 200, five=st >= 500)
        # load: 200 concurrent requests while RSS is sampled
        peak, stop = [srv.rss_mb()], threading.Event()

        def sample():
            while not stop.is_set():
                peak.append(srv.rss_mb())
                time.sleep(0.2)

        statuses: list[int] = []

        def client(i):
            p = {"model": "modeswitch", "max_tokens": 32,
                 "messages": [{"role": "user", "content": f"def handler_{i}(request):"}]}
            statuses.append(post(chat, p)[0])

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        clients = [threading.Thread(target=client, args=(i,)) for i in range(200)]
        t0 = time.perf_counter()
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        stop.set()
        th.join()
        wall = time.perf_counter() - t0
        counts = {s: statuses.count(s) for s in sorted(set(statuses))}
        row("server", "200 concurrent requests (--max-in-flight 256)", f"{counts} in {wall:.1f} s",
            counts == {200: 200}, five=any(s >= 500 for s in counts))
        top = max(peak)
        health = json.loads(srv.get("/health")[1])
        mem = health.get("engine_memory_mb", {})
        row("server", f"peak RSS under that load vs --memory-budget-mb {budget:.0f}",
            f"{top:,.0f} MB (server before engines {srv.base_mb:,.0f} MB; engines counted "
            + ", ".join(f"{m} {v:,.0f} MB" for m, v in mem.items())
            + f" = {srv.base_mb + sum(mem.values()):,.0f} MB counted; {health.get('unloads', 0)} unloaded)",
            top <= budget)
    finally:
        srv.stop()
    # a tampered router: one byte of the stored router changed
    [stored] = list(mlruns.rglob("router.skops"))
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    cli_case("server", "serve a router whose stored bytes changed", ["serve", "--router", uri, "--mlruns",
                                                                     str(mlruns)], tmp, must_say="recorded at export")


def _rewrite_registered(mlruns: Path, stored: Path, data: bytes) -> None:
    """Replace a registered router's file and rewrite every recorded hash to match, as an
    attacker who can write the store would (the hashes are integrity, not authentication)."""
    import mlflow

    from routers.export import sha256_of
    from routers.training.tracking import tracking_uri

    old = sha256_of(stored)
    stored.write_bytes(data)
    meta = stored.parent / "meta.json"
    meta.write_text(meta.read_text().replace(old, sha256_of(stored)))
    mlflow.set_tracking_uri(tracking_uri(mlruns))
    client = mlflow.MlflowClient()
    for mv in client.search_model_versions("name = 'modeswitch-router'"):
        client.set_model_version_tag(mv.name, mv.version, "router_sha256", sha256_of(stored))
        client.set_model_version_tag(mv.name, mv.version, "meta_sha256", sha256_of(meta))


def loading_cases(tmp: Path):
    """Stored routers crafted to run code or hang the loader, loaded by `serve` through the
    registry with its hashes rewritten to match: each refused by name, nothing run."""
    print("router loading")
    for i, function in enumerate(sorted(CODE_RUNNERS)):
        mlruns, uri = exported_router(tmp / f"payload{i}")
        [stored] = list(mlruns.rglob("router.skops"))
        marker = tmp / f"payload{i}" / "code-ran"
        _rewrite_registered(mlruns, stored, crafted_skops(
            stored.read_bytes(), function, f"open({str(marker)!r}, 'w').write('ran')"))
        for via in (uri, str(stored.parent.parent)):
            code, out = cli(["serve", "--router", via, "--mlruns", str(mlruns)], tmp, timeout=120)
            named = function in out and "Traceback" not in out
            row("loading", f"{function.rsplit('.', 1)[1]} via {'registry' if via == uri else 'folder'}",
                f"exit {code}, named: {named}, code ran: {marker.exists()}",
                code == 2 and named and not marker.exists())
    mlruns, uri = exported_router(tmp / "cyclic")
    [stored] = list(mlruns.rglob("router.skops"))
    import skops.io as sio

    est = sio.load(stored, trusted=sio.get_untrusted_types(file=stored))
    tr = est.pipeline_.named_steps["clf"].tree_
    tr.children_left[int(max(i for i in range(tr.node_count) if tr.children_left[i] >= 0))] = 0
    _rewrite_registered(mlruns, stored, sio.dumps(est))
    from routers.export import load_router

    t0 = time.perf_counter()
    try:
        load_router(uri, str(mlruns))
        got, ok = "loaded", False
    except ValueError as exc:
        got, ok = str(exc)[:70], True
    took = time.perf_counter() - t0
    row("loading", "a decision tree whose children form a cycle", f"{took * 1000:.0f} ms: {got}", ok and took < 1.0)


def exported_router(tmp: Path) -> tuple[Path, str]:
    from routers import get_router
    from routers.export import export_router

    table = synthetic_table(FAMILIES, 30)
    est = get_router("dt").fit(table, table["label"].astype(str))
    mlruns = tmp / "mlruns"
    info = export_router(est, mlruns=str(mlruns), source_run_id="hardening", backend="transformers")
    return mlruns, info["uri"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--disconnects", type=int, default=50)
    ap.add_argument("--memory-budget-mb", type=float, default=1536)
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--only-loading", action="store_true", help="the stored-router cases alone")
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="hardening-") as d:
        tmp = Path(d)
        mlruns, uri = exported_router(tmp)
        loading_cases(tmp)
        if args.only_loading:
            return _summary(t0)
        server_cases(tmp, "k-" + os.urandom(8).hex(), args.disconnects, args.memory_budget_mb, mlruns, uri)
        if not args.skip_cli:
            cli_cases(tmp, mlruns, uri)
        (tmp / "readonly").exists() and (tmp / "readonly").chmod(0o755)
    return _summary(t0)


def _summary(t0: float) -> int:
    bad = [r for r in ROWS if not r[5]]
    print(f"\n{len(ROWS)} cases in {time.time() - t0:.0f} s: {len(ROWS) - len(bad)} as documented, "
          f"{sum(r[3] for r in ROWS)} tracebacks shown, {sum(r[4] for r in ROWS)} answers 5xx")
    for g, c, got, *_ in bad:
        print(f"  not as documented: {g} {c}: {got}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
