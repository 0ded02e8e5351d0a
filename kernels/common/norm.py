"""Row statistics shared by RMS-style norms: fp32 sum of squares of packed bf16 and the reciprocal RMS."""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import ReductionOp

from amd_kernels.common import bf16


def sum_squares_bf16(vecs):
    """Per-lane fp32 sum of x^2 over a list of Vector 4 x i32 each holding 8 bf16."""
    part = fx.Float32(0.0)
    for j in range_constexpr(len(vecs)):
        v = bf16.unpack(vecs[j])
        part = part + (v * v).reduce(ReductionOp.ADD)
    return part


def rsqrt(x):
    """`v_rsq_f32` (1 ulp): one instruction instead of the ~30 of a correctly rounded 1/sqrt."""
    return fx.Float32(rocdl.rsq(ir.F32Type.get(), fx.as_ir_value(x)))


def rstd(sum_sq, n: int, eps):
    """1 / sqrt(sum_sq / n + eps), with 1/n folded into a constant multiply."""
    return rsqrt(sum_sq * (1.0 / n) + eps)
