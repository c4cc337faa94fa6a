"""Send real questions of different shapes to a running `modeswitch serve` with the
`openai` client; print the mode the router chose for each and the model's answers
(used by `make demo`).

    .venv/bin/python scripts/demo_requests.py [--url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
from rich.console import Console
from rich.table import Table

from modeswitch.dataset.prompt_corpus import load_corpus

SYSTEM = ("You are a helpful assistant for a travel and science quiz. Answer accurately and briefly; "
          "when a question has options, answer with the letter of the correct one. ") * 4
QUESTIONS = ["What is the capital of France?",
             "Name three planets of the solar system.",
             "What is the boiling point of water at sea level in degrees Celsius?",
             "Who wrote the play Romeo and Juliet?",
             "What gas do plants take in from the air to make their food?",
             "What is the largest ocean on Earth?",
             "How many days are there in a leap year?",
             "Which animal is known as the king of the jungle?"]


def benchmark_question(suite: str) -> str:
    """One real question of ``suite`` from the benchmark samples (dataset.prompt_corpus)."""

    return load_corpus().pick((suite,))[0].prompt


def wait_ready(url: str, timeout: float = 180.0):
    base = url.rsplit("/v1", 1)[0]
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"server at {base} not ready after {timeout:.0f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--wait", type=float, default=180.0, help="Seconds to wait for the server to be ready.")
    args = ap.parse_args()
    wait_ready(args.url, args.wait)
    c = openai.OpenAI(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=300)
    rows = []

    def record(label, raw, t0):
        body = raw.parse()
        ms = body.model_extra.get("modeswitch", {})
        usage = body.usage
        rows.append((label, raw.headers.get("x-modeswitch-mode"), raw.headers.get("x-modeswitch-route-us"),
                     f"{(time.perf_counter() - t0) * 1000:.0f}", str(usage.prompt_tokens),
                     str(usage.completion_tokens), ms.get("fallback") or "-"))

    answers = []

    def chat(label, messages, max_tokens):
        t0 = time.perf_counter()
        raw = c.chat.completions.with_raw_response.create(model="modeswitch", max_tokens=max_tokens,
                                                          messages=messages)
        record(label, raw, t0)
        answers.append((label, raw.headers.get("x-modeswitch-mode"), messages[-1]["content"],
                        raw.parse().choices[0].message.content))

    chat("short question", [{"role": "user", "content": QUESTIONS[0]}], 24)
    chat("GSM8K (long answer)", [{"role": "user", "content": benchmark_question("gsm8k")}], 128)
    chat("MMLU-Pro (long prompt)", [{"role": "user", "content": benchmark_question("mmlu_pro")}], 16)
    for i in range(2):
        chat(f"shared system prompt #{i + 1}",
             [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[1 + i]}], 32)
    t0 = time.perf_counter()
    record("completion (no template)", c.completions.with_raw_response.create(
        model="modeswitch", prompt="The three primary colours are", max_tokens=16), t0)

    def one(i):
        t = time.perf_counter()
        q = QUESTIONS[i % len(QUESTIONS)]
        return i, q, t, c.chat.completions.with_raw_response.create(
            model="modeswitch", max_tokens=24, messages=[{"role": "user", "content": q}])

    with ThreadPoolExecutor(8) as ex:
        for i, q, t, raw in ex.map(one, range(8)):
            record(f"burst of 8, #{i + 1}", raw, t)
            if i >= 3:
                answers.append((f"burst #{i + 1}", raw.headers.get("x-modeswitch-mode"), q,
                                raw.parse().choices[0].message.content))
    t0 = time.perf_counter()
    pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="modeswitch", max_tokens=24, stream=True,
        messages=[{"role": "user", "content": QUESTIONS[-1]}])]
    rows.append(("streamed chat", "(see /metrics)", "-", f"{(time.perf_counter() - t0) * 1000:.0f}",
                 "-", str(sum(1 for p in pieces if p)) + " chunks", "-"))
    answers.append(("streamed chat", "-", QUESTIONS[-1], "".join(pieces)))

    table = Table(title="requests through the router (chosen mode per request)")
    for col in ("request", "mode", "route us", "latency ms", "prompt tok", "output tok", "fallback"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    Console(width=140).print(table)
    shown = Table(title="answers (the question's end, the mode it was routed to, the model's answer)")
    for col in ("request", "mode", "question", "answer"):
        shown.add_column(col, overflow="fold")
    for label, mode, q, a in answers:
        shown.add_row(label, mode or "-", ("..." + q[-60:]) if len(q) > 60 else q, " ".join((a or "").split())[:160])
    Console(width=160).print(shown)
    base = args.url.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(base + "/metrics") as r:
        metrics = r.read().decode()
    wanted = ("modeswitch_requests_total{", "modeswitch_routing_seconds_count", "modeswitch_routing_seconds_sum",
              "modeswitch_fallbacks_total{")
    print("\n".join(line for line in metrics.splitlines() if line.startswith(wanted)))


if __name__ == "__main__":
    main()
