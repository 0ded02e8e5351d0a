"""8 x bf16 in one 16-byte register quad (4 x i32), the unit every 16-byte load/store moves.

bf16 -> f32 is exact: the bf16 bits become the high half of the f32. It is written with integer ops
(`v_lshlrev_b32` 16 / `v_and_b32` 0xffff0000) rather than an fpext, so that unpacking a value this kernel just
rounded (fused add: r = bf16(x + residual)) is not turned back into a per-element round trip by LLVM.
f32 -> bf16 rounds to nearest even (NaN stays NaN); on gfx950 this is one `v_cvt_pk_bf16_f32` per pair.
"""

from __future__ import annotations

import flydsl.expr as fx

_INTERLEAVE = [0, 4, 1, 5, 2, 6, 3, 7]


def unpack(v_i32x4):
    """Vector 4 x i32 holding 8 bf16 (element 2k in the low half of word k) -> Vector 8 x f32."""
    lo = v_i32x4 << 16
    hi = v_i32x4 & fx.Int32(-65536)  # 0xffff0000
    return lo.shuffle(hi, _INTERLEAVE).bitcast(fx.Float32)


def pack(v_f32x8):
    """Vector 8 x f32 -> Vector 4 x i32 holding the 8 values rounded to bf16 (RNE)."""
    return v_f32x8.to(fx.BFloat16).bitcast(fx.Int32)


def opaque(v_i32x4):
    """The same 4 x i32, hidden from the optimizer by an empty inline asm (no instruction is emitted).

    Unpacking a register-resident row in two passes would otherwise be CSE'd into one unpack kept alive
    across the reduction: 8 VGPRs per 16-byte vector instead of 4. Re-unpacking costs 2 VALU ops per dword.
    """
    from flydsl._mlir.dialects import llvm

    raw = fx.as_ir_value(v_i32x4)
    return fx.Vector(llvm.inline_asm(raw.type, [raw], "", "=v,0", has_side_effects=False))
