"""llama.cpp's side of ``bench/engine_vs_llamacpp.py``, run by the llama.cpp venv's Python.

It imports llama-cpp-python only (that venv holds nothing else): one JSON request per
input line, ``{"threads": t, "prompt": [ids], "new": n}``; one JSON answer per line with
the prefill time (the prompt evaluated and the first token sampled), the decode time
of the other ``n - 1`` tokens (greedy; the end of answer does not stop it: generate()
only stops where its caller does) and the tokens made. One
model per thread count stays loaded, so trials interleave with the other engine's.

    .venv-llamacpp/bin/python bench/llamacpp_worker.py MODEL.gguf
"""

from __future__ import annotations

import json
import sys
import time

from llama_cpp import Llama


def main():
    path = sys.argv[1]
    models: dict[int, Llama] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        t, n_ctx = int(job["threads"]), max(2048, int(job.get("n_ctx", 0)))
        if t not in models or models[t].n_ctx() < n_ctx:  # a longer prompt than it was made for
            models[t] = Llama(model_path=path, n_threads=t, n_threads_batch=t, n_ctx=n_ctx,
                              n_batch=512, verbose=False, seed=0)
        llm = models[t]
        prompt, new = list(job["prompt"]), int(job["new"])
        # generate() builds its greedy sampler once and evaluates the prompt on the first
        # step; it reuses the longest prefix of what the context already holds, so the
        # context is emptied first (a trial must not find the one before's prompt cached)
        llm.reset()
        tokens, t1 = [], None
        t0 = time.perf_counter()
        for tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            tokens.append(int(tok))
            if t1 is None:
                t1 = time.perf_counter()
            if len(tokens) == new:
                break
        t2 = time.perf_counter()
        print(json.dumps({"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
