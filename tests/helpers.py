"""Shared test helpers: hand-built profile tables (no engine involved) and a loopback
server runner. Test modules and the benches import these from here, never from each
other."""

import socket
import threading
import time

import pandas as pd

REF = "fp16_baseline"

PROV = {
    "backend": "test", "model": "hand-built", "hardware": "none", "run_id": "t",
    "energy_source": "none", "reference_mode": "fp16_baseline",
}


def row(unit, mode, latency, energy=1.0, memory=100.0, trial=0, **extra):
    """One per-trial profile row. Quality evidence by default: ROUGE-L 1.0 against the
    reference-mode output (pass ``rouge_l_vs_baseline=None`` for a mode without any)."""
    extra.setdefault("rouge_l_vs_baseline", 1.0)
    r = {
        "workload": unit, "family": extra.pop("family", "short_prompt_short_output"),
        "mode": mode, "trial": trial, "is_aggregate": False,
        "latency_ms": latency, "energy_per_token_j": energy, "peak_memory_mb": memory,
        "prompt_tokens": extra.pop("prompt_tokens", 128.0),
        "expected_output_tokens": extra.pop("expected_output_tokens", 32.0),
        **PROV,
    }
    r.update(extra)
    return r


def profile(rows) -> pd.DataFrame:
    from modeswitch.dataset.profile_schema import validate_profile

    return validate_profile(pd.DataFrame(rows))


def synthetic_profile():
    """Plain 2x2 grid, a shared-prefix cell and a batch cell, six modes.

    gptq is fastest but fails quality on long outputs; speculation wins on long
    outputs; prefix caching wins on shared prefixes; batching under batch pressure.
    """
    rows = []
    for p in (128, 1024):
        for o in (32, 128):
            u, base = f"p{p}o{o}", 0.4 * p + 20 * o
            kw = dict(prompt_tokens=p, expected_output_tokens=o)
            rows += [row(u, REF, base, rouge_l_vs_baseline=1.0, **kw),
                     row(u, "int8_quant", 0.7 * base, rouge_l_vs_baseline=0.9, **kw),
                     row(u, "gptq_4bit", 0.5 * base, rouge_l_vs_baseline=0.9 if o == 32 else 0.5, **kw),
                     row(u, "speculative_decoding", (0.4 if o == 128 else 1.1) * base,
                         rouge_l_vs_baseline=1.0, **kw)]
    kw = dict(prompt_tokens=1088, expected_output_tokens=64, shared_prefix_tokens=1024,
              family="shared_prefix_chat")
    rows += [row("chat", REF, 1000, rouge_l_vs_baseline=1.0, **kw),
             row("chat", "prefix_caching", 300, rouge_l_vs_baseline=1.0, **kw)]
    kw = dict(prompt_tokens=128, expected_output_tokens=64, concurrent_requests=8, family="batch_pressure")
    rows += [row("batch", REF, 5000, rouge_l_vs_baseline=1.0, **kw),
             row("batch", "int8_plus_continuous_batching", 1500, rouge_l_vs_baseline=0.95, **kw)]
    return profile(rows)


