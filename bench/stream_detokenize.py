"""A stream's detokenizing, per 32-token stream: the window decode against the Rust
incremental one (``tokenizers.decoders.DecodeStream``), which the server uses for fast
tokenizers (``engine.serving.generate._Detokenizer``).

Both run in one process, interleaved in rounds, on the project's tiny model's tokenizer
(or ``--model``) over completions of its own vocabulary; each stream's text is checked
to equal the whole decode, so a faster path that changed the text would fail here.

    .venv/bin/python bench/stream_detokenize.py [--model tiny] [--streams 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

from modeswitch.engine.models.resolve import resolve_models
from modeswitch.engine.serving.generate import _decode_stream, _Detokenizer


class _WindowOnly:
    """The tokenizer seen without its Rust core: the detokenizer's window path."""

    def __init__(self, tok):
        self._t = tok

    def decode(self, ids, skip_special_tokens=True):
        return self._t.decode(ids, skip_special_tokens=skip_special_tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (built if needed) or a checkpoint folder")
    ap.add_argument("--streams", type=int, default=200, help="streams per path and round")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    target, _, _ = resolve_models(args.model, None, None, None, print, modes=())
    tok = AutoTokenizer.from_pretrained(str(target))
    if _decode_stream(tok) is None:
        raise SystemExit(f"{target}: its tokenizer has no Rust incremental decoder here; only the window path runs")
    rng = random.Random(0)
    streams = [[rng.randrange(len(tok)) for _ in range(args.tokens)] for _ in range(args.streams)]
    paths = {"window (2 decodes a token)": _WindowOnly(tok), "DecodeStream (1 step a token)": tok}
    times: dict[str, list[float]] = {p: [] for p in paths}
    for r in range(args.rounds):
        for name, t in (paths.items() if r % 2 == 0 else list(paths.items())[::-1]):
            t0 = time.perf_counter()
            for ids in streams:
                d = _Detokenizer(t)
                out = "".join(d.add([i]) for i in ids) + d.rest()
                if r == 0 and out != tok.decode(ids, skip_special_tokens=True):
                    raise SystemExit(f"{name}: a stream's text differs from the whole decode: {ids}")
            times[name].append((time.perf_counter() - t0) / args.streams * 1e6)
    print(f"{args.streams} streams of {args.tokens} tokens, {args.rounds} interleaved rounds; "
          f"us per stream, median (range)")
    base = statistics.median(times["window (2 decodes a token)"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:<32} {m:8.1f} ({min(ts):.1f}-{max(ts):.1f})  {m / base:5.2f}x")


if __name__ == "__main__":
    main()
