"""MXFP8 linear layers: y = dequant(x) @ dequant(w)^T + bias, and the bf16 -> MXFP8 quantization feeding them.

mxfp8_gemm(x, x_scales, w, w_scales, bias) -> (y,)
- x: MXFP8 activations, float8_e4m3fn [tokens, k] row-major, with x_scales uint8 [tokens, k/32] row-major
  (E8M0, one per 32 consecutive elements of a row; the layout references.mx produces).
- w: MXFP8 weights in the checkpoint layout, float8_e4m3fn [n, k] row-major (one output feature per row),
  with w_scales uint8 [n, k/32] row-major (E8M0 per 32 along k). bias: bf16 [n].
- Dequantization is exact (E4M3 value times a power of two), every product of two dequantized elements is
  exact in fp32, and the sum over k is accumulated in fp32 (here: float64, a tighter stand-in; a kernel's
  fp32 accumulation order differs from it only in the last bits). bias is added to the fp32 sum and the
  result is rounded once to bf16 (round to nearest even) - the only rounding point.
- Scale byte 255 (E8M0 NaN) is never produced by references.mx; a NaN anywhere in a row's inputs may make
  that row NaN and must leave every other row unchanged.

mxfp8_quant(x) -> (q, scales)
- x bf16 [tokens, k] -> references.mx.mxfp8_quantize(fp32 x): E4M3 elements (round to nearest even,
  saturating to +-448), one E8M0 scale per 32 elements, scales [tokens, k/32] uint8 row-major.
- Special values as references.mx states: NaN -> 0x7F, +-Inf -> +-448 in a block of byte 247 (dequantizes
  to +-Inf), subnormals kept. The harness checks them (NaN, +-Inf, subnormal rows).

Tolerance: y's cosine against this reference >= 0.99999 (the fp32 sum order moves a bf16 result by at most
one ulp); quantized outputs compared after dequantization, cosine >= 0.99999 (an element may move by one
E4M3 step). Kernels are bitwise deterministic run to run (split-K partial sums are added in a fixed order,
never with floating-point atomics), and each output row depends only on its own input row, so graph
padding rows (garbage) never change real rows. Batch invariant: a row's bits are the same whatever the
token count (every tier of a shape sums K in the same fixed chunks, added in chunk order), checked on
realistic inputs and on build_gemm_cancelling_inputs (huge partial sums that cancel). The switch
AMD_KERNELS_GEMM_BATCH_VARIANT=1 (read at import) gives up batch invariance in the n640_k2880, n2880_k512 and
n2880_k4096 GEMMs for the counters' few percent (each tier then sums K in its own split; see
kernels/gemm/mxfp8_gemm.py); everything else in this contract still holds under it.
"""

from __future__ import annotations

import torch

from references.mx import MX_BLOCK, mxfp8_dequantize, mxfp8_quantize
from references.op import SPECIAL_ROWS, Op, special_rows

COSINE_MIN = 0.99999


def mxfp8_gemm(
    x: torch.Tensor, x_scales: torch.Tensor, w: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor]:
    """x fp8 [tokens, k], x_scales u8 [tokens, k/32], w fp8 [n, k], w_scales u8 [n, k/32], bias bf16 [n]
    -> (y bf16 [tokens, n],); y = bf16(sum_k dequant(x) * dequant(w) + bias), sum in >= fp32."""
    xd = mxfp8_dequantize(x, x_scales).double()
    wd = mxfp8_dequantize(w, w_scales).double()
    return ((xd @ wd.T + bias.double()).float().to(torch.bfloat16),)


