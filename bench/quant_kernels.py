"""Why the CPU backend's quantization kernels are the ones it uses.

One linear layer, one row of activations (the decode step), in one process:
fp32 ``F.linear``; dynamic int8 (``quantize_dynamic``); 4-bit weight-only
through ``aten._weight_int4pack_mm_for_cpu`` with fp32 activations and with bf16
activations. Weights are cycled through a pool larger than the last-level cache
so each call reads its weights from memory, as a decode step does.

    .venv/bin/python bench/quant_kernels.py
"""

from __future__ import annotations

import time
import warnings

import torch

from modeswitch.engine.backends.quantize import Int4WeightOnlyLinear


def time_cycle(objs, call, x, n=300) -> float:
    """Mean microseconds of ``call(obj, x)`` cycling through ``objs``."""
    for i in range(10):
        call(objs[i % len(objs)], x)
    t = time.perf_counter()
    for i in range(n):
        call(objs[i % len(objs)], x)
    return (time.perf_counter() - t) / n * 1e6


def fp32(lin, x):
    return torch.nn.functional.linear(x, lin.weight)


def module(m, x):
    return m(x)


def int4_fp32_activations(m, x):
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, m.packed, m.group_size,
                                                      m.scales_and_zeros.float())


def main():

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'out x in':>12} {'fp32 us':>9} {'int8 dyn':>16} {'int4 fp32-act':>18} {'int4 bf16-act':>18}")
    for n_out, k in [(256, 256), (704, 256), (1024, 1024), (2816, 1024), (4096, 4096)]:
        pool = max(1, int(96 * 2**20 // (n_out * k * 4)))  # ~96 MB of fp32 weights
        lins = [torch.nn.Linear(k, n_out, bias=False) for _ in range(pool)]
        q8 = [torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear},
                                                     dtype=torch.qint8) for lin in lins]
        q4 = [Int4WeightOnlyLinear(lin) for lin in lins]
        x = torch.randn(1, k)
        with torch.inference_mode():
            r = {
                "fp32": time_cycle(lins, fp32, x),
                "int8": time_cycle(q8, module, x),
                "int4_fp32": time_cycle(q4, int4_fp32_activations, x, n=50),
                "int4_bf16": time_cycle(q4, module, x),
            }
        base = r["fp32"]
        print(f"{n_out:>5} x {k:<5} {base:9.1f} {r['int8']:9.1f} ({r['int8'] / base:.2f}x) "
              f"{r['int4_fp32']:10.1f} ({r['int4_fp32'] / base:.1f}x) "
              f"{r['int4_bf16']:10.1f} ({r['int4_bf16'] / base:.2f}x)")


if __name__ == "__main__":
    main()
