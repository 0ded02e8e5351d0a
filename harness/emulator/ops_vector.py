"""Vector ALU instructions (VOP1/VOP2/VOP3/VOP3P/VOPC, DPP and SDWA forms), lane-vectorised with numpy.

Most opcodes are rows of OPS: (result type, source types, numpy function on typed lane values). The generic
builder handles operand types, op_sel, neg/abs, clamp/omod, DPP and SDWA around them; opcodes with extra
outputs (carries, lane reads, swaps) have their own builders below.
"""

from __future__ import annotations

import re

import numpy as np

from .lanes import SDWA_SEL, dpp_source_lanes, dpp_write_lanes
from .operands import (WIDTH, FLOAT_TYPES, OperandError, bf16_bits_rne, exec_mask, parse_operand, raw_reader,
                       row_of, row_writer, scalar_reader, scalar_writer, store_row, to_bits, typed_reader)
from .state import EXEC_HI, EXEC_LO, FULL, LANES, WAVE, lane_mask, pack_mask

U32, I32, F32, U64, I64, F64 = np.uint32, np.int32, np.float32, np.uint64, np.int64, np.float64
S31 = np.uint32(31)


def _u32(x):
    return np.asarray(x).astype(np.int64).astype(U32) if np.asarray(x).dtype != U32 else x


def _cvt_f_to_i(x, lo, hi, dtype):
    x = np.asarray(x, F64)
    r = np.trunc(np.nan_to_num(x, nan=0.0, posinf=hi, neginf=lo))
    return np.clip(r, lo, hi).astype(np.int64).astype(dtype)


def _ffbh(x):
    x = np.asarray(x, U32)
    n = np.where(x == 0, U32(0xFFFFFFFF), U32(31) - np.floor(np.log2(np.maximum(x, 1).astype(F64))).astype(U32))
    return n.astype(U32)


def _ffbl(x):
    x = np.asarray(x, U32)
    low = x & (~x + U32(1))
    return np.where(x == 0, U32(0xFFFFFFFF), np.floor(np.log2(np.maximum(low, 1).astype(F64))).astype(U32))


def _popc(x):
    x = np.asarray(x, U32)
    return np.unpackbits(np.atleast_1d(x).view(np.uint8).reshape(-1, 4), axis=1).sum(axis=1).astype(U32).reshape(x.shape)


def _bfe(x, off, width, signed):
    off, width = np.asarray(off, U32) & S31, np.asarray(width, U32) & S31
    if signed:
        v = np.asarray(x, U32).view(I32).astype(np.int64)
    else:
        v = np.asarray(x, U32).astype(np.int64)
    r = (v >> off.astype(np.int64)) & ((np.int64(1) << width.astype(np.int64)) - 1)
    if signed:
        sh = (64 - width.astype(np.int64))
        r = np.where(width == 0, 0, (r << sh) >> sh)
    return np.where(width == 0, 0, r).astype(np.int64).astype(U32)


def _alignbit(hi, lo, sh):
    v = (np.asarray(hi, U32).astype(U64) << U64(32)) | np.asarray(lo, U32).astype(U64)
    return ((v >> (np.asarray(sh, U32) & S31).astype(U64)) & U64(0xFFFFFFFF)).astype(U32)


def _med3(a, b, c):
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def _fmed3(a, b, c):
    return np.fmax(np.fmin(a, b), np.fmin(np.fmax(a, b), c))