def mxfp8_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16 [tokens, k] -> (q float8_e4m3fn [tokens, k], scales uint8 [tokens, k/32])."""
    return mxfp8_quantize(x.float())


def _dims(dims: dict) -> tuple[int, int]:
    k = int(dims.get("k", dims.get("hidden", 0)))
    n = int(dims.get("n", 64))
    if k % MX_BLOCK or k <= 0:
        raise ValueError(f"k {k} is not a positive multiple of {MX_BLOCK}")
    return n, k


def build_gemm_inputs(tokens: int, dims: dict, seed: int) -> dict:
    """Seeded inputs shaped like an attention projection of an MXFP8 checkpoint.

    x = MXFP8(a), a ~ N(0, 1) with 1% outlier channels at 20x (normalized hidden states / attention output);
    w = MXFP8(N(0, 0.02)) (trained projection weights, one output feature per row); bias ~ N(0, 0.1).
    """
    n, k = _dims(dims)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(tokens, k, generator=gen) * torch.where(torch.rand(k, generator=gen) < 0.01, 20.0, 1.0)
    x, x_scales = mxfp8_quantize(a)
    w, w_scales = mxfp8_quantize(0.02 * torch.randn(n, k, generator=gen))
    bias = (0.1 * torch.randn(n, generator=gen)).to(torch.bfloat16)
    return {"x": x, "x_scales": x_scales, "w": w, "w_scales": w_scales, "bias": bias}


def build_gemm_cancelling_inputs(tokens: int, dims: dict, seed: int) -> dict:
    """Inputs whose sums expose the fp32 summation order: the weight's two K halves are equal and x's second
    half is exactly minus its first (|x| ~ 2^16), so every output is a huge sum that cancels down to the
    contribution of one small uncancelled block (x ~ N(0, 1) in the last 32 of K): a different grouping of
    the K sum moves most outputs by many bf16 ulps. Not realistic; used only to check batch invariance."""
    n, k = _dims(dims)
    if k % (2 * MX_BLOCK):
        raise ValueError(f"k {k} is not a multiple of {2 * MX_BLOCK}")
    gen = torch.Generator().manual_seed(seed)
    half = k // 2
    big = torch.randn(tokens, half, generator=gen) * 2.0**16
    a = torch.cat([big, -big], dim=1)
    a[:, half - MX_BLOCK: half] = 0  # (the partner of the uncancelled block)
    a[:, -MX_BLOCK:] = torch.randn(tokens, MX_BLOCK, generator=gen)
    x, x_scales = mxfp8_quantize(a)
    wh = 0.02 * torch.randn(n, half, generator=gen)
    w, w_scales = mxfp8_quantize(torch.cat([wh, wh], dim=1))
    bias = (0.1 * torch.randn(n, generator=gen)).to(torch.bfloat16)
    return {"x": x, "x_scales": x_scales, "w": w, "w_scales": w_scales, "bias": bias}


def build_quant_inputs(tokens: int, dims: dict, seed: int) -> dict:
    """x bf16 [tokens, k] ~ N(0, 1) with 1% outlier channels at 20x (an attention output before o_proj)."""
    _, k = _dims(dims)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(tokens, k, generator=gen) * torch.where(torch.rand(k, generator=gen) < 0.01, 20.0, 1.0)
    return {"x": a.to(torch.bfloat16)}


def build_quant_special_inputs(tokens: int, dims: dict, seed: int) -> dict:
    """build_quant_inputs with NaN, +-Inf and subnormals planted (references.op.special_rows)."""
    x = build_quant_inputs(max(tokens, SPECIAL_ROWS), dims, seed)["x"]
    return {"x": special_rows(x, seed)}


def _gemm_as_float(outputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in outputs)


def _mx_as_float(outputs) -> tuple[torch.Tensor, ...]:
    q, scales = outputs
    return (mxfp8_dequantize(q, scales),)


OPS = (
    Op("mxfp8_gemm", mxfp8_gemm, build_gemm_inputs, _gemm_as_float, ("y",), COSINE_MIN, ("x", "x_scales"),
       build_cancelling=build_gemm_cancelling_inputs, rows_independent=True),
    Op("mxfp8_quant", mxfp8_quant, build_quant_inputs, _mx_as_float, ("out",), COSINE_MIN, ("x",),
       build_special=build_quant_special_inputs, rows_independent=True),
)
