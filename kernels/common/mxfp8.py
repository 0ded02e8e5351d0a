"""OCP MXFP8 (E4M3 elements, one E8M0 scale per 32 consecutive elements) block quantization.

Rule (same as references/mx.py):
- amax = max |y| over the block (fp32). Its biased fp32 exponent `e` gives floor(log2(amax)) exactly.
- scale byte = clamp(e - 127 - 8 + 127, 0, 254) = max(e - 8, 0): 8 is the exponent of E4M3's largest power of
  two (448 = 1.75 * 2^8). Zero / subnormal amax has e = 0 and so gets byte 0 with no special case; e <= 255
  keeps the byte <= 247, so the upper clamp never binds.
- q = E4M3(y * 2^(127 - byte)), round to nearest even, saturating to +-448. The multiplier is built from bits,
  (254 - byte) << 23, exact for every byte the rule produces. Scaling by the clamped byte (not the unclamped
  exponent) keeps q consistent with what a consumer dequantizes.

NaN (the producers pass nan=True): a NaN element becomes 0x7F; its block's amax bits are the NaN's, exponent
field 255, so the block's byte is 247 and its finite elements scale by 2^-120 (to zero, mostly). +-Inf: byte
247 too, the element saturates to +-448, which dequantizes to +-Inf (448 * 2^120 overflows fp32).

Hardware: gfx950's `v_cvt_pk_fp8_f32` converts to OCP E4M3FN with RNE but does not saturate unless its clamp
bit is set (the LLVM intrinsic leaves it clear): |v| in (464, 512) would round to the NaN code. So every value
is clamped to [-448, 448] first with `v_med3_f32`, after which the conversion cannot overflow.

With one lane holding 8 consecutive elements, a block is 4 consecutive lanes (an aligned DPP quad), so the
block amax is a per-lane max over 8 followed by two quad-permute DPP steps.
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import ReductionOp

from amd_kernels.common.wave import quad_max_i32

BLOCK = 32
E4M3_MAX = 448.0
E4M3_EMAX = 8
ELEMS_PER_LANE = 8
LANES_PER_BLOCK = BLOCK // ELEMS_PER_LANE  # 4: one DPP quad


def abs_bits_max(y_f32x8):
    """Max over the 8 values of |y| as raw fp32 bits (non-negative i32; integer order == float order)."""
    bits = y_f32x8.bitcast(fx.Int32) & 0x7FFFFFFF
    return bits.reduce(ReductionOp.MAX)


def scale_from_amax_bits(amax_bits):
    """(E8M0 byte as i32, fp32 multiplier 2^(127 - byte)) for a block whose |max| has fp32 bits `amax_bits`."""
    biased_exp = amax_bits >> 23
    byte = fx.max(biased_exp - E4M3_EMAX, fx.Int32(0))
    inv_scale = ((fx.Int32(254) - byte) << 23).bitcast(fx.Float32)
    return byte, inv_scale


def block_scale(y_f32x8):
    """Per-lane E8M0 byte and multiplier of the 32-element block this lane's 8 values belong to.

    Every lane of the quad gets the same result. Must be called with all 4 lanes of each quad active.
    """
    return scale_from_amax_bits(quad_max_i32(abs_bits_max(y_f32x8)))


def _f32(v):
    return fx.as_ir_value(v)


def e4m3x8(y_f32x8, inv_scale, nan: bool = False):
    """8 fp32 values * inv_scale -> 8 E4M3 bytes packed little-endian in a Vector of 2 x i32.

    nan=True: a NaN value becomes the E4M3 NaN code 0x7F (`v_med3_f32` would turn it into -448, 0xFE);
    False keeps the code of the kernels that never meet NaN on purpose (their bytes unchanged)."""
    q = y_f32x8 * inv_scale
    f32 = ir.F32Type.get()
    lo = _f32(fx.Float32(-E4M3_MAX))
    hi = _f32(fx.Float32(E4M3_MAX))
    clamped = [rocdl.fmed3(f32, _f32(q[i]), lo, hi) for i in range_constexpr(ELEMS_PER_LANE)]
    if nan:
        qnan = fx.Int32(0x7FC00000).bitcast(fx.Float32)  # + quiet NaN: converts to 0x7F
        for i in range_constexpr(ELEMS_PER_LANE):
            is_nan = (fx.Float32(q[i]).bitcast(fx.Int32) & 0x7FFFFFFF) > 0x7F800000
            clamped[i] = _f32(is_nan.select(qnan, fx.Float32(clamped[i])))
    i32 = ir.IntegerType.get_signless(32)
    words = []
    for w in range_constexpr(ELEMS_PER_LANE // 4):
        c = clamped[4 * w : 4 * w + 4]
        word = rocdl.cvt_pk_fp8_f32(i32, c[0], c[1], fx.Int32(0), False)
        word = rocdl.cvt_pk_fp8_f32(i32, c[2], c[3], word, True)
        words.append(fx.Int32(word))
    return fx.Vector.from_elements(words, fx.Int32)
