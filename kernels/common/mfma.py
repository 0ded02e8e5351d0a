"""Matrix-core (MFMA) calls for gfx950 wave64 and where each lane's operands and results live.

v_mfma_f32_16x16x32_bf16 (A 16x32, B 32x16, C/D 16x16 fp32):
  lane l holds A[l%16][8*(l/16) + j] and B[8*(l/16) + j][l%16], j = 0..7 (one 16-byte vector each).
  Both operands use the same K order, so a dot product is right whatever that order is.
v_mfma_scale_f32_16x16x128_f8f6f4 (K = 128, E8M0 block scales per 32 along K; `scaled`):
  FP4 operand (4 VGPRs): lane l holds k = 32*(l/16) + t, t = 0..31, low nibble first (16 contiguous bytes).
  FP8 operand (8 VGPRs): lane l = 16*g + r holds k = 16*g + j (bytes 0..15, "lo") and 64 + 16*g + j (16..31,
  "hi") of row (A) / column (B) r: two 16-byte halves 64 K apart (`operand`), as FlyDSL's hardware-checked
  fp8 x fp4 preshuffle GEMM reads them; the emulator models the same.
  Scales: lane l's scale VGPR byte `op_sel` scales row (A) / column (B) l%16 of K-block l/16 (elements
  [32g, 32g + 32) of the step). Scales must be VGPRs (SGPR scales read the wrong bits on gfx950).
C/D (both forms): lane l, register r holds D[4*(l/16) + r][l%16].
v_mfma_f32_32x32x16_bf16 (A 32x16, B 16x32, C/D 32x32 fp32, twice the 16x16x32 work):
  lane l holds A[l%32][8*(l/32) + j] and B[8*(l/32) + j][l%32], j = 0..7; C/D: 16 registers, lane l,
  register r holds D[8*(r/4) + 4*(l/32) + r%4][l%32].
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import rocdl
from flydsl.expr.typing import T

from amd_kernels.common.buffer import _ir

FMT_FP8 = 0  # f8f6f4 format codes (cbsz / blgp): E4M3
FMT_FP4 = 4  # E2M1
STEP_K = 128  # K per scaled MFMA
HALF_K = 64  # K of one 16-byte half of an FP8 operand across the 4 lane groups


def zeros():
    return fx.Vector.filled(4, 0.0, fx.Float32)


def bf16_16x16x32(a_i32x4, b_i32x4, acc):
    """acc += A x B with A, B as 16-byte vectors of 8 bf16 (see the module docstring)."""
    a = fx.as_ir_value(a_i32x4.bitcast(fx.BFloat16))
    b = fx.as_ir_value(b_i32x4.bitcast(fx.BFloat16))
    res = rocdl.mfma_f32_16x16x32_bf16(T.f32x4, [a, b, fx.as_ir_value(acc), 0, 0, 0])
    return fx.Vector(res)


def scaled(a, b, acc, fmt_a: int, fmt_b: int, scale_a, scale_b, sel_a: int = 0, sel_b: int = 0):
    """acc + (A x 2^(sA - 127)) @ (B x 2^(sB - 127)), one 16x16x128 step of operands in formats fmt_a / fmt_b
    (FMT_FP8: 8 VGPRs, FMT_FP4: 4); scale_a / scale_b are i32 VGPRs of 4 E8M0 bytes, byte sel_a / sel_b used
    (the op_sel + op_sel_hi encoding is left to the backend)."""
    res = rocdl.mfma_scale_f32_16x16x128_f8f6f4(
        T.f32x4,
        [fx.as_ir_value(a), fx.as_ir_value(b), fx.as_ir_value(acc), fmt_a, fmt_b, sel_a, fx.as_ir_value(scale_a),
         sel_b, fx.as_ir_value(scale_b)],
    )
    return fx.Vector(res)


def scale_fp8_fp4(a_i32x8, b_i32x4, acc, scale_a, sel_a: int, scale_b, sel_b: int):
    """acc += (A fp8 E4M3 x sA) x (B fp4 E2M1 x sB): `scaled` with the MoE's operand formats."""
    return scaled(a_i32x8, b_i32x4, acc, FMT_FP8, FMT_FP4, scale_a, scale_b, sel_a, sel_b)


def operand(lo, hi):
    """Two 16-byte halves (Vector 4 x i32 each) -> the 8-VGPR FP8 operand of one scaled MFMA."""
    return lo.shuffle(hi, list(range(8)))


def load_u8(rsrc, byte_offset):
    """`buffer_load_ubyte` -> i32 holding the byte in bits 0..7 (0 when out of range): a scale byte."""
    raw = rocdl.raw_ptr_buffer_load(T.i8, rsrc, _ir(byte_offset), _ir(0))
    return fx.Int32(fx.Int8(raw).to(fx.Int32)) & 0xFF


def zeros32():
    return fx.Vector.filled(16, 0.0, fx.Float32)


def bf16_32x32x16(a_i32x4, b_i32x4, acc):
    """acc (16 x f32) += A x B, 32x32x16, A and B as 16-byte vectors of 8 bf16 (see the module docstring)."""
    a = fx.as_ir_value(a_i32x4.bitcast(fx.BFloat16))
    b = fx.as_ir_value(b_i32x4.bitcast(fx.BFloat16))
    res = rocdl.mfma_f32_32x32x16_bf16(T.vec(16, T.f32), [a, b, fx.as_ir_value(acc), 0, 0, 0])
    return fx.Vector(res)
