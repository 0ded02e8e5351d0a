"""8 x bf16 in one 16-byte register quad (4 x i32), the unit every 16-byte load/store moves.

bf16 -> f32 is exact (the bf16 bits become the high half of the f32). f32 -> bf16 rounds to nearest even
with NaN kept NaN; on gfx950 this is one `v_cvt_pk_bf16_f32` per pair.
"""

from __future__ import annotations

import flydsl.expr as fx


def unpack(v_i32x4):
    """Vector 4 x i32 holding 8 bf16 -> Vector 8 x f32."""
    return v_i32x4.bitcast(fx.BFloat16).to(fx.Float32)


def pack(v_f32x8):
    """Vector 8 x f32 -> Vector 4 x i32 holding the 8 values rounded to bf16 (RNE)."""
    return v_f32x8.to(fx.BFloat16).bitcast(fx.Int32)
