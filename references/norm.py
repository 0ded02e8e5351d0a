"""RMSNorm family: rmsnorm, fused residual-add + rmsnorm, and both with the output quantized to MXFP8.

Shared contract (every function below):
- x, residual, weight are bf16; all arithmetic is fp32.
- rstd = 1 / sqrt(mean(r^2) + eps) over the hidden dim, r the (bf16) row being normalized.
- y = r * rstd * weight in fp32.
- Unquantized outputs round y to bf16 once, at the end (round to nearest even).
- MXFP8 outputs quantize fp32 y directly (no bf16 rounding first) with references.mx.mxfp8_quantize:
  E4M3 elements, one E8M0 scale per 32 elements along hidden, scales [tokens, hidden/32] uint8 row-major.
- Fused add: r = bf16(x + residual) (sum in fp32, rounded to bf16 once); the norm reads that bf16 r, and
  r is returned as the new residual.
- Special values follow IEEE fp32 with no flush: a NaN in r makes its row NaN; an Inf makes mean(r^2) Inf,
  rstd 0, so the Inf element becomes NaN and the row's finite elements +-0; subnormal inputs are kept.
  MXFP8 outputs then follow references.mx (NaN -> 0x7F, +-Inf -> +-448 in a block of byte 247). The
  harness checks these (NaN, +-Inf, subnormal rows).

Tolerance: each result's cosine against this reference >= 0.99999 for bf16 outputs and for MXFP8 outputs
compared after dequantization (a different rstd rounding may move an element by one E4M3 step, never
more), the new residual bitwise equal in practice (cosine 1.0 asked), and the kernel bitwise deterministic
run to run. Each row depends only on its own input row: graph padding rows must not change real rows.
"""

from __future__ import annotations

import torch

from references.mx import MX_BLOCK, mxfp8_dequantize, mxfp8_quantize
from references.op import SPECIAL_ROWS, Op, special_rows

COSINE_MIN = 0.99999


def _normalize(r: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rf = r.float()
    rstd = torch.rsqrt(rf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return rf * rstd * weight.float()


def _add(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return (x.float() + residual.float()).to(torch.bfloat16)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor]:
    """x bf16 [tokens, h], weight bf16 [h] -> (out bf16 [tokens, h],)."""
    return (_normalize(x, weight, eps).to(torch.bfloat16),)


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (out bf16 [tokens, h], new residual bf16 [tokens, h]); new residual = bf16(x + residual)."""
    r = _add(x, residual)
    return _normalize(r, weight, eps).to(torch.bfloat16), r


def rmsnorm_mxfp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (q float8_e4m3fn [tokens, h], scales uint8 [tokens, h/32])."""
    return mxfp8_quantize(_normalize(x, weight, eps))


def fused_add_rmsnorm_mxfp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (q float8_e4m3fn [tokens, h], scales uint8 [tokens, h/32], new residual bf16 [tokens, h])."""
    r = _add(x, residual)
    q, scales = mxfp8_quantize(_normalize(r, weight, eps))
    return q, scales, r


def build_inputs(tokens: int, dims: dict, seed: int, *, with_residual: bool) -> dict:
    """Seeded inputs shaped like a decoder's hidden states.

    x ~ N(0, 1) (a sublayer's output); residual ~ N(0, 2^2) with 1% outlier channels at 30x (the residual
    stream of a large model carries a few huge channels); weight ~ N(1, 0.25) (trained norm gains).
    """
    hidden, eps = int(dims["hidden"]), float(dims["eps"])
    if hidden % MX_BLOCK:
        raise ValueError(f"hidden {hidden} is not a multiple of {MX_BLOCK}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    weight = 1.0 + 0.25 * torch.randn(hidden, generator=gen)
    inputs = {"x": x.to(torch.bfloat16)}
    if with_residual:
        outliers = torch.rand(hidden, generator=gen) < 0.01
        gain = torch.where(outliers, 30.0, 1.0)
        inputs["residual"] = (2.0 * torch.randn(tokens, hidden, generator=gen) * gain).to(torch.bfloat16)
    inputs["weight"] = weight.to(torch.bfloat16)
    inputs["eps"] = eps
    return inputs


def build_wide_inputs(tokens: int, dims: dict, seed: int, *, with_residual: bool) -> dict:
    """Inputs whose sum of squares exposes the fp32 summation order: small values (~2^-4) with every 97th
    channel at ~2^8, so the small terms' bits survive or not depending on the grouping. Used only to check
    batch invariance."""
    inputs = build_inputs(tokens, dims, seed, with_residual=with_residual)
    x = inputs["x"].float() * 2.0**-4
    x[:, ::97] *= 2.0**12
    inputs["x"] = x.to(torch.bfloat16)
    return inputs


def build_special_inputs(tokens: int, dims: dict, seed: int, *, with_residual: bool) -> dict:
    """build_inputs with NaN, +-Inf and subnormals planted in x (references.op.special_rows)."""
    inputs = build_inputs(max(tokens, SPECIAL_ROWS), dims, seed, with_residual=with_residual)
    inputs["x"] = special_rows(inputs["x"], seed)
    return inputs


def _as_float(outputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in outputs)


def _mx_as_float(outputs) -> tuple[torch.Tensor, ...]:
    q, scales, *rest = outputs
    return (mxfp8_dequantize(q, scales), *(t.float() for t in rest))


OPS = (
    Op(
        "rmsnorm", rmsnorm, lambda t, d, s: build_inputs(t, d, s, with_residual=False),
        _as_float, ("out",), COSINE_MIN, ("x",),
        build_cancelling=lambda t, d, s: build_wide_inputs(t, d, s, with_residual=False),
        build_special=lambda t, d, s: build_special_inputs(t, d, s, with_residual=False),
        rows_independent=True,
    ),
    Op(
        "fused_add_rmsnorm", fused_add_rmsnorm, lambda t, d, s: build_inputs(t, d, s, with_residual=True),
        _as_float, ("out", "residual"), COSINE_MIN, ("x", "residual"),
        build_cancelling=lambda t, d, s: build_wide_inputs(t, d, s, with_residual=True),
        build_special=lambda t, d, s: build_special_inputs(t, d, s, with_residual=True),
        rows_independent=True,
    ),
    Op(
        "rmsnorm_mxfp8", rmsnorm_mxfp8, lambda t, d, s: build_inputs(t, d, s, with_residual=False),
        _mx_as_float, ("out",), COSINE_MIN, ("x",),
        build_cancelling=lambda t, d, s: build_wide_inputs(t, d, s, with_residual=False),
        build_special=lambda t, d, s: build_special_inputs(t, d, s, with_residual=False),
        rows_independent=True,
    ),
    Op(
        "fused_add_rmsnorm_mxfp8", fused_add_rmsnorm_mxfp8,
        lambda t, d, s: build_inputs(t, d, s, with_residual=True),
        _mx_as_float, ("out", "residual"), COSINE_MIN, ("x", "residual"),
        build_cancelling=lambda t, d, s: build_wide_inputs(t, d, s, with_residual=True),
        build_special=lambda t, d, s: build_special_inputs(t, d, s, with_residual=True),
        rows_independent=True,
    ),
)