def _ieee_minmax(a, b, minimum: bool):
    """IEEE 754-2019 minimum/maximum (gfx950 v_minimum3/v_maximum3, LLVM's llvm.minimum/maximum): a NaN
    operand gives a (quiet) NaN, and -0 < +0."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    r = np.minimum(a, b) if minimum else np.maximum(a, b)
    both_zero = (a == 0) & (b == 0)
    neg = (np.signbit(a) | np.signbit(b)) if minimum else (np.signbit(a) & np.signbit(b))
    r = np.where(both_zero, np.where(neg, F32(-0.0), F32(0.0)), r).astype(F32)
    bits = r.view(U32)
    return np.where(np.isnan(r), bits | U32(0x00400000), bits).view(F32)


def _fma32(a, b, c):
    # float64 holds a*b exactly for float32 inputs; the final sum rounds once more (double rounding is
    # off by one ulp only in rare ties).
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def _frexp_mant(x):
    m, _ = np.frexp(x)
    return np.where(np.isfinite(x), m, x).astype(np.asarray(x).dtype)


def _frexp_exp(x):
    _, e = np.frexp(x)
    return np.where(np.isfinite(x), e, 0).astype(I32)


def _class_mask(x, classes):
    x = np.asarray(x)
    f = np.finfo(x.dtype)
    neg = np.signbit(x)
    ax = np.abs(x)
    isnan = np.isnan(x)
    # no signalling/quiet split for float types numpy creates: treat every NaN as quiet (bit 1) and
    # signalling (bit 0) by the quiet bit.
    bits = x.view(U32 if x.dtype == F32 else (np.uint16 if x.dtype == np.float16 else U64))
    quiet_bit = {F32: 1 << 22, np.float16: 1 << 9, F64: 1 << 51}[x.dtype.type]
    quiet = (bits.astype(U64) & U64(quiet_bit)) != 0
    tests = [isnan & ~quiet, isnan & quiet, np.isneginf(x), neg & (ax >= f.tiny) & np.isfinite(x),
             neg & (ax < f.tiny) & (ax > 0), neg & (ax == 0), ~neg & (ax == 0), ~neg & (ax < f.tiny) & (ax > 0),
             ~neg & (ax >= f.tiny) & np.isfinite(x), np.isposinf(x)]
    out = np.zeros(x.shape, bool)
    classes = np.asarray(classes, U32)
    for i, t in enumerate(tests):
        out |= t & (((classes >> U32(i)) & U32(1)) != 0)
    return out


def _bitop3(table):
    def f(a, b, c):
        a, b, c = (np.asarray(v, U32) for v in (a, b, c))
        out = np.zeros(np.broadcast(a, b, c).shape, U32)
        for i in range(8):
            if table >> i & 1:
                out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
        return out
    return f


def _perm(s0, s1, sel):
    s0, s1, sel = (np.broadcast_to(np.asarray(v, U32), (WAVE,)) for v in (s0, s1, sel))
    src = np.stack([(s1 >> U32(8 * i)) & U32(0xFF) for i in range(4)] + [(s0 >> U32(8 * i)) & U32(0xFF) for i in range(4)])
    sign = [((s1 >> U32(15)) & 1) * 0xFF, ((s1 >> U32(31)) & 1) * 0xFF, ((s0 >> U32(15)) & 1) * 0xFF,
            ((s0 >> U32(31)) & 1) * 0xFF]
    out = np.zeros(WAVE, U32)
    for i in range(4):
        b = (sel >> U32(8 * i)) & U32(0xFF)
        v = np.where(b < 8, src[np.minimum(b, 7), np.arange(WAVE)], 0)
        for k in range(4):
            v = np.where(b == 8 + k, sign[k], v)
        v = np.where(b == 12, 0, v)
        v = np.where(b > 12, 0xFF, v)
        out |= v.astype(U32) << U32(8 * i)
    return out


def _f16(x):  # round through half precision (results of f16 ops are computed in f32 then rounded)
    return np.asarray(x, F32)


OPS = {
    # f32
    "v_add_f32": ("f32", ("f32", "f32"), lambda a, b: a + b),
    "v_sub_f32": ("f32", ("f32", "f32"), lambda a, b: a - b),
    "v_subrev_f32": ("f32", ("f32", "f32"), lambda a, b: b - a),
    "v_mul_f32": ("f32", ("f32", "f32"), lambda a, b: a * b),
    "v_mul_legacy_f32": ("f32", ("f32", "f32"), lambda a, b: np.where((a == 0) | (b == 0), F32(0), a * b)),
    "v_max_f32": ("f32", ("f32", "f32"), np.fmax),
    "v_min_f32": ("f32", ("f32", "f32"), np.fmin),
    "v_ldexp_f32": ("f32", ("f32", "i32"), lambda a, b: np.ldexp(a, np.clip(b, -300, 300)).astype(F32)),
    "v_fma_f32": ("f32", ("f32", "f32", "f32"), _fma32),
    "v_mad_f32": ("f32", ("f32", "f32", "f32"), lambda a, b, c: a * b + c),
    "v_max3_f32": ("f32", ("f32", "f32", "f32"), lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_min3_f32": ("f32", ("f32", "f32", "f32"), lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    "v_med3_f32": ("f32", ("f32", "f32", "f32"), _fmed3),
    "v_minimum3_f32": ("f32", ("f32", "f32", "f32"),
                       lambda a, b, c: _ieee_minmax(_ieee_minmax(a, b, True), c, True)),
    "v_maximum3_f32": ("f32", ("f32", "f32", "f32"),
                       lambda a, b, c: _ieee_minmax(_ieee_minmax(a, b, False), c, False)),
    "v_mov_b32": ("b32", ("b32",), lambda a: a),
    "v_not_b32": ("b32", ("b32",), lambda a: ~a),
    "v_bfrev_b32": ("b32", ("b32",), lambda a: np.unpackbits(np.ascontiguousarray(np.broadcast_to(np.asarray(a, U32), (WAVE,))).view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")[:, ::-1].copy().reshape(-1, 4, 8)[:, :, :].reshape(-1, 32).dot(1 << np.arange(31, -1, -1, dtype=np.int64)).astype(U32)),
    "v_ffbh_u32": ("b32", ("b32",), _ffbh),
    "v_ffbl_b32": ("b32", ("b32",), _ffbl),
    "v_ffbh_i32": ("b32", ("b32",), lambda a: np.where((a == 0) | (a == 0xFFFFFFFF), U32(0xFFFFFFFF),
                                                        _ffbh(np.where(a.view(I32) < 0, ~a, a)) - U32(1) + U32(0)).astype(U32)),
    "v_cvt_f32_i32": ("f32", ("i32",), lambda a: a.astype(F32)),
    "v_cvt_f32_u32": ("f32", ("u32",), lambda a: a.astype(F32)),
    "v_cvt_i32_f32": ("i32", ("f32",), lambda a: _cvt_f_to_i(a, -2**31, 2**31 - 1, I32)),
    "v_cvt_u32_f32": ("u32", ("f32",), lambda a: _cvt_f_to_i(a, 0, 2**32 - 1, U32)),
    "v_cvt_rpi_i32_f32": ("i32", ("f32",), lambda a: _cvt_f_to_i(np.floor(np.asarray(a, F64) + 0.5), -2**31, 2**31 - 1, I32)),
    "v_cvt_flr_i32_f32": ("i32", ("f32",), lambda a: _cvt_f_to_i(np.floor(a), -2**31, 2**31 - 1, I32)),
    "v_cvt_f32_f16": ("f32", ("f16",), lambda a: a),
    "v_cvt_f16_f32": ("f16", ("f32",), lambda a: a),
    "v_cvt_f32_bf16": ("f32", ("bf16",), lambda a: a),
    "v_cvt_f32_ubyte0": ("f32", ("u32",), lambda a: (a & U32(0xFF)).astype(F32)),
    "v_cvt_f32_ubyte1": ("f32", ("u32",), lambda a: ((a >> U32(8)) & U32(0xFF)).astype(F32)),
    "v_cvt_f32_ubyte2": ("f32", ("u32",), lambda a: ((a >> U32(16)) & U32(0xFF)).astype(F32)),
    "v_cvt_f32_ubyte3": ("f32", ("u32",), lambda a: (a >> U32(24)).astype(F32)),
    "v_cvt_f64_f32": ("f64", ("f32",), lambda a: a.astype(F64)),
    "v_cvt_f32_f64": ("f32", ("f64",), lambda a: a.astype(F32)),
    "v_cvt_f64_i32": ("f64", ("i32",), lambda a: a.astype(F64)),
    "v_cvt_f64_u32": ("f64", ("u32",), lambda a: a.astype(F64)),
    "v_cvt_i32_f64": ("i32", ("f64",), lambda a: _cvt_f_to_i(a, -2**31, 2**31 - 1, I32)),
    "v_cvt_u32_f64": ("u32", ("f64",), lambda a: _cvt_f_to_i(a, 0, 2**32 - 1, U32)),
    "v_cvt_f16_u16": ("f16", ("u16",), lambda a: a.astype(F32)),
    "v_cvt_f16_i16": ("f16", ("i16",), lambda a: a.astype(F32)),
    "v_cvt_u16_f16": ("u16", ("f16",), lambda a: _cvt_f_to_i(a, 0, 65535, U32)),
    "v_cvt_i16_f16": ("i16", ("f16",), lambda a: _cvt_f_to_i(a, -32768, 32767, I32)),
    "v_fract_f32": ("f32", ("f32",), lambda a: np.where(np.isinf(a), F32(0), a - np.floor(a)).astype(F32)),
    "v_trunc_f32": ("f32", ("f32",), np.trunc),
    "v_ceil_f32": ("f32", ("f32",), np.ceil),
    "v_floor_f32": ("f32", ("f32",), np.floor),
    "v_rndne_f32": ("f32", ("f32",), np.rint),
    "v_exp_f32": ("f32", ("f32",), np.exp2),
    "v_log_f32": ("f32", ("f32",), np.log2),
    "v_rcp_f32": ("f32", ("f32",), lambda a: F32(1) / a),
    "v_rcp_iflag_f32": ("f32", ("f32",), lambda a: F32(1) / a),
    "v_rsq_f32": ("f32", ("f32",), lambda a: (1.0 / np.sqrt(np.asarray(a, F64))).astype(F32)),
    "v_sqrt_f32": ("f32", ("f32",), np.sqrt),
    "v_sin_f32": ("f32", ("f32",), lambda a: np.sin(np.asarray(a, F64) * 2 * np.pi).astype(F32)),
    "v_cos_f32": ("f32", ("f32",), lambda a: np.cos(np.asarray(a, F64) * 2 * np.pi).astype(F32)),
    "v_frexp_mant_f32": ("f32", ("f32",), _frexp_mant),
    "v_frexp_exp_i32_f32": ("i32", ("f32",), _frexp_exp),
    "v_exp_legacy_f32": ("f32", ("f32",), np.exp2),
    "v_log_legacy_f32": ("f32", ("f32",), np.log2),
    # f64
    "v_add_f64": ("f64", ("f64", "f64"), lambda a, b: a + b),
    "v_mul_f64": ("f64", ("f64", "f64"), lambda a, b: a * b),
    "v_max_f64": ("f64", ("f64", "f64"), np.fmax),
    "v_min_f64": ("f64", ("f64", "f64"), np.fmin),
    "v_fma_f64": ("f64", ("f64", "f64", "f64"), lambda a, b, c: a * b + c),
    "v_rcp_f64": ("f64", ("f64",), lambda a: 1.0 / a),
    "v_rsq_f64": ("f64", ("f64",), lambda a: 1.0 / np.sqrt(a)),
    "v_sqrt_f64": ("f64", ("f64",), np.sqrt),
    "v_ldexp_f64": ("f64", ("f64", "i32"), lambda a, b: np.ldexp(a, np.clip(b, -3000, 3000))),
    "v_fract_f64": ("f64", ("f64",), lambda a: a - np.floor(a)),
    "v_trunc_f64": ("f64", ("f64",), np.trunc),
    "v_floor_f64": ("f64", ("f64",), np.floor),
    "v_ceil_f64": ("f64", ("f64",), np.ceil),
    "v_rndne_f64": ("f64", ("f64",), np.rint),
    "v_mov_b64": ("b64", ("b64",), lambda a: a),
    "v_lshlrev_b64": ("b64", ("u32", "b64"), lambda a, b: b << (a & S31 if False else (np.asarray(a, U32) & U32(63)).astype(U64))),
    "v_lshrrev_b64": ("b64", ("u32", "b64"), lambda a, b: b >> (np.asarray(a, U32) & U32(63)).astype(U64)),
    "v_ashrrev_i64": ("i64", ("u32", "i64"), lambda a, b: b >> (np.asarray(a, U32) & U32(63)).astype(I64)),
    "v_lshl_add_u64": ("b64", ("b64", "u32", "b64"), lambda a, b, c: (a << (np.asarray(b, U32) & U32(63)).astype(U64)) + c),
    # f16 (computed in f32, rounded to f16 on write)
    "v_add_f16": ("f16", ("f16", "f16"), lambda a, b: a + b),
    "v_sub_f16": ("f16", ("f16", "f16"), lambda a, b: a - b),
    "v_subrev_f16": ("f16", ("f16", "f16"), lambda a, b: b - a),
    "v_mul_f16": ("f16", ("f16", "f16"), lambda a, b: a * b),
    "v_max_f16": ("f16", ("f16", "f16"), np.fmax),
    "v_min_f16": ("f16", ("f16", "f16"), np.fmin),
    "v_fma_f16": ("f16", ("f16", "f16", "f16"), _fma32),
    "v_mad_f16": ("f16", ("f16", "f16", "f16"), lambda a, b, c: a * b + c),
    "v_rcp_f16": ("f16", ("f16",), lambda a: F32(1) / a),
    "v_sqrt_f16": ("f16", ("f16",), np.sqrt),
    "v_exp_f16": ("f16", ("f16",), np.exp2),
    "v_log_f16": ("f16", ("f16",), np.log2),
    "v_max3_f16": ("f16", ("f16", "f16", "f16"), lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_min3_f16": ("f16", ("f16", "f16", "f16"), lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    "v_med3_f16": ("f16", ("f16", "f16", "f16"), _fmed3),
    "v_ldexp_f16": ("f16", ("f16", "i16"), lambda a, b: np.ldexp(a, np.clip(b, -100, 100)).astype(F32)),
    # 32-bit integer
    "v_add_u32": ("u32", ("u32", "u32"), lambda a, b: a + b),
    "v_sub_u32": ("u32", ("u32", "u32"), lambda a, b: a - b),
    "v_subrev_u32": ("u32", ("u32", "u32"), lambda a, b: b - a),
    "v_add_i32": ("u32", ("u32", "u32"), lambda a, b: a + b),
    "v_sub_i32": ("u32", ("u32", "u32"), lambda a, b: a - b),
    "v_mul_lo_u32": ("u32", ("u32", "u32"), lambda a, b: a * b),
    "v_mul_hi_u32": ("u32", ("u32", "u32"), lambda a, b: ((a.astype(U64) * b.astype(U64)) >> U64(32)).astype(U32)),
    "v_mul_hi_i32": ("i32", ("i32", "i32"), lambda a, b: ((a.astype(I64) * b.astype(I64)) >> I64(32)).astype(I32)),
    "v_mul_u32_u24": ("u32", ("u32", "u32"), lambda a, b: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF))),
    "v_mul_hi_u32_u24": ("u32", ("u32", "u32"), lambda a, b: (((a & U32(0xFFFFFF)).astype(U64) * (b & U32(0xFFFFFF)).astype(U64)) >> U64(32)).astype(U32)),
    "v_mul_i32_i24": ("i32", ("i32", "i32"), lambda a, b: (((a << 8) >> 8).astype(I64) * ((b << 8) >> 8).astype(I64)).astype(I32)),
    "v_mul_hi_i32_i24": ("i32", ("i32", "i32"), lambda a, b: ((((a << 8) >> 8).astype(I64) * ((b << 8) >> 8).astype(I64)) >> 32).astype(I32)),
    "v_and_b32": ("b32", ("b32", "b32"), lambda a, b: a & b),
    "v_or_b32": ("b32", ("b32", "b32"), lambda a, b: a | b),
    "v_xor_b32": ("b32", ("b32", "b32"), lambda a, b: a ^ b),
    "v_xnor_b32": ("b32", ("b32", "b32"), lambda a, b: ~(a ^ b)),
    "v_lshlrev_b32": ("b32", ("u32", "b32"), lambda a, b: b << (a & S31)),
    "v_lshrrev_b32": ("b32", ("u32", "b32"), lambda a, b: b >> (a & S31)),
    "v_ashrrev_i32": ("i32", ("u32", "i32"), lambda a, b: b >> (a & S31).astype(I32)),
    "v_max_u32": ("u32", ("u32", "u32"), np.maximum),
    "v_min_u32": ("u32", ("u32", "u32"), np.minimum),
    "v_max_i32": ("i32", ("i32", "i32"), np.maximum),
    "v_min_i32": ("i32", ("i32", "i32"), np.minimum),
    "v_max3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_i32": ("i32", ("i32", "i32", "i32"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_i32": ("i32", ("i32", "i32", "i32"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_med3_u32": ("u32", ("u32", "u32", "u32"), _med3),
    "v_med3_i32": ("i32", ("i32", "i32", "i32"), _med3),
    "v_bfe_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: _bfe(a, b, c, False)),
    "v_bfe_i32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: _bfe(a, b, c, True)),
    "v_bfi_b32": ("b32", ("b32", "b32", "b32"), lambda a, b, c: (a & b) | (~a & c)),
    "v_bfm_b32": ("b32", ("u32", "u32"), lambda a, b: (((U64(1) << (a & S31).astype(U64)) - U64(1)) << (b & S31).astype(U64)).astype(U32)),
    "v_alignbit_b32": ("b32", ("b32", "b32", "u32"), _alignbit),
    "v_alignbyte_b32": ("b32", ("b32", "b32", "u32"), lambda a, b, c: _alignbit(a, b, (c & U32(3)) * U32(8))),
    "v_lshl_add_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (a << (b & S31)) + c),
    "v_add_lshl_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (a + b) << (c & S31)),
    "v_lshl_or_b32": ("b32", ("b32", "u32", "b32"), lambda a, b, c: (a << (b & S31)) | c),
    "v_and_or_b32": ("b32", ("b32", "b32", "b32"), lambda a, b, c: (a & b) | c),
    "v_or3_b32": ("b32", ("b32", "b32", "b32"), lambda a, b, c: a | b | c),
    "v_xad_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (a ^ b) + c),
    "v_add3_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: a + b + c),
    "v_mad_u32_u24": ("u32", ("u32", "u32", "u32"), lambda a, b, c: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)) + c),
    "v_mad_i32_i24": ("i32", ("i32", "i32", "i32"), lambda a, b, c: (((a << 8) >> 8) * ((b << 8) >> 8) + c).astype(I32)),
    "v_bcnt_u32_b32": ("u32", ("u32", "u32"), lambda a, b: _popc(a) + b),
    "v_sad_u32": ("u32", ("u32", "u32", "u32"), lambda a, b, c: np.where(a > b, a - b, b - a) + c),
    "v_perm_b32": ("b32", ("b32", "b32", "b32"), _perm),
    "v_cvt_pk_bf16_f32": ("b32", ("f32", "f32"), lambda a, b: bf16_bits_rne(a) | (bf16_bits_rne(b) << U32(16))),
    "v_cvt_pkrtz_f16_f32": ("b32", ("f32", "f32"), lambda a, b: _f16_rtz(a) | (_f16_rtz(b) << U32(16))),
    "v_cvt_pk_f16_f32": ("b32", ("f32", "f32"), lambda a, b: to_bits(a, "f16") | (to_bits(b, "f16") << U32(16))),
    "v_pack_b32_f16": ("b32", ("b16", "b16"), lambda a, b: (a & U32(0xFFFF)) | ((b & U32(0xFFFF)) << U32(16))),
    "v_cvt_pk_u16_u32": ("b32", ("u32", "u32"), lambda a, b: np.minimum(a, 0xFFFF).astype(U32) | (np.minimum(b, 0xFFFF).astype(U32) << U32(16))),
    "v_cvt_pk_i16_i32": ("b32", ("i32", "i32"), lambda a, b: (np.clip(a, -32768, 32767).astype(U32) & U32(0xFFFF)) | ((np.clip(b, -32768, 32767).astype(U32) & U32(0xFFFF)) << U32(16))),
    "v_cvt_pknorm_i16_f32": ("b32", ("f32", "f32"), lambda a, b: _pknorm(a, b, True)),
    "v_cvt_pknorm_u16_f32": ("b32", ("f32", "f32"), lambda a, b: _pknorm(a, b, False)),
    # 16-bit integer
    "v_add_u16": ("u16", ("u16", "u16"), lambda a, b: a + b),
    "v_sub_u16": ("u16", ("u16", "u16"), lambda a, b: a - b),
    "v_subrev_u16": ("u16", ("u16", "u16"), lambda a, b: b - a),
    "v_mul_lo_u16": ("u16", ("u16", "u16"), lambda a, b: a * b),
    "v_lshlrev_b16": ("u16", ("u16", "u16"), lambda a, b: b << (a & U32(15))),
    "v_lshrrev_b16": ("u16", ("u16", "u16"), lambda a, b: b >> (a & U32(15))),
    "v_ashrrev_i16": ("i16", ("u16", "i16"), lambda a, b: b >> (a & U32(15)).astype(I32)),
    "v_max_u16": ("u16", ("u16", "u16"), np.maximum),
    "v_min_u16": ("u16", ("u16", "u16"), np.minimum),
    "v_max_i16": ("i16", ("i16", "i16"), np.maximum),
    "v_min_i16": ("i16", ("i16", "i16"), np.minimum),
    "v_mad_u16": ("u16", ("u16", "u16", "u16"), lambda a, b, c: a * b + c),
    "v_mad_i16": ("i16", ("i16", "i16", "i16"), lambda a, b, c: a * b + c),
}


def _f16_rtz(x):
    x = np.asarray(x, F32)
    h = x.astype(np.float16)
    hf = h.astype(F32)
    # round toward zero: step back one half-ulp when RNE rounded away from zero
    away = np.isfinite(x) & (np.abs(hf) > np.abs(x))
    bits = h.view(np.uint16).astype(U32)
    return np.where(away, bits - U32(1), bits).astype(U32) & U32(0xFFFF)


def _pknorm(a, b, signed):
    def one(x):
        if signed:
            return (np.rint(np.clip(np.nan_to_num(x), -1, 1) * 32767).astype(np.int64) & 0xFFFF).astype(U32)
        return np.rint(np.clip(np.nan_to_num(x), 0, 1) * 65535).astype(U32)
    return one(a) | (one(b) << U32(16))


# ---- mnemonic parsing -----------------------------------------------------------------------------

def split_encoding(name: str) -> tuple[str, str]:
    for enc in ("_e32", "_e64", "_dpp", "_sdwa"):
        if name.endswith(enc):
            return name[: -len(enc)], enc[1:]
    return name, ""


def _bits_list(text, n, default):
    if text is None:
        return [default] * n
    vals = [int(x) for x in text.strip("[]").split(",")]
    return vals + [default] * (n - len(vals))


def _omod_clamp(inst, typ):
    clamp = "clamp" in inst.mods
    scale = 1.0
    if "mul" in inst.mods:
        scale = float(inst.mods["mul"])
    if "div" in inst.mods:
        scale = 1.0 / float(inst.mods["div"])
    if (clamp or scale != 1.0) and typ not in FLOAT_TYPES:
        raise OperandError(f"integer clamp/omod not implemented ({inst.text})")
    if not clamp and scale == 1.0:
        return None
    dt = F64 if typ == "f64" else F32

    def post(v):
        v = np.asarray(v, dt)
        if scale != 1.0:
            v = (v * dt(scale)).astype(dt)
        if clamp:
            v = np.where(np.isnan(v), dt(0), np.clip(v, 0, 1)).astype(dt)
        return v
    return post


class Dpp:
    """Source-lane permutation of src0 and the lanes a DPP instruction may write."""

    def __init__(self, mods):
        self.src = dpp_source_lanes(mods)
        self.valid = self.src >= 0
        self.src_clamped = np.where(self.valid, self.src, 0)
        self.writable = dpp_write_lanes(mods)
        self.bound_zero = "bound_ctrl" in mods
        self.fetch_inactive = mods.get("fi", "0") not in ("0",)

    def wrap(self, reader):
        """Reader of src0 as seen through the permutation (raw bits, before typing)."""
        def read(w):
            v = np.broadcast_to(reader(w), (WAVE,))
            out = v[self.src_clamped]
            ok = self._source_ok(w)
            if self.bound_zero:
                out = np.where(ok, out, out.dtype.type(0))
            return out
        return read

    def _source_ok(self, w):
        ok = self.valid
        if not self.fetch_inactive:
            ex = lane_mask(w.s[EXEC_LO] | (w.s[EXEC_HI] << 32))
            ok = ok & ex[self.src_clamped]
        return ok

    def mask(self, w, exec_m):
        m = self.writable if exec_m is None else (self.writable & exec_m)
        if not self.bound_zero:
            m = m & self._source_ok(w)
        return m


def _sdwa_src_sel(inst, i, op):
    key = f"src{i}_sel"
    if key not in inst.mods:
        return None
    shift, bits = SDWA_SEL[inst.mods[key]]
    return (shift, bits, op.sext)


def build_generic(inst, ctx, base, enc):
    typ, stypes, fn = OPS[base]
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    if base in ("v_fmac_f32", "v_mac_f32"):
        pass
    dst, srcs = ops[0], ops[1:]
    if len(srcs) != len(stypes):
        raise OperandError(f"{inst.mnemonic}: expected {len(stypes)} sources, got {len(srcs)}")
    op_sel = _bits_list(inst.mods.get("op_sel"), len(stypes) + 1, 0)
    dpp = Dpp(inst.mods) if enc == "dpp" else None
    readers = []
    for i, (op, t) in enumerate(zip(srcs, stypes)):
        sel = _sdwa_src_sel(inst, i, op) if enc == "sdwa" else None
        if dpp is not None and i == 0:
            raw = dpp.wrap(raw_reader(op, acc, 64 if WIDTH[t] == 64 else 32))
            plain = parse_operand(op.text.lstrip("-").strip("|"))
            plain.kind, plain.index = "v", 0
            readers.append(_typed_from_raw(raw, op, t, hi=bool(op_sel[i])))
        else:
            readers.append(typed_reader(op, t, acc, hi=bool(op_sel[i]) and WIDTH[t] == 16, sel=sel))
    post = _omod_clamp(inst, typ)
    write = _sdwa_writer(inst, dst, typ, acc) if enc == "sdwa" else row_writer(
        dst, typ, acc, hi=bool(op_sel[len(stypes)]) and WIDTH[typ] == 16)
    return _assemble(fn, readers, post, write, dpp)


def _typed_from_raw(raw, op, t, hi=False):
    """typed_reader semantics over an arbitrary raw-bits reader (used for DPP's permuted src0)."""
    class _Fake:
        pass
    from . import operands as O
    fake = O.Operand("v", 0, neg=op.neg, abs=op.abs)
    base = O.typed_reader(fake, t, 0, hi=hi and WIDTH[t] == 16)
    # typed_reader reads w.v[0]; give it an object whose v[0] is the permuted value.

    def read(w):
        f = _Fake()
        f.v = (raw(w),)
        return base(f)
    return read


def _sdwa_writer(inst, dst, typ, acc):
    r = row_of(dst, acc)
    shift, bits = SDWA_SEL[inst.mods.get("dst_sel", "DWORD")]
    unused = inst.mods.get("dst_unused", "UNUSED_PAD")
    fmask = U32(((1 << bits) - 1) << shift) if bits < 32 else U32(0xFFFFFFFF)

    def wr(w, val, mask):
        b = np.broadcast_to(to_bits(val, typ), (WAVE,)).astype(U32)
        if bits < 32:
            b = (b << U32(shift)) & fmask
            if unused == "UNUSED_PRESERVE":
                b = b | (w.v[r] & ~fmask)
            elif unused == "UNUSED_SEXT":
                top = (b >> U32(shift + bits - 1)) & U32(1)
                above = U32((0xFFFFFFFF << (shift + bits)) & 0xFFFFFFFF)
                b = b | np.where(top == 1, above, U32(0))
        store_row(w, r, b, mask)
    return wr


def _assemble(fn, readers, post, write, dpp):
    n = len(readers)
    if dpp is None and post is None:
        if n == 1:
            (r0,) = readers
            return lambda w: write(w, fn(r0(w)), exec_mask(w))
        if n == 2:
            r0, r1 = readers
            return lambda w: write(w, fn(r0(w), r1(w)), exec_mask(w))
        if n == 3:
            r0, r1, r2 = readers
            return lambda w: write(w, fn(r0(w), r1(w), r2(w)), exec_mask(w))

    def h(w):
        v = fn(*[r(w) for r in readers])
        if post is not None:
            v = post(v)
        m = exec_mask(w)
        if dpp is not None:
            m = dpp.mask(w, m)
        write(w, v, m)
    return h


# ---- special VALU builders ------------------------------------------------------------------------

def _mac(inst, ctx, base, enc):
    """v_fmac/v_mac: the destination is also the addend."""
    fma_name = {"v_fmac_f32": "v_fma_f32", "v_mac_f32": "v_mad_f32", "v_fmac_f16": "v_fma_f16",
                "v_mac_f16": "v_mad_f16", "v_fmac_f64": "v_fma_f64"}[base]
    typ, stypes, fn = OPS[fma_name]
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    dpp = Dpp(inst.mods) if enc == "dpp" else None
    r0 = typed_reader(ops[1], typ, acc)
    if dpp is not None:
        r0 = _typed_from_raw(dpp.wrap(raw_reader(ops[1], acc)), ops[1], typ)
    readers = [r0, typed_reader(ops[2], typ, acc), typed_reader(parse_operand(ops[0].text), typ, acc)]
    return _assemble(fn, readers, _omod_clamp(inst, typ), row_writer(ops[0], typ, acc), dpp)


def _literal_mad(inst, ctx, base, enc):
    """v_madmk/madak/fmamk/fmaak: one source is the instruction's literal."""
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    typ = "f16" if base.endswith("f16") else "f32"
    fn = _fma32 if "fma" in base else (lambda a, b, c: a * b + c)
    a, b, c = ops[1], ops[2], ops[3]
    if base.endswith(("mk_f32", "mk_f16")):   # D = S0 * K + S1
        readers = [typed_reader(a, typ, acc), typed_reader(c, typ, acc), typed_reader(b, typ, acc)]
    else:                                      # D = S0 * S1 + K
        readers = [typed_reader(a, typ, acc), typed_reader(b, typ, acc), typed_reader(c, typ, acc)]
    return _assemble(fn, readers, None, row_writer(ops[0], typ, acc), None)


def _carry_op(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    kind = base[2:].replace("_co_u32", "")  # add, addc, sub, subb, subrev, subbrev
    dst, cout = ops[0], ops[1]
    a, b = raw_reader(ops[2], acc), raw_reader(ops[3], acc)
    cin = scalar_reader(ops[4], 64) if len(ops) > 4 else None
    wr = row_writer(dst, "u32", acc)
    cwr = scalar_writer(cout, 64)
    clamp = "clamp" in inst.mods

    def h(w):
        x, y = a(w).astype(np.int64), b(w).astype(np.int64)
        c = 0
        if cin is not None:
            c = ((np.uint64(cin(w)) >> np.arange(WAVE, dtype=np.uint64)) & np.uint64(1)).astype(np.int64)
        if kind in ("subrev", "subbrev"):
            x, y = y, x
        r = x + y + c if kind in ("add", "addc") else x - y - c
        carry = (r > 0xFFFFFFFF) | (r < 0)
        if clamp:
            r = np.clip(r, 0, 0xFFFFFFFF)
        m = exec_mask(w)
        wr(w, r.astype(U32), m)
        carry = np.broadcast_to(carry, (WAVE,))
        cwr(w, pack_mask(carry if m is None else carry & m))
    return h


def _cndmask(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    typ = "f32" if any(o.neg or o.abs for o in ops[1:3]) else "b32"
    if base == "v_cndmask_b16":
        typ = "b16"
    dpp = Dpp(inst.mods) if enc == "dpp" else None
    r0 = typed_reader(ops[1], typ, acc, sel=_sdwa_src_sel(inst, 0, ops[1]) if enc == "sdwa" else None)
    if dpp is not None:
        r0 = _typed_from_raw(dpp.wrap(raw_reader(ops[1], acc)), ops[1], typ)
    r1 = typed_reader(ops[2], typ, acc, sel=_sdwa_src_sel(inst, 1, ops[2]) if enc == "sdwa" else None)
    cond = scalar_reader(ops[3], 64) if len(ops) > 3 else (lambda w: w.s[106] | (w.s[107] << 32))
    write = _sdwa_writer(inst, ops[0], typ, acc) if enc == "sdwa" else row_writer(ops[0], typ, acc)

    def h(w):
        v = np.where(lane_mask(cond(w)), r1(w), r0(w))
        m = exec_mask(w)
        if dpp is not None:
            m = dpp.mask(w, m)
        write(w, v, m)
    return h


def _readlane(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    wr = scalar_writer(ops[0])
    src = raw_reader(ops[1], acc)
    if base == "v_readfirstlane_b32":
        def h(w):
            ex = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
            lane = (ex & -ex).bit_length() - 1 if ex else 0
            wr(w, int(np.broadcast_to(src(w), (WAVE,))[lane]))
        return h
    sel = scalar_reader(ops[2])

    def h(w):
        wr(w, int(np.broadcast_to(src(w), (WAVE,))[sel(w) & 63]))
    return h


def _writelane(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    r = row_of(ops[0], ctx.acc_offset)
    val, sel = scalar_reader(ops[1]), scalar_reader(ops[2])

    def h(w):
        w.v[r, sel(w) & 63] = val(w)
    return h


def _permlane_swap(inst, ctx, base, enc):
    """v_permlane16_swap: odd 16-lane rows of vdst <-> even rows of src0; 32_swap: upper half of vdst <->
    lower half of src0. Both registers are written."""
    ops = [parse_operand(o) for o in inst.operands]
    a, b = row_of(ops[0], ctx.acc_offset), row_of(ops[1], ctx.acc_offset)
    if base == "v_permlane16_swap_b32":
        pairs = [(16, 0), (48, 32)]
        width = 16
    else:
        pairs = [(32, 0)]
        width = 32

    def h(w):
        va, vb = w.v[a], w.v[b]
        for da, sb in pairs:
            tmp = va[da:da + width].copy()
            va[da:da + width] = vb[sb:sb + width]
            vb[sb:sb + width] = tmp
    return h


def _mbcnt(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    a, b = raw_reader(ops[1], acc), raw_reader(ops[2], acc)
    wr = row_writer(ops[0], "u32", acc)
    lanes = np.arange(WAVE)
    if base == "v_mbcnt_lo_u32_b32":
        below = np.where(lanes >= 32, 32, lanes)
    else:
        below = np.clip(lanes - 32, 0, 32)
    below_mask = ((np.uint64(1) << below.astype(np.uint64)) - np.uint64(1)).astype(U64)

    def h(w):
        m = np.asarray(a(w), U32).astype(U64) & below_mask
        wr(w, _popc((m & U64(0xFFFFFFFF)).astype(U32)) + b(w), exec_mask(w))
    return h


def _mad64(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    signed = base == "v_mad_i64_i32"
    a, b = raw_reader(ops[2], acc), raw_reader(ops[3], acc)
    c = raw_reader(ops[4], acc, 64)
    wr = row_writer(ops[0], "b64", acc)
    cwr = scalar_writer(ops[1], 64)

    def h(w):
        if signed:
            p = np.asarray(a(w), U32).view(I32).astype(I64) * np.asarray(b(w), U32).view(I32).astype(I64)
            p = p.view(U64) if p.ndim else np.array(p).view(U64)
        else:
            p = np.asarray(a(w), U32).astype(U64) * np.asarray(b(w), U32).astype(U64)
        cv = np.asarray(c(w), U64)
        r = p + cv
        if signed:
            carry = np.zeros(np.shape(r), bool)
        else:
            carry = r < cv
        m = exec_mask(w)
        wr(w, r, m)
        carry = np.broadcast_to(carry, (WAVE,))
        cwr(w, pack_mask(carry if m is None else carry & m))
    return h


def _div_scale(inst, ctx, base, enc):
    # Simplified: no pre-scaling (exact for operands away from the float range limits); VCC = 0.
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    typ = "f64" if base.endswith("f64") else "f32"
    s0 = typed_reader(ops[2], typ, acc)
    wr, cwr = row_writer(ops[0], typ, acc), scalar_writer(ops[1], 64)

    def h(w):
        wr(w, s0(w), exec_mask(w))
        cwr(w, 0)
    return h


def _div_fmas(inst, ctx, base, enc):
    typ = "f64" if base.endswith("f64") else "f32"
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    r = [typed_reader(o, typ, acc) for o in ops[1:4]]
    wr = row_writer(ops[0], typ, acc)
    fn = _fma32 if typ == "f32" else (lambda a, b, c: a * b + c)

    def h(w):
        wr(w, fn(r[0](w), r[1](w), r[2](w)), exec_mask(w))
    return h


def _div_fixup(inst, ctx, base, enc):
    typ = "f64" if base.endswith("f64") else ("f16" if base.endswith("f16") else "f32")
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    q, den, num = (typed_reader(o, typ, acc) for o in ops[1:4])
    wr = row_writer(ops[0], typ, acc)

    def h(w):
        qv, d, n = q(w), den(w), num(w)
        special = ~np.isfinite(d) | ~np.isfinite(n) | (d == 0)
        exact = (np.asarray(n, F64) / np.asarray(d, F64))
        wr(w, np.where(special, exact, qv), exec_mask(w))
    return h


def _accvgpr(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    src = raw_reader(ops[1], ctx.acc_offset)
    wr = row_writer(ops[0], "b32", ctx.acc_offset)
    return lambda w: wr(w, src(w), exec_mask(w))


def _bitop3_build(inst, ctx, base, enc):
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    table = int(inst.mods.get("bitop3", "0"), 0)
    fn = _bitop3(table)
    if base == "v_bitop3_b16":
        op_sel = _bits_list(inst.mods.get("op_sel"), 4, 0)
        readers = [typed_reader(o, "b16", acc, hi=bool(op_sel[i])) for i, o in enumerate(ops[1:4])]
        return _assemble(fn, readers, None, row_writer(ops[0], "b16", acc, hi=bool(op_sel[3])), None)
    readers = [raw_reader(o, acc) for o in ops[1:4]]
    return _assemble(fn, readers, None, row_writer(ops[0], "b32", acc), None)


# ---- VOPC -----------------------------------------------------------------------------------------

_FCMP = {
    "f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool), "lt": np.less, "eq": np.equal, "le": np.less_equal,
    "gt": np.greater, "lg": lambda a, b: (a < b) | (a > b), "ge": np.greater_equal,
    "o": lambda a, b: ~np.isnan(a) & ~np.isnan(b), "u": lambda a, b: np.isnan(a) | np.isnan(b),
    "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b),
    "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b),
    "tru": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
}
_ICMP = {
    "f": _FCMP["f"], "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater,
    "ne": np.not_equal, "lg": np.not_equal, "ge": np.greater_equal, "t": _FCMP["tru"],
}


def build_vopc(inst, ctx, base, enc):
    m = re.match(r"v_cmp(x?)_(\w+?)_([fiub])(16|32|64)$", base)
    if m is None:
        m2 = re.match(r"v_cmp(x?)_class_f(16|32|64)$", base)
        if m2 is None:
            return None
        op, t = "class", f"f{m2.group(2)}"
        is_x = bool(m2.group(1))
    else:
        is_x, op, t = bool(m.group(1)), m.group(2), m.group(3) + m.group(4)
    acc = ctx.acc_offset
    ops = [parse_operand(o) for o in inst.operands]
    if ops and ops[0].kind == "s" and (len(ops) == 3):
        sdst, srcs = ops[0], ops[1:]
    else:
        sdst, srcs = None, ops
    if t.startswith("b"):
        t = "u" + t[1:]
    if op == "class":
        fn = _class_mask
        readers = [typed_reader(srcs[0], t, acc), typed_reader(srcs[1], "u32", acc)]
    else:
        fn = (_FCMP if t.startswith("f") else _ICMP).get(op)
        if fn is None:
            return None
        sels = [_sdwa_src_sel(inst, i, o) if enc == "sdwa" else None for i, o in enumerate(srcs)]
        readers = [typed_reader(o, t, acc, sel=s) for o, s in zip(srcs, sels)]
    wr = scalar_writer(sdst, 64) if sdst is not None else None
    r0, r1 = readers

    def h(w):
        ex = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
        res = np.broadcast_to(fn(r0(w), r1(w)), (WAVE,))
        bits = pack_mask(res) & ex
        if wr is not None:
            wr(w, bits)
        elif not is_x:
            w.s[106], w.s[107] = bits & 0xFFFFFFFF, bits >> 32
        if is_x:
            w.s[EXEC_LO], w.s[EXEC_HI] = bits & 0xFFFFFFFF, bits >> 32
    return h


# ---- VOP3P (packed) -------------------------------------------------------------------------------

PK16 = {
    "v_pk_add_f16": ("f16", 2, lambda a, b: a + b), "v_pk_mul_f16": ("f16", 2, lambda a, b: a * b),
    "v_pk_fma_f16": ("f16", 3, _fma32), "v_pk_max_f16": ("f16", 2, np.fmax), "v_pk_min_f16": ("f16", 2, np.fmin),
    "v_pk_add_u16": ("u16", 2, lambda a, b: a + b), "v_pk_sub_u16": ("u16", 2, lambda a, b: a - b),
    "v_pk_add_i16": ("i16", 2, lambda a, b: a + b), "v_pk_sub_i16": ("i16", 2, lambda a, b: a - b),
    "v_pk_mul_lo_u16": ("u16", 2, lambda a, b: a * b),
    "v_pk_lshlrev_b16": ("u16", 2, lambda a, b: b << (a & U32(15))),
    "v_pk_lshrrev_b16": ("u16", 2, lambda a, b: b >> (a & U32(15))),
    "v_pk_ashrrev_i16": ("i16", 2, lambda a, b: b >> (a & 15)),
    "v_pk_max_u16": ("u16", 2, np.maximum), "v_pk_min_u16": ("u16", 2, np.minimum),
    "v_pk_max_i16": ("i16", 2, np.maximum), "v_pk_min_i16": ("i16", 2, np.minimum),
    "v_pk_mad_u16": ("u16", 3, lambda a, b, c: a * b + c), "v_pk_mad_i16": ("i16", 3, lambda a, b, c: a * b + c),
}
PK32 = {"v_pk_add_f32": (2, lambda a, b: a + b), "v_pk_mul_f32": (2, lambda a, b: a * b),
        "v_pk_fma_f32": (3, _fma32), "v_pk_mov_b32": (2, None)}


def _half(raw, hi, typ):
    bits = (raw >> U32(16)) if hi else raw
    bits = np.asarray(bits, U32) & U32(0xFFFF)
    if typ == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(F32)
    if typ == "bf16":
        return (bits << U32(16)).view(F32)
    if typ == "i16":
        return ((bits << U32(16)).view(I32) >> 16)
    return bits


def _packed_const_reader(op, typ, acc):
    # Inline constants in packed math supply the same 16-bit value to both halves (UNSURE for op_sel_hi=1).
    if op.kind == "const":
        from .operands import const_bits
        c = const_bits(op, typ if typ in ("f16", "bf16") else "b16")
        val = np.array(c | (c << 16), U32)
        return lambda w: val
    return raw_reader(op, acc)


def build_pk16(inst, ctx, base, enc):
    typ, n, fn = PK16[base]
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    raws = [_packed_const_reader(o, typ, acc) for o in ops[1:1 + n]]
    op_sel = _bits_list(inst.mods.get("op_sel"), n, 0)
    op_sel_hi = _bits_list(inst.mods.get("op_sel_hi"), n, 1)
    neg_lo = _bits_list(inst.mods.get("neg_lo"), n, 0)
    neg_hi = _bits_list(inst.mods.get("neg_hi"), n, 0)
    r = row_of(ops[0], acc)
    clamp = "clamp" in inst.mods

    def h(w):
        vals = [np.asarray(x(w), U32) for x in raws]
        lo = [_half(v, op_sel[i], typ) for i, v in enumerate(vals)]
        hi = [_half(v, op_sel_hi[i], typ) for i, v in enumerate(vals)]
        if typ == "f16":
            lo = [-x if neg_lo[i] else x for i, x in enumerate(lo)]
            hi = [-x if neg_hi[i] else x for i, x in enumerate(hi)]
        rl, rh = fn(*lo), fn(*hi)
        if clamp and typ == "f16":
            rl, rh = np.clip(rl, 0, 1), np.clip(rh, 0, 1)
        bits = to_bits(rl, typ) | (to_bits(rh, typ) << U32(16))
        store_row(w, r, bits, exec_mask(w))
    return h


def build_pk32(inst, ctx, base, enc):
    n, fn = PK32[base]
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    op_sel = _bits_list(inst.mods.get("op_sel"), n, 0)
    op_sel_hi = _bits_list(inst.mods.get("op_sel_hi"), n, 1)
    neg_lo = _bits_list(inst.mods.get("neg_lo"), n, 0)
    neg_hi = _bits_list(inst.mods.get("neg_hi"), n, 0)

    def half_reader(op, which):
        if op.kind == "const":
            from .operands import const_bits
            c = np.array(const_bits(op, "f32"), U32)
            return lambda w: c
        if op.kind in ("v", "a"):
            rr = row_of(op, acc) + which
            return lambda w: w.v[rr]
        i = op.index + which
        return lambda w: np.array(w.s[i], U32)
    lo_r = [half_reader(o, op_sel[i]) for i, o in enumerate(ops[1:1 + n])]
    hi_r = [half_reader(o, op_sel_hi[i]) for i, o in enumerate(ops[1:1 + n])]
    r = row_of(ops[0], acc)

    if fn is None:  # v_pk_mov_b32: D.lo = src0[op_sel[0]], D.hi = src1[op_sel[1]]
        mov_hi = half_reader(ops[2], op_sel[1])

        def h(w):
            m = exec_mask(w)
            lo, hi = lo_r[0](w).copy(), mov_hi(w).copy()
            store_row(w, r, lo, m)
            store_row(w, r + 1, hi, m)
        return h

    def h(w):
        lo = [x(w).view(F32) for x in lo_r]
        hi = [x(w).view(F32) for x in hi_r]
        lo = [-x if neg_lo[i] else x for i, x in enumerate(lo)]
        hi = [-x if neg_hi[i] else x for i, x in enumerate(hi)]
        # compute both halves before writing: the destination pair may alias a source
        rl, rh = np.asarray(fn(*lo), F32).view(U32), np.asarray(fn(*hi), F32).view(U32)
        m = exec_mask(w)
        store_row(w, r, rl, m)
        store_row(w, r + 1, rh, m)
    return h


def build_dot(inst, ctx, base, enc):
    """v_dot2_f32_f16/bf16, v_dot2c_f32_f16/bf16, v_dot2_{i32_i16,u32_u16}, v_dot4/8 integer dots."""
    m = re.match(r"v_dot(\d)c?_([fiu])32_([a-z]+\d+)$", base)
    if not m:
        return None
    k, rtyp, styp = int(m.group(1)), m.group(2), m.group(3)
    ops = [parse_operand(o) for o in inst.operands]
    acc = ctx.acc_offset
    is_c = "dot2c" in base or "dot4c" in base
    a, b = raw_reader(ops[1], acc), raw_reader(ops[2], acc)
    c = raw_reader(ops[0] if is_c else ops[3], acc)
    bits = 32 // k
    wr = row_writer(ops[0], "f32" if rtyp == "f" else "u32", acc)

    def elems(v):
        v = np.asarray(v, U32)
        out = []
        for i in range(k):
            e = (v >> U32(bits * i)) & U32((1 << bits) - 1)
            if styp == "f16":
                out.append(e.astype(np.uint16).view(np.float16).astype(F64))
            elif styp == "bf16":
                out.append((e << U32(16)).view(F32).astype(F64))
            elif styp.startswith("i"):
                out.append(((e.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1))))
            else:
                out.append(e.astype(np.int64))
        return out

    def h(w):
        ea, eb = elems(a(w)), elems(b(w))
        cv = np.asarray(c(w), U32)
        if rtyp == "f":
            s = cv.view(F32).astype(F64) + sum(x * y for x, y in zip(ea, eb))
            wr(w, s.astype(F32), exec_mask(w))
        else:
            base_c = cv.view(I32).astype(np.int64) if rtyp == "i" else cv.astype(np.int64)
            s = base_c + sum(x * y for x, y in zip(ea, eb))
            wr(w, s.astype(np.int64).astype(U32), exec_mask(w))
    return h


SPECIAL = {
    "v_fmac_f32": _mac, "v_mac_f32": _mac, "v_fmac_f16": _mac, "v_mac_f16": _mac, "v_fmac_f64": _mac,
    "v_madmk_f32": _literal_mad, "v_madak_f32": _literal_mad, "v_fmamk_f32": _literal_mad,
    "v_fmaak_f32": _literal_mad, "v_madmk_f16": _literal_mad, "v_madak_f16": _literal_mad,
    "v_add_co_u32": _carry_op, "v_sub_co_u32": _carry_op, "v_subrev_co_u32": _carry_op,
    "v_addc_co_u32": _carry_op, "v_subb_co_u32": _carry_op, "v_subbrev_co_u32": _carry_op,
    "v_cndmask_b32": _cndmask,
    "v_readfirstlane_b32": _readlane, "v_readlane_b32": _readlane, "v_writelane_b32": _writelane,
    "v_permlane16_swap_b32": _permlane_swap, "v_permlane32_swap_b32": _permlane_swap,
    "v_mbcnt_lo_u32_b32": _mbcnt, "v_mbcnt_hi_u32_b32": _mbcnt,
    "v_mad_u64_u32": _mad64, "v_mad_i64_i32": _mad64,
    "v_div_scale_f32": _div_scale, "v_div_scale_f64": _div_scale,
    "v_div_fmas_f32": _div_fmas, "v_div_fmas_f64": _div_fmas,
    "v_div_fixup_f32": _div_fixup, "v_div_fixup_f64": _div_fixup, "v_div_fixup_f16": _div_fixup,
    "v_accvgpr_read_b32": _accvgpr, "v_accvgpr_write_b32": _accvgpr, "v_accvgpr_mov_b32": _accvgpr,
    "v_bitop3_b32": _bitop3_build, "v_bitop3_b16": _bitop3_build,
}


def build_valu(inst, ctx):
    base, enc = split_encoding(inst.mnemonic)
    if base in SPECIAL:
        return SPECIAL[base](inst, ctx, base, enc)
    if base.startswith(("v_cmp_", "v_cmpx_")):
        return build_vopc(inst, ctx, base, enc)
    if base in PK16:
        return build_pk16(inst, ctx, base, enc)
    if base in PK32:
        return build_pk32(inst, ctx, base, enc)
    if base.startswith("v_dot"):
        return build_dot(inst, ctx, base, enc)
    if base in OPS:
        return build_generic(inst, ctx, base, enc)
    if base == "v_nop":
        return lambda w: None
    return None


def known_mnemonics():
    return set(OPS) | set(SPECIAL) | set(PK16) | set(PK32)
