"""Weight quantization for the transformers backend on CPU.

Kernels were chosen by measuring (``bench/quant_kernels.py`` keeps the kernel comparison;
``bench/modes_cpu.py`` the whole modes end to end):

* INT8: ``torch.ao.quantization.quantize_dynamic`` (int8 weights, activations
  quantized per batch on the fly; fbgemm kernels). Not torchao's int8-dynamic path:
  on CPU it ran slower than fp32.
* 4-bit weight-only: round-to-nearest, **symmetric**, group size 128 (GPTQ's usual
  one; 64 or 32 where a layer's width is no multiple of 128, e.g. SmolLM2's 576), run
  by ``torch.ops.aten._weight_int4pack_mm_for_cpu``. Not asymmetric group-32: the
  default model's weights come from a Q4_1 GGUF, which already lies on that grid, so
  re-quantising to it reproduced them exactly and the mode looked free. That kernel takes bf16
  activations: with fp32 activations it takes a path several times slower
  (``bench/quant_kernels.py`` measures both). We cast in and out.
  This is the CPU analogue of GPTQ/AWQ checkpoints, not GPTQ itself: no
  calibration data, no error compensation.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynLinear
from torch.ao.quantization import default_dynamic_qconfig


def _decoder_linears(model) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Linear layers inside the decoder blocks (embeddings and LM head stay fp32)."""
    layers = model.get_decoder().layers if hasattr(model, "get_decoder") else model.model.layers
    out = []
    for parent in layers.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                out.append((parent, name, child))
    return out


def quantize_int8_dynamic(model) -> int:
    """Replace decoder linear layers with dynamic-int8 ones in place; return the count."""
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for parent, name, lin in _decoder_linears(model):
            lin.qconfig = default_dynamic_qconfig
            setattr(parent, name, DynLinear.from_float(lin))
            n += 1
    return n


#: group sizes the int4 kernel takes, the preferred (GPTQ's usual 128) first
INT4_GROUPS = (128, 64, 32)


def int4_group(k: int, preferred: int = 128) -> int:
    """The largest kernel group size <= ``preferred`` that divides ``k``."""
    for g in INT4_GROUPS:
        if g <= preferred and k % g == 0:
            return g
    raise ValueError(f"in_features {k} is not a multiple of any int4 group size {INT4_GROUPS}")


class Int8WeightOnlyLinear(nn.Module):
    """y = x W^T with W stored as int8 per output channel (symmetric, absmax / 127);
    ``aten._weight_int8pack_mm`` dequantises on the fly. Activations go in as bf16: the
    kernel's fp32 path is an order of magnitude slower than its bf16 one
    (``bench/quant_kernels.py``), whose product stays within a fraction of a percent of
    the fp32 one.
    Weight-only int8 is near-lossless in the literature (arXiv 2407.09141), unlike
    dynamic W8A8, which also rounds every activation to 8 bits."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(1) / 127).clamp(min=1e-8)
        self.register_buffer("weight_int8", (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def forward(self, x):
        shape = x.shape
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight_int8,
                                               self.scales).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def quantize_int8_weight_only(model) -> int:
    n = 0
    for parent, name, lin in _decoder_linears(model):
        setattr(parent, name, Int8WeightOnlyLinear(lin))
        n += 1
    return n


class Int4WeightOnlyLinear(nn.Module):
    """y = x W^T with W stored as packed int4 groups (RTN; symmetric as GPTQ's sym=True:
    levels (q - 8) * scale; ``symmetric=False``: asymmetric min-max, the Q4_1 grid)."""

    def __init__(self, linear: nn.Linear, group_size: int = 128, inner_k_tiles: int = 2,
                 symmetric: bool = True):
        super().__init__()
        w = linear.weight.detach().float()
        n_out, k = w.shape
        group_size = int4_group(k, group_size)
        wg = w.reshape(n_out, k // group_size, group_size)
        if symmetric:  # GPTQ's sym=True: zero point 8, scale 2 * absmax / 15
            scale = (2 * wg.abs().amax(-1, keepdim=True) / 15).clamp(min=1e-8)
            q = ((wg / scale).round() + 8).clamp(0, 15)
            zero = torch.zeros_like(scale)  # the kernel computes (q - 8) * scale + zero
        else:
            lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
            scale = ((hi - lo) / 15).clamp(min=1e-8)
            q = ((wg - lo) / scale).round().clamp(0, 15)
            zero = lo + 8 * scale
        self.register_buffer(
            "packed",
            torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                q.reshape(n_out, k).to(torch.int32), inner_k_tiles),
        )
        sz = torch.stack([scale.reshape(n_out, -1).t(), zero.reshape(n_out, -1).t()], -1)
        self.register_buffer("scales_and_zeros", sz.contiguous().to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.group_size, self.in_features, self.out_features = group_size, k, n_out

    def forward(self, x):
        shape = x.shape
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(-1, shape[-1]).to(torch.bfloat16), self.packed, self.group_size,
            self.scales_and_zeros,
        ).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def quantize_int4_weight_only(model, group_size: int = 128, symmetric: bool = True) -> int:
    n = 0
    for parent, name, lin in _decoder_linears(model):
        setattr(parent, name, Int4WeightOnlyLinear(lin, group_size, symmetric=symmetric))
        n += 1
    return n
