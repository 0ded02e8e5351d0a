"""All-reduce across tensor-parallel ranks, alone and fused with the residual add and RMSNorm (+ MXFP8).

At TP8 each rank holds a partial sum of the same rows (the O projection's or the MoE's share); the
all-reduce adds them so every rank holds the full rows, and vLLM then runs fused_add_rmsnorm on the sum.
These references take the partials of every rank at once: `x` bf16 [ranks, tokens, hidden] stacks them,
x[r] being rank r's. A kernel entry runs on each rank with that rank's partial as its `x` (bf16
[tokens, hidden]) and every rank returns the full result.

Contract (every function below):
- The sum: s = x[0] in fp32, then s = s + x[r] in fp32 for r = 1, 2, ..., ranks-1, in that order (each
  add one fp32 rounding), then rounded once to bf16 (round to nearest even). `allreduce` returns that bf16
  sum. Every rank sums in this same order, so every rank's result is bitwise identical, and the kernels
  reproduce it bitwise (fp32 adds in the same order give the same bits).
- Fused: the bf16 sum goes through references.norm exactly as vLLM's unfused path (all-reduce, then
  fused_add_rmsnorm) does: new residual = bf16(fp32(sum) + fp32(residual)), one rounding; out = RMSNorm of
  that bf16 row (rstd = 1/sqrt(mean(r^2) + eps) in fp32, y = r * rstd * weight in fp32, bf16 once).
- MXFP8: y (fp32, not rounded to bf16) is quantized by references.mx.mxfp8_quantize: E4M3 elements, one
  E8M0 scale per 32 consecutive elements of a row, scales [tokens, hidden/32] uint8.

Tolerance: the all-reduce sum and the new residual are bitwise equal to this reference (the harness asks
for it); the normed bf16 / MXFP8 outputs reach cosine >= 0.99999 (as references.norm: the kernel's order of
the sum of squares may move rstd by an ulp). Every rank's outputs are bitwise equal to every other rank's,
and bitwise deterministic run to run. Each row depends only on its own rows (graph padding rows do not
change real rows).
"""

from __future__ import annotations

import torch

from references import norm
from references.op import Op

RANKS = 8
COSINE_MIN = 0.99999


def _check(x: torch.Tensor) -> None:
    if x.dim() != 3:
        raise ValueError(f"x: expected [ranks, tokens, hidden], got shape {list(x.shape)}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected bfloat16, got {x.dtype}")


def allreduce(x: torch.Tensor) -> tuple[torch.Tensor]:
    """x bf16 [ranks, tokens, h] -> (sum bf16 [tokens, h],), fp32 adds in rank order 0, 1, ..."""
    _check(x)
    acc = x[0].float()
    for r in range(1, x.shape[0]):
        acc = acc + x[r].float()
    return (acc.to(torch.bfloat16),)


def allreduce_fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (out bf16 [tokens, h], new residual bf16 [tokens, h]) = norm.fused_add_rmsnorm(allreduce(x))."""
    (summed,) = allreduce(x)
    return norm.fused_add_rmsnorm(summed, residual, weight, eps)


def allreduce_fused_add_rmsnorm_mxfp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (q float8_e4m3fn [tokens, h], scales uint8 [tokens, h/32], new residual bf16 [tokens, h])."""
    (summed,) = allreduce(x)
    return norm.fused_add_rmsnorm_mxfp8(summed, residual, weight, eps)


def build_inputs(tokens: int, dims: dict, seed: int, *, fused: bool) -> dict:
    """Seeded inputs: the partials of `dims["ranks"]` ranks (default 8), plus residual, weight, eps.

    Each rank's partial ~ N(0, 1/ranks) per element (a row-parallel projection's share: the ranks' shares
    add up to a unit-variance sublayer output), rounded to bf16; residual, weight and eps come from
    references.norm's builder (outlier channels in the residual, weight ~ N(1, 0.25)).
    `dims["only_rank"]` = r: only rank r's partial (x [1, tokens, hidden], equal to x[r] of the full build).
    """
    ranks = int(dims.get("ranks", RANKS))
    hidden = int(dims["hidden"])
    # Each rank's partial has its own generator, so a rank process can build only its own
    # (dims["only_rank"] = r gives x [1, tokens, hidden] = that rank's slice of the full stack).
    only = dims.get("only_rank")
    which = range(ranks) if only is None else (int(only),)
    x = torch.empty(len(which), tokens, hidden, dtype=torch.bfloat16)
    for i, r in enumerate(which):
        gen = torch.Generator().manual_seed(seed * 64 + 7919 + r)
        x[i] = (torch.randn(tokens, hidden, generator=gen) / ranks**0.5).to(torch.bfloat16)
    inputs = {"x": x}
    if fused:
        base = norm.build_inputs(tokens, dims, seed, with_residual=True)
        inputs.update(residual=base["residual"], weight=base["weight"], eps=base["eps"])
    return inputs


def _as_float(outputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in outputs)


OPS = (
    Op(
        "allreduce", allreduce, lambda t, d, s: build_inputs(t, d, s, fused=False),
        _as_float, ("sum",), COSINE_MIN, (),
    ),
    Op(
        "allreduce_fused_add_rmsnorm", allreduce_fused_add_rmsnorm,
        lambda t, d, s: build_inputs(t, d, s, fused=True),
        _as_float, ("out", "residual"), COSINE_MIN, ("residual",),
    ),
    Op(
        "allreduce_fused_add_rmsnorm_mxfp8", allreduce_fused_add_rmsnorm_mxfp8,
        lambda t, d, s: build_inputs(t, d, s, fused=True),
        norm._mx_as_float, ("out", "residual"), COSINE_MIN, ("residual",),
    ),
)
