"""Building blocks of MX (block-scaled) GEMMs on gfx950: the scaled MFMA and its operand/scale loads.

`v_mfma_scale_f32_16x16x128_f8f6f4` with FP8 (E4M3) on both sides, wave64:
- Operand A (16 rows) and B (16 columns): lane l = 16*g + r (g = l // 16) holds 32 bytes of row/column r:
  K bytes [16g, 16g + 16) of the 128-K step in its first 4 VGPRs ("lo") and [64 + 16g, 64 + 16g + 16) in
  its last 4 ("hi"). This is the arrangement FlyDSL's hardware-checked mxfp4_preshuffle kernel reads for FP8
  operands (two 16-byte halves 64 K apart); the emulator models the same.
- Scales: one VGPR per operand per lane; the byte chosen by op_sel scales row/column r for K block g
  (elements [32g, 32g + 32) of the step). Scales must be VGPRs (SGPR scales read the wrong bits on gfx950).
- D (4 x f32): lane l = 16*g + c holds D[4g + i][c], i = 0..3.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl.expr import rocdl
from flydsl.expr.typing import T

from amd_kernels.common.buffer import _ir

FP8 = 0  # f8f6f4 format code of E4M3 (cbsz / blgp)
STEP_K = 128  # K per MFMA
HALF_K = 64  # K of one 16-byte half across the 4 lane groups


def load_u8(rsrc, byte_offset):
    """`buffer_load_ubyte` -> i32 holding the byte in bits 0..7 (0 when out of range)."""
    raw = rocdl.raw_ptr_buffer_load(T.i8, rsrc, _ir(byte_offset), _ir(0))
    return fx.Int32(fx.Int8(raw).to(fx.Int32)) & 0xFF


def operand(lo, hi):
    """Two 16-byte halves (Vector 4 x i32 each) -> the 8-VGPR FP8 operand of one scaled MFMA."""
    return lo.shuffle(hi, list(range(8)))


def zero_acc():
    return fx.Vector.filled(4, 0.0, fx.Float32)


def mfma_fp8(acc, a, b, scale_a, scale_b):
    """acc + (A * 2^(scale_a byte 0 - 127)) @ (B * 2^(scale_b byte 0 - 127)) for one 16x16x128 step."""
    res = rocdl.mfma_scale_f32_16x16x128_f8f6f4(
        T.f32x4,
        [fx.as_ir_value(a), fx.as_ir_value(b), fx.as_ir_value(acc), FP8, FP8, 0, fx.as_ir_value(scale_a), 0,
         fx.as_ir_value(scale_b)],
    )
    return fx.Vector(res)
