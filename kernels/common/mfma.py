"""Matrix-core (MFMA) calls for gfx950 wave64 and where each lane's operands and results live.

v_mfma_f32_16x16x32_bf16 (A 16x32, B 32x16, C/D 16x16 fp32):
  lane l holds A[l%16][8*(l/16) + j] and B[8*(l/16) + j][l%16], j = 0..7 (one 16-byte vector each).
  Both operands use the same K order, so a dot product is right whatever that order is.
v_mfma_scale_f32_16x16x128_f8f6f4 (K = 128, E8M0 block scales per 32 along K):
  FP4 operand (4 VGPRs): lane l holds k = 32*(l/16) + t, t = 0..31, low nibble first (16 contiguous bytes).
  FP8 operand (8 VGPRs): lane l holds k = 16*(l/16) + j (bytes 0..15) and 64 + 16*(l/16) + j (16..31):
  two 16-byte halves, as FlyDSL's hardware-checked fp8 x fp4 preshuffle GEMM reads them.
  Scales: lane l's scale VGPR byte `op_sel` scales row (A) / column (B) l%16 of K-block l/16.
C/D (both forms): lane l, register r holds D[4*(l/16) + r][l%16].
v_mfma_f32_32x32x16_bf16 (A 32x16, B 16x32, C/D 32x32 fp32, twice the 16x16x32 work):
  lane l holds A[l%32][8*(l/32) + j] and B[8*(l/32) + j][l%32], j = 0..7; C/D: 16 registers, lane l,
  register r holds D[8*(r/4) + 4*(l/32) + r%4][l%32].
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import rocdl
from flydsl.expr.typing import T

FMT_FP8 = 0  # cbsz / blgp format codes
FMT_FP4 = 4


def zeros():
    return fx.Vector.filled(4, 0.0, fx.Float32)


def bf16_16x16x32(a_i32x4, b_i32x4, acc):
    """acc += A x B with A, B as 16-byte vectors of 8 bf16 (see the module docstring)."""
    a = fx.as_ir_value(a_i32x4.bitcast(fx.BFloat16))
    b = fx.as_ir_value(b_i32x4.bitcast(fx.BFloat16))
    res = rocdl.mfma_f32_16x16x32_bf16(T.f32x4, [a, b, fx.as_ir_value(acc), 0, 0, 0])
    return fx.Vector(res)


def scale_fp8_fp4(a_i32x8, b_i32x4, acc, scale_a, sel_a: int, scale_b, sel_b: int):
    """acc += (A fp8 E4M3 x sA) x (B fp4 E2M1 x sB), 16x16x128; scale_a / scale_b are i32 VGPRs of 4 bytes,
    byte sel_a / sel_b used (op_sel + 2 op_sel_hi encoding is left to the backend)."""
    res = rocdl.mfma_scale_f32_16x16x128_f8f6f4(
        T.f32x4,
        [fx.as_ir_value(a_i32x8), fx.as_ir_value(b_i32x4), fx.as_ir_value(acc), FMT_FP8, FMT_FP4,
         sel_a, fx.as_ir_value(scale_a), sel_b, fx.as_ir_value(scale_b)],
    )
    return fx.Vector(res)


def zeros32():
    return fx.Vector.filled(16, 0.0, fx.Float32)


def bf16_32x32x16(a_i32x4, b_i32x4, acc):
    """acc (16 x f32) += A x B, 32x32x16, A and B as 16-byte vectors of 8 bf16 (see the module docstring)."""
    a = fx.as_ir_value(a_i32x4.bitcast(fx.BFloat16))
    b = fx.as_ir_value(b_i32x4.bitcast(fx.BFloat16))
    res = rocdl.mfma_f32_32x32x16_bf16(T.vec(16, T.f32), [a, b, fx.as_ir_value(acc), 0, 0, 0])
    return fx.Vector(res)