def synthetic_table(families, n: int):
    """A training table: ``n`` requests drawn from each workload family (seed = its
    position) labelled against :func:`synthetic_profile`."""
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle.training_table import build_training_table

    reqs = [r for i, f in enumerate(families) for r in get_workload(f).sample(n, seed=i)]
    return build_training_table(synthetic_profile(), reqs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(app, **uvicorn_kw):
    """Run ``app`` with uvicorn on a free loopback port in a thread; returns (server, thread, port).
    ``uvicorn_kw``: more ``uvicorn.Config`` arguments (the server's connection limits)."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **uvicorn_kw))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 60
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started, "server did not start"
    return srv, th, port


def http(method, url, body=None, headers=None):
    """(status, headers, text) with the standard library (no extra HTTP client needed)."""
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def postgres_bin():
    """The folder of PostgreSQL's server programs (Debian: /usr/lib/postgresql/<v>/bin)."""
    import glob
    import shutil
    from pathlib import Path

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresCluster:
    """A private PostgreSQL cluster on loopback for one test module: initdb in a new
    folder, started on a free port, trust authentication for 127.0.0.1 only, stopped
    and removed afterwards. As root (PostgreSQL refuses root) it runs as the
    ``postgres`` user that Debian's package creates. ``url(db)`` creates ``db`` and
    returns its SQLAlchemy URL."""

    USER = "modeswitch"

    def __init__(self):
        import os
        import tempfile
        from pathlib import Path

        self.bin = postgres_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="modeswitch-pg-"))
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args):
        import subprocess

        subprocess.run([*self.as_user, *map(str, args)], check=True, capture_output=True, text=True)

    def start(self):
        import os
        import shutil

        if self.as_user:
            shutil.chown(self.dir, "postgres", "postgres")
        os.chmod(self.dir, 0o700)
        data = self.dir / "data"
        self._run(self.bin / "initdb", "-D", data, "-A", "trust", "-U", self.USER, "--no-sync",
                  "--no-instructions")
        self._run(self.bin / "pg_ctl", "-D", data, "-l", self.dir / "log", "-w", "-t", "60", "-o",
                  f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off", "start")
        return self

    def url(self, db: str) -> str:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.USER, dbname="postgres",
                             autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{db}"')
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/{db}"

    def stop(self):
        import shutil
        import subprocess

        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m",
                        "immediate", "stop"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def pandas_family_bootstrap(per_request, figures, names, n_boot=1000, seed=0, level=0.95) -> dict:
    """The family-stratified bootstrap as it was before it was vectorised
    (``routers.scoring.intervals.family_bootstrap``): one pandas resample at a time,
    ``figures(family rows) -> {name: value}``. The reference that the vectorised one is
    checked against (tests/test_intervals.py) and timed beside (bench/score_intervals.py),
    with :func:`pandas_live_figures`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    fams = [g.reset_index(drop=True) for _, g in per_request.groupby("family", sort=True)]
    boots = []
    for _ in range(n_boot):
        sample = [f.iloc[rng.integers(0, len(f), len(f))] for f in fams]
        boots.append(pd.DataFrame([figures(f) for f in sample]).mean())
    b = pd.DataFrame(boots)
    lo, hi = (1 - level) / 2, (1 + level) / 2
    out = {}
    for k in names:
        out[f"{k}_low"], out[f"{k}_high"] = float(b[k].quantile(lo)), float(b[k].quantile(hi))
    return out


def pandas_live_figures(g) -> dict:
    """The live scores' family figures as pandas computed them before they were given as
    (numerator, denominator) parts (``routers.scoring.live._family_parts``)."""
    return {
        "speedup": g["reference_latency_ms"].sum() / g["effective_latency_ms"].sum(),
        "energy_ratio": g["energy_ratio"].mean(), "rouge_delta": g["rouge_delta"].mean(),
        "violation_rate_quality": g["violates_quality"].mean(),
        "divergence_rate": g["diverges"].mean(),
        "violation_rate_energy": g["violates_energy"].mean(),
        "violation_rate_any": g["violates_any"].mean(),
        "violation_rate_beyond_noise": g["violates_any_beyond_noise"].mean(),
    }


#: functions that pass a module-prefix allow-list ("numpy.", "sklearn.") and run code when
#: skops calls them from a reduce node: (qualified name, its arguments given the code)
CODE_RUNNERS = {
    "numpy.testing._private.utils.runstring": lambda code: [code, {}],
    "numpy.testing._private.utils.measure": lambda code: [code],
    "sklearn.utils._testing.assert_run_python_script_without_output": lambda code: [code, ".+"],
}


def _skops_value(v):
    """A skops schema node holding the plain value ``v`` (a str or an empty dict)."""
    import json

    if isinstance(v, dict):
        return {"__class__": "dict", "__module__": "builtins", "__loader__": "DictNode", "content": {},
                "key_types": {"__class__": "list", "__module__": "builtins", "__loader__": "ListNode",
                              "content": []}}
    return {"__class__": "str", "__module__": "builtins", "__loader__": "JsonNode",
            "content": json.dumps(v), "is_json": True}


def crafted_skops(data: bytes, function: str, code: str) -> bytes:
    """A stored router (skops bytes holding a fitted scikit-learn tree) rewritten as an
    attacker would: the tree's node becomes a reduce node that calls ``function`` (one of CODE_RUNNERS) with
    ``code`` instead of building the tree."""
    import io
    import json
    import zipfile

    src = zipfile.ZipFile(io.BytesIO(data))
    schema = json.loads(src.read("schema.json"))
    module, _, name = function.rpartition(".")

    def rewrite(node) -> bool:
        if isinstance(node, dict):
            if node.get("__class__") == "Tree" and "__reduce__" in node:
                # skops's LossNode calls the constructor its state names (its TreeNode would not)
                node["__class__"], node["__module__"], node["__loader__"] = name, module, "LossNode"
                node["__reduce__"]["args"]["content"] = [_skops_value(a) for a in CODE_RUNNERS[function](code)]
                return True
            return any(rewrite(v) for v in node.values())
        return isinstance(node, list) and any(rewrite(v) for v in node)

    assert rewrite(schema), "no scikit-learn tree in the stored router"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for item in src.namelist():
            dst.writestr(item, json.dumps(schema) if item == "schema.json" else src.read(item))
    return out.getvalue()


def request_shapes(n: int, seed: int, family: str = "short_prompt_short_output", prompt=(50, 3000),
                   output=(8, 400), prefix: str | None = None) -> pd.DataFrame:
    """``n`` requests' shapes (one family, no prefix, alone), lengths drawn uniformly in
    ``prompt`` and ``output``; ids ``<prefix>-<i>`` (default ``<family>-<seed>``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "id": [f"{prefix or f'{family}-{seed}'}-{i}" for i in range(n)],
        "prompt_tokens": rng.integers(*prompt, n).astype(float),
        "expected_output_tokens": rng.integers(*output, n).astype(float),
        "shared_prefix_tokens": 0.0, "concurrent_requests": 1.0, "memory_pressure": 0.0,
        "family": family, "benchmark_suite": None,
    })
