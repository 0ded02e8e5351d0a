"""The semantic tables of the emulator: what each table-driven opcode computes, as data.

Every table maps a name to a Row(result, sources, fn): the result and source operand types and a function
on typed values. The builders in ops_vector / ops_scalar / ops_memory read operands of those types, call fn
and write the result; the instruction's encoding (DPP, SDWA, op_sel, modifiers) is their business, not the
table's. Other spellings of one operation are a rename map (Table aliases), never a second row.

Types: VALU rows use the operand types of operands.typed_reader ("f32", "u16", ...); packed rows (PK16,
PK32) name the type of each 16/32-bit half; scalar rows (SOP1, SOP2) use "b" for the width the mnemonic
names, and their fn takes that width and returns (result, SCC or None); atomic rows take (old, value)
dwords and return the new dword.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .operands import bf16_bits_rne, to_bits
from .state import WAVE

M32, M64 = 0xFFFFFFFF, (1 << 64) - 1


class Row(NamedTuple):
    result: str
    sources: tuple
    fn: Callable | None


class Table(dict):
    """name -> Row, with `aliases` (other spelling -> name) resolved on lookup."""

    def __init__(self, rows, aliases=None):
        super().__init__(rows)
        self.aliases = dict(aliases or {})
        missing = [a for a, n in self.aliases.items() if n not in rows]
        assert not missing, f"aliases of unknown rows: {missing}"

    def canonical(self, name):
        return self.aliases.get(name, name)

    def __getitem__(self, name):
        return dict.__getitem__(self, self.aliases.get(name, name))

    def __contains__(self, name):
        return dict.__contains__(self, self.aliases.get(name, name))

    def get(self, name, default=None):
        return dict.get(self, self.aliases.get(name, name), default)

    def names(self):
        return set(self) | set(self.aliases)


# ---- vector ALU -----------------------------------------------------------------------------------

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


def _bfrev(a):
    """Bit i of the result is bit 31 - i of a. Any shape of at least one wave's lanes (lockstep: (waves, 64))."""
    a = np.asarray(a, U32)
    words = np.ascontiguousarray(np.broadcast_to(a, np.broadcast_shapes(a.shape, (WAVE,))))
    bits = np.unpackbits(words.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")  # column i = bit i
    return bits[:, ::-1].dot(1 << np.arange(32, dtype=np.int64)).astype(U32).reshape(words.shape)


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
    """v_perm_b32: result byte i is picked by byte i of sel from a table of 14: 0-3 the bytes of s1, 4-7 those
    of s0, 8-11 the sign bits 15 and 31 of s1, then of s0, as 0x00 / 0xFF, 12 0x00, 13 and up 0xFF. Any shape
    of at least one wave's lanes (lockstep: (waves, 64))."""
    s0, s1, sel = (np.asarray(v, U32) for v in (s0, s1, sel))
    shape = np.broadcast_shapes(s0.shape, s1.shape, sel.shape, (WAVE,))
    table = np.zeros(shape + (14,), np.uint8)
    for src, first in ((s1, 0), (s0, 4)):
        src = np.ascontiguousarray(np.broadcast_to(src, shape))
        table[..., first: first + 4] = src.view(np.uint8).reshape(shape + (4,))     # little-endian: byte 0 first
        table[..., 8 + first // 2] = ((src >> U32(15)) & U32(1)) * U32(0xFF)
        table[..., 9 + first // 2] = (src >> U32(31)) * U32(0xFF)
    table[..., 13] = 0xFF
    pick = np.minimum(np.ascontiguousarray(np.broadcast_to(sel, shape)).view(np.uint8).reshape(shape + (4,)), 13)
    return np.ascontiguousarray(np.take_along_axis(table, pick.astype(np.intp), axis=-1)).view(U32).reshape(shape)


def _f16(x):  # round through half precision (results of f16 ops are computed in f32 then rounded)
    return np.asarray(x, F32)


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


OPS = Table({
    # f32
    "v_add_f32": Row("f32", ("f32", "f32"), lambda a, b: a + b),
    "v_sub_f32": Row("f32", ("f32", "f32"), lambda a, b: a - b),
    "v_subrev_f32": Row("f32", ("f32", "f32"), lambda a, b: b - a),
    "v_mul_f32": Row("f32", ("f32", "f32"), lambda a, b: a * b),
    "v_mul_legacy_f32": Row("f32", ("f32", "f32"), lambda a, b: np.where((a == 0) | (b == 0), F32(0), a * b)),
    "v_max_f32": Row("f32", ("f32", "f32"), np.fmax),
    "v_min_f32": Row("f32", ("f32", "f32"), np.fmin),
    "v_ldexp_f32": Row("f32", ("f32", "i32"), lambda a, b: np.ldexp(a, np.clip(b, -300, 300)).astype(F32)),
    "v_fma_f32": Row("f32", ("f32", "f32", "f32"), _fma32),
    "v_mad_f32": Row("f32", ("f32", "f32", "f32"), lambda a, b, c: a * b + c),
    "v_max3_f32": Row("f32", ("f32", "f32", "f32"), lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_min3_f32": Row("f32", ("f32", "f32", "f32"), lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    "v_med3_f32": Row("f32", ("f32", "f32", "f32"), _fmed3),
    "v_minimum3_f32": Row("f32", ("f32", "f32", "f32"),
                       lambda a, b, c: _ieee_minmax(_ieee_minmax(a, b, True), c, True)),
    "v_maximum3_f32": Row("f32", ("f32", "f32", "f32"),
                       lambda a, b, c: _ieee_minmax(_ieee_minmax(a, b, False), c, False)),
    "v_mov_b32": Row("b32", ("b32",), lambda a: a),
    "v_not_b32": Row("b32", ("b32",), lambda a: ~a),
    "v_bfrev_b32": Row("b32", ("b32",), _bfrev),
    "v_ffbh_u32": Row("b32", ("b32",), _ffbh),
    "v_ffbl_b32": Row("b32", ("b32",), _ffbl),
    "v_ffbh_i32": Row("b32", ("b32",), lambda a: np.where((a == 0) | (a == 0xFFFFFFFF), U32(0xFFFFFFFF),
                                                        _ffbh(np.where(a.view(I32) < 0, ~a, a)) - U32(1) + U32(0)).astype(U32)),
    "v_cvt_f32_i32": Row("f32", ("i32",), lambda a: a.astype(F32)),
    "v_cvt_f32_u32": Row("f32", ("u32",), lambda a: a.astype(F32)),
    "v_cvt_i32_f32": Row("i32", ("f32",), lambda a: _cvt_f_to_i(a, -2**31, 2**31 - 1, I32)),
    "v_cvt_u32_f32": Row("u32", ("f32",), lambda a: _cvt_f_to_i(a, 0, 2**32 - 1, U32)),
    "v_cvt_rpi_i32_f32": Row("i32", ("f32",), lambda a: _cvt_f_to_i(np.floor(np.asarray(a, F64) + 0.5), -2**31, 2**31 - 1, I32)),
    "v_cvt_flr_i32_f32": Row("i32", ("f32",), lambda a: _cvt_f_to_i(np.floor(a), -2**31, 2**31 - 1, I32)),
    "v_cvt_f32_f16": Row("f32", ("f16",), lambda a: a),
    "v_cvt_f16_f32": Row("f16", ("f32",), lambda a: a),
    "v_cvt_f32_bf16": Row("f32", ("bf16",), lambda a: a),
    "v_cvt_f32_ubyte0": Row("f32", ("u32",), lambda a: (a & U32(0xFF)).astype(F32)),
    "v_cvt_f32_ubyte1": Row("f32", ("u32",), lambda a: ((a >> U32(8)) & U32(0xFF)).astype(F32)),
    "v_cvt_f32_ubyte2": Row("f32", ("u32",), lambda a: ((a >> U32(16)) & U32(0xFF)).astype(F32)),
    "v_cvt_f32_ubyte3": Row("f32", ("u32",), lambda a: (a >> U32(24)).astype(F32)),
    "v_cvt_f64_f32": Row("f64", ("f32",), lambda a: a.astype(F64)),
    "v_cvt_f32_f64": Row("f32", ("f64",), lambda a: a.astype(F32)),
    "v_cvt_f64_i32": Row("f64", ("i32",), lambda a: a.astype(F64)),
    "v_cvt_f64_u32": Row("f64", ("u32",), lambda a: a.astype(F64)),
    "v_cvt_i32_f64": Row("i32", ("f64",), lambda a: _cvt_f_to_i(a, -2**31, 2**31 - 1, I32)),
    "v_cvt_u32_f64": Row("u32", ("f64",), lambda a: _cvt_f_to_i(a, 0, 2**32 - 1, U32)),
    "v_cvt_f16_u16": Row("f16", ("u16",), lambda a: a.astype(F32)),
    "v_cvt_f16_i16": Row("f16", ("i16",), lambda a: a.astype(F32)),
    "v_cvt_u16_f16": Row("u16", ("f16",), lambda a: _cvt_f_to_i(a, 0, 65535, U32)),
    "v_cvt_i16_f16": Row("i16", ("f16",), lambda a: _cvt_f_to_i(a, -32768, 32767, I32)),
    "v_fract_f32": Row("f32", ("f32",), lambda a: np.where(np.isinf(a), F32(0), a - np.floor(a)).astype(F32)),
    "v_trunc_f32": Row("f32", ("f32",), np.trunc),
    "v_ceil_f32": Row("f32", ("f32",), np.ceil),
    "v_floor_f32": Row("f32", ("f32",), np.floor),
    "v_rndne_f32": Row("f32", ("f32",), np.rint),
    "v_exp_f32": Row("f32", ("f32",), np.exp2),
    "v_log_f32": Row("f32", ("f32",), np.log2),
    "v_rcp_f32": Row("f32", ("f32",), lambda a: F32(1) / a),
    "v_rsq_f32": Row("f32", ("f32",), lambda a: (1.0 / np.sqrt(np.asarray(a, F64))).astype(F32)),
    "v_sqrt_f32": Row("f32", ("f32",), np.sqrt),
    "v_sin_f32": Row("f32", ("f32",), lambda a: np.sin(np.asarray(a, F64) * 2 * np.pi).astype(F32)),
    "v_cos_f32": Row("f32", ("f32",), lambda a: np.cos(np.asarray(a, F64) * 2 * np.pi).astype(F32)),
    "v_frexp_mant_f32": Row("f32", ("f32",), _frexp_mant),
    "v_frexp_exp_i32_f32": Row("i32", ("f32",), _frexp_exp),
    # f64
    "v_add_f64": Row("f64", ("f64", "f64"), lambda a, b: a + b),
    "v_mul_f64": Row("f64", ("f64", "f64"), lambda a, b: a * b),
    "v_max_f64": Row("f64", ("f64", "f64"), np.fmax),
    "v_min_f64": Row("f64", ("f64", "f64"), np.fmin),
    "v_fma_f64": Row("f64", ("f64", "f64", "f64"), lambda a, b, c: a * b + c),
    "v_rcp_f64": Row("f64", ("f64",), lambda a: 1.0 / a),
    "v_rsq_f64": Row("f64", ("f64",), lambda a: 1.0 / np.sqrt(a)),
    "v_sqrt_f64": Row("f64", ("f64",), np.sqrt),
    "v_ldexp_f64": Row("f64", ("f64", "i32"), lambda a, b: np.ldexp(a, np.clip(b, -3000, 3000))),
    "v_fract_f64": Row("f64", ("f64",), lambda a: a - np.floor(a)),
    "v_trunc_f64": Row("f64", ("f64",), np.trunc),
    "v_floor_f64": Row("f64", ("f64",), np.floor),
    "v_ceil_f64": Row("f64", ("f64",), np.ceil),
    "v_rndne_f64": Row("f64", ("f64",), np.rint),
    "v_mov_b64": Row("b64", ("b64",), lambda a: a),
    "v_lshlrev_b64": Row("b64", ("u32", "b64"), lambda a, b: b << (a & S31 if False else (np.asarray(a, U32) & U32(63)).astype(U64))),
    "v_lshrrev_b64": Row("b64", ("u32", "b64"), lambda a, b: b >> (np.asarray(a, U32) & U32(63)).astype(U64)),
    "v_ashrrev_i64": Row("i64", ("u32", "i64"), lambda a, b: b >> (np.asarray(a, U32) & U32(63)).astype(I64)),
    "v_lshl_add_u64": Row("b64", ("b64", "u32", "b64"), lambda a, b, c: (a << (np.asarray(b, U32) & U32(63)).astype(U64)) + c),
    # f16 (computed in f32, rounded to f16 on write)
    "v_add_f16": Row("f16", ("f16", "f16"), lambda a, b: a + b),
    "v_sub_f16": Row("f16", ("f16", "f16"), lambda a, b: a - b),
    "v_subrev_f16": Row("f16", ("f16", "f16"), lambda a, b: b - a),
    "v_mul_f16": Row("f16", ("f16", "f16"), lambda a, b: a * b),
    "v_max_f16": Row("f16", ("f16", "f16"), np.fmax),
    "v_min_f16": Row("f16", ("f16", "f16"), np.fmin),
    "v_fma_f16": Row("f16", ("f16", "f16", "f16"), _fma32),
    "v_mad_f16": Row("f16", ("f16", "f16", "f16"), lambda a, b, c: a * b + c),
    "v_rcp_f16": Row("f16", ("f16",), lambda a: F32(1) / a),
    "v_sqrt_f16": Row("f16", ("f16",), np.sqrt),
    "v_exp_f16": Row("f16", ("f16",), np.exp2),
    "v_log_f16": Row("f16", ("f16",), np.log2),
    "v_max3_f16": Row("f16", ("f16", "f16", "f16"), lambda a, b, c: np.fmax(np.fmax(a, b), c)),
    "v_min3_f16": Row("f16", ("f16", "f16", "f16"), lambda a, b, c: np.fmin(np.fmin(a, b), c)),
    "v_med3_f16": Row("f16", ("f16", "f16", "f16"), _fmed3),
    "v_ldexp_f16": Row("f16", ("f16", "i16"), lambda a, b: np.ldexp(a, np.clip(b, -100, 100)).astype(F32)),
    # 32-bit integer
    "v_add_u32": Row("u32", ("u32", "u32"), lambda a, b: a + b),
    "v_sub_u32": Row("u32", ("u32", "u32"), lambda a, b: a - b),
    "v_subrev_u32": Row("u32", ("u32", "u32"), lambda a, b: b - a),
    "v_mul_lo_u32": Row("u32", ("u32", "u32"), lambda a, b: a * b),
    "v_mul_hi_u32": Row("u32", ("u32", "u32"), lambda a, b: ((a.astype(U64) * b.astype(U64)) >> U64(32)).astype(U32)),
    "v_mul_hi_i32": Row("i32", ("i32", "i32"), lambda a, b: ((a.astype(I64) * b.astype(I64)) >> I64(32)).astype(I32)),
    "v_mul_u32_u24": Row("u32", ("u32", "u32"), lambda a, b: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF))),
    "v_mul_hi_u32_u24": Row("u32", ("u32", "u32"), lambda a, b: (((a & U32(0xFFFFFF)).astype(U64) * (b & U32(0xFFFFFF)).astype(U64)) >> U64(32)).astype(U32)),
    "v_mul_i32_i24": Row("i32", ("i32", "i32"), lambda a, b: (((a << 8) >> 8).astype(I64) * ((b << 8) >> 8).astype(I64)).astype(I32)),
    "v_mul_hi_i32_i24": Row("i32", ("i32", "i32"), lambda a, b: ((((a << 8) >> 8).astype(I64) * ((b << 8) >> 8).astype(I64)) >> 32).astype(I32)),
    "v_and_b32": Row("b32", ("b32", "b32"), lambda a, b: a & b),
    "v_or_b32": Row("b32", ("b32", "b32"), lambda a, b: a | b),
    "v_xor_b32": Row("b32", ("b32", "b32"), lambda a, b: a ^ b),
    "v_xnor_b32": Row("b32", ("b32", "b32"), lambda a, b: ~(a ^ b)),
    "v_lshlrev_b32": Row("b32", ("u32", "b32"), lambda a, b: b << (a & S31)),
    "v_lshrrev_b32": Row("b32", ("u32", "b32"), lambda a, b: b >> (a & S31)),
    "v_ashrrev_i32": Row("i32", ("u32", "i32"), lambda a, b: b >> (a & S31).astype(I32)),
    "v_max_u32": Row("u32", ("u32", "u32"), np.maximum),
    "v_min_u32": Row("u32", ("u32", "u32"), np.minimum),
    "v_max_i32": Row("i32", ("i32", "i32"), np.maximum),
    "v_min_i32": Row("i32", ("i32", "i32"), np.minimum),
    "v_max3_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_i32": Row("i32", ("i32", "i32", "i32"), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_i32": Row("i32", ("i32", "i32", "i32"), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_med3_u32": Row("u32", ("u32", "u32", "u32"), _med3),
    "v_med3_i32": Row("i32", ("i32", "i32", "i32"), _med3),
    "v_bfe_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: _bfe(a, b, c, False)),
    "v_bfe_i32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: _bfe(a, b, c, True)),
    "v_bfi_b32": Row("b32", ("b32", "b32", "b32"), lambda a, b, c: (a & b) | (~a & c)),
    "v_bfm_b32": Row("b32", ("u32", "u32"), lambda a, b: (((U64(1) << (a & S31).astype(U64)) - U64(1)) << (b & S31).astype(U64)).astype(U32)),
    "v_alignbit_b32": Row("b32", ("b32", "b32", "u32"), _alignbit),
    "v_alignbyte_b32": Row("b32", ("b32", "b32", "u32"), lambda a, b, c: _alignbit(a, b, (c & U32(3)) * U32(8))),
    "v_lshl_add_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: (a << (b & S31)) + c),
    "v_add_lshl_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: (a + b) << (c & S31)),
    "v_lshl_or_b32": Row("b32", ("b32", "u32", "b32"), lambda a, b, c: (a << (b & S31)) | c),
    "v_and_or_b32": Row("b32", ("b32", "b32", "b32"), lambda a, b, c: (a & b) | c),
    "v_or3_b32": Row("b32", ("b32", "b32", "b32"), lambda a, b, c: a | b | c),
    "v_xad_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: (a ^ b) + c),
    "v_add3_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: a + b + c),
    "v_mad_u32_u24": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)) + c),
    "v_mad_i32_i24": Row("i32", ("i32", "i32", "i32"), lambda a, b, c: (((a << 8) >> 8) * ((b << 8) >> 8) + c).astype(I32)),
    "v_bcnt_u32_b32": Row("u32", ("u32", "u32"), lambda a, b: _popc(a) + b),
    "v_sad_u32": Row("u32", ("u32", "u32", "u32"), lambda a, b, c: np.where(a > b, a - b, b - a) + c),
    "v_perm_b32": Row("b32", ("b32", "b32", "b32"), _perm),
    "v_cvt_pk_bf16_f32": Row("b32", ("f32", "f32"), lambda a, b: bf16_bits_rne(a) | (bf16_bits_rne(b) << U32(16))),
    "v_cvt_pkrtz_f16_f32": Row("b32", ("f32", "f32"), lambda a, b: _f16_rtz(a) | (_f16_rtz(b) << U32(16))),
    "v_cvt_pk_f16_f32": Row("b32", ("f32", "f32"), lambda a, b: to_bits(a, "f16") | (to_bits(b, "f16") << U32(16))),
    "v_pack_b32_f16": Row("b32", ("b16", "b16"), lambda a, b: (a & U32(0xFFFF)) | ((b & U32(0xFFFF)) << U32(16))),
    "v_cvt_pk_u16_u32": Row("b32", ("u32", "u32"), lambda a, b: np.minimum(a, 0xFFFF).astype(U32) | (np.minimum(b, 0xFFFF).astype(U32) << U32(16))),
    "v_cvt_pk_i16_i32": Row("b32", ("i32", "i32"), lambda a, b: (np.clip(a, -32768, 32767).astype(U32) & U32(0xFFFF)) | ((np.clip(b, -32768, 32767).astype(U32) & U32(0xFFFF)) << U32(16))),
    "v_cvt_pknorm_i16_f32": Row("b32", ("f32", "f32"), lambda a, b: _pknorm(a, b, True)),
    "v_cvt_pknorm_u16_f32": Row("b32", ("f32", "f32"), lambda a, b: _pknorm(a, b, False)),
    # 16-bit integer
    "v_add_u16": Row("u16", ("u16", "u16"), lambda a, b: a + b),
    "v_sub_u16": Row("u16", ("u16", "u16"), lambda a, b: a - b),
    "v_subrev_u16": Row("u16", ("u16", "u16"), lambda a, b: b - a),
    "v_mul_lo_u16": Row("u16", ("u16", "u16"), lambda a, b: a * b),
    "v_lshlrev_b16": Row("u16", ("u16", "u16"), lambda a, b: b << (a & U32(15))),
    "v_lshrrev_b16": Row("u16", ("u16", "u16"), lambda a, b: b >> (a & U32(15))),
    "v_ashrrev_i16": Row("i16", ("u16", "i16"), lambda a, b: b >> (a & U32(15)).astype(I32)),
    "v_max_u16": Row("u16", ("u16", "u16"), np.maximum),
    "v_min_u16": Row("u16", ("u16", "u16"), np.minimum),
    "v_max_i16": Row("i16", ("i16", "i16"), np.maximum),
    "v_min_i16": Row("i16", ("i16", "i16"), np.minimum),
    "v_mad_u16": Row("u16", ("u16", "u16", "u16"), lambda a, b, c: a * b + c),
    "v_mad_i16": Row("i16", ("i16", "i16", "i16"), lambda a, b, c: a * b + c),
}, aliases={
    "v_add_i32": "v_add_u32", "v_sub_i32": "v_sub_u32", "v_rcp_iflag_f32": "v_rcp_f32",
    "v_exp_legacy_f32": "v_exp_f32", "v_log_legacy_f32": "v_log_f32",
})


# ---- packed (VOP3P) -------------------------------------------------------------------------------

PK16 = Table({
    "v_pk_add_f16": Row("f16", ("f16",) * 2, lambda a, b: a + b),
    "v_pk_mul_f16": Row("f16", ("f16",) * 2, lambda a, b: a * b),
    "v_pk_fma_f16": Row("f16", ("f16",) * 3, _fma32),
    "v_pk_max_f16": Row("f16", ("f16",) * 2, np.fmax),
    "v_pk_min_f16": Row("f16", ("f16",) * 2, np.fmin),
    "v_pk_add_u16": Row("u16", ("u16",) * 2, lambda a, b: a + b),
    "v_pk_sub_u16": Row("u16", ("u16",) * 2, lambda a, b: a - b),
    "v_pk_add_i16": Row("i16", ("i16",) * 2, lambda a, b: a + b),
    "v_pk_sub_i16": Row("i16", ("i16",) * 2, lambda a, b: a - b),
    "v_pk_mul_lo_u16": Row("u16", ("u16",) * 2, lambda a, b: a * b),
    "v_pk_lshlrev_b16": Row("u16", ("u16",) * 2, lambda a, b: b << (a & U32(15))),
    "v_pk_lshrrev_b16": Row("u16", ("u16",) * 2, lambda a, b: b >> (a & U32(15))),
    "v_pk_ashrrev_i16": Row("i16", ("i16",) * 2, lambda a, b: b >> (a & 15)),
    "v_pk_max_u16": Row("u16", ("u16",) * 2, np.maximum),
    "v_pk_min_u16": Row("u16", ("u16",) * 2, np.minimum),
    "v_pk_max_i16": Row("i16", ("i16",) * 2, np.maximum),
    "v_pk_min_i16": Row("i16", ("i16",) * 2, np.minimum),
    "v_pk_mad_u16": Row("u16", ("u16",) * 3, lambda a, b, c: a * b + c),
    "v_pk_mad_i16": Row("i16", ("i16",) * 3, lambda a, b, c: a * b + c),
})
# v_pk_mov_b32 has no fn: its builder moves the selected dwords.
PK32 = Table({
    "v_pk_add_f32": Row("f32", ("f32",) * 2, lambda a, b: a + b),
    "v_pk_mul_f32": Row("f32", ("f32",) * 2, lambda a, b: a * b),
    "v_pk_fma_f32": Row("f32", ("f32",) * 3, _fma32),
    "v_pk_mov_b32": Row("f32", ("f32",) * 2, None),
})


# ---- scalar ALU -----------------------------------------------------------------------------------

def _sx(v, bits):
    top = 1 << (bits - 1)
    return ((v & ((1 << bits) - 1)) ^ top) - top


def _popcount(v):
    return bin(v).count("1")


def _ff1(v, bits):
    if v == 0:
        return M32
    return (v & -v).bit_length() - 1


def _flbit(v, bits):
    if v == 0:
        return M32
    return bits - v.bit_length()


def _brev(v, bits):
    return int(format(v, f"0{bits}b")[::-1], 2)


def _sbfe(v, ctl, bits, signed):
    off = ctl & (bits - 1)
    width = (ctl >> 16) & 0x7F
    if width == 0:
        return 0
    r = (v >> off) & ((1 << width) - 1)
    if signed and width < bits:
        r = _sx(r, width)
    return r & ((1 << bits) - 1)


# op -> (dst width, src widths, signed srcs, fn(a, b, w) -> (result, scc or None))


def _binop(fn, scc_nonzero=True):
    """A SOP2 row: fn(a, b, bits) -> (result masked to bits, SCC or None)."""
    return Row("b", ("b", "b"), lambda a, b, bits: (r := fn(a, b, bits) & ((1 << bits) - 1), int(r != 0) if scc_nonzero else None))


SOP2 = Table({
    "and": _binop(lambda a, b, n: a & b),
    "or": _binop(lambda a, b, n: a | b),
    "xor": _binop(lambda a, b, n: a ^ b),
    "andn2": _binop(lambda a, b, n: a & ~b),
    "orn2": _binop(lambda a, b, n: a | ~b),
    "nand": _binop(lambda a, b, n: ~(a & b)),
    "nor": _binop(lambda a, b, n: ~(a | b)),
    "xnor": _binop(lambda a, b, n: ~(a ^ b)),
    "lshl": _binop(lambda a, b, n: a << (b & (n - 1))),
    "lshr": _binop(lambda a, b, n: a >> (b & (n - 1))),
    "ashr": _binop(lambda a, b, n: _sx(a, n) >> (b & (n - 1))),
    "bfm": _binop(lambda a, b, n: ((1 << (a & (n - 1))) - 1) << (b & (n - 1)), scc_nonzero=False),
    "mul": _binop(lambda a, b, n: a * b, scc_nonzero=False),
    "mul_hi_u32": _binop(lambda a, b, n: (a * b) >> 32, scc_nonzero=False),
    "mul_hi_i32": _binop(lambda a, b, n: (_sx(a, 32) * _sx(b, 32)) >> 32, scc_nonzero=False),
    "bfe_u": _binop(lambda a, b, n: _sbfe(a, b, n, False)),
    "bfe_i": _binop(lambda a, b, n: _sbfe(a, b, n, True)),
    "pack_ll": _binop(lambda a, b, n: (a & 0xFFFF) | ((b & 0xFFFF) << 16), scc_nonzero=False),
    "pack_lh": _binop(lambda a, b, n: (a & 0xFFFF) | (b & 0xFFFF0000), scc_nonzero=False),
    "pack_hh": _binop(lambda a, b, n: (a >> 16) | (b & 0xFFFF0000), scc_nonzero=False),
    "absdiff": _binop(lambda a, b, n: abs(_sx(a, 32) - _sx(b, 32))),
})


SOP1 = Table({
    "mov": Row("b", ("b",), lambda v, n: (v, None)),
    "not": Row("b", ("b",), lambda v, n: (r := ~v & ((1 << n) - 1), int(r != 0))),
    "brev": Row("b", ("b",), lambda v, n: (_brev(v, n), None)),
    "bcnt0_i32": Row("b", ("b",), lambda v, n: (r := n - _popcount(v), int(r != 0))),
    "bcnt1_i32": Row("b", ("b",), lambda v, n: (r := _popcount(v), int(r != 0))),
    "ff0_i32": Row("b", ("b",), lambda v, n: (_ff1(~v & ((1 << n) - 1), n), None)),
    "ff1_i32": Row("b", ("b",), lambda v, n: (_ff1(v, n), None)),
    "flbit_i32": Row("b", ("b",), lambda v, n: (_flbit(v, n), None)),
    "abs": Row("b", ("b",), lambda v, n: (r := abs(_sx(v, 32)) & M32, int(r != 0))),
    "sext_i32_i8": Row("b", ("b",), lambda v, n: (_sx(v, 8) & M32, None)),
    "sext_i32_i16": Row("b", ("b",), lambda v, n: (_sx(v, 16) & M32, None)),
})

SAVEEXEC = Table({
    "and": Row("b64", ("b64", "b64"), lambda s, e: s & e),
    "or": Row("b64", ("b64", "b64"), lambda s, e: s | e),
    "xor": Row("b64", ("b64", "b64"), lambda s, e: s ^ e),
    "andn2": Row("b64", ("b64", "b64"), lambda s, e: s & ~e),
    "orn2": Row("b64", ("b64", "b64"), lambda s, e: s | ~e),
    "nand": Row("b64", ("b64", "b64"), lambda s, e: ~(s & e)),
    "nor": Row("b64", ("b64", "b64"), lambda s, e: ~(s | e)),
    "xnor": Row("b64", ("b64", "b64"), lambda s, e: ~(s ^ e)),
    "andn1": Row("b64", ("b64", "b64"), lambda s, e: ~s & e),
    "orn1": Row("b64", ("b64", "b64"), lambda s, e: ~s | e),
})


# ---- atomics --------------------------------------------------------------------------------------

def _bf16x2_add(old, val):
    o, v = np.asarray(old, U32), np.asarray(val, U32)
    lo = ((o << U32(16)).view(F32) + (v << U32(16)).view(F32))
    hi = ((o & U32(0xFFFF0000)).view(F32) + (v & U32(0xFFFF0000)).view(F32))
    return bf16_bits_rne(lo) | (bf16_bits_rne(hi) << U32(16))


def _f16x2_add(old, val):
    o, v = np.asarray(old, U32), np.asarray(val, U32)

    def h(x, s):
        return ((x >> U32(s)) & U32(0xFFFF)).astype(np.uint16).view(np.float16).astype(F32)
    lo = (h(o, 0) + h(v, 0)).astype(np.float16).view(np.uint16).astype(U32)
    hi = (h(o, 16) + h(v, 16)).astype(np.float16).view(np.uint16).astype(U32)
    return lo | (hi << U32(16))


def _sx32(x):
    return np.asarray(x, U32).view(I32)


ATOMIC32 = Table({
    "add": Row("b32", ("b32", "b32"), lambda o, v: o + v),
    "sub": Row("b32", ("b32", "b32"), lambda o, v: o - v),
    "rsub": Row("b32", ("b32", "b32"), lambda o, v: v - o),
    "swap": Row("b32", ("b32", "b32"), lambda o, v: v),
    "and": Row("b32", ("b32", "b32"), lambda o, v: o & v),
    "or": Row("b32", ("b32", "b32"), lambda o, v: o | v),
    "xor": Row("b32", ("b32", "b32"), lambda o, v: o ^ v),
    "smin": Row("b32", ("b32", "b32"), lambda o, v: np.minimum(_sx32(o), _sx32(v)).view(U32)),
    "smax": Row("b32", ("b32", "b32"), lambda o, v: np.maximum(_sx32(o), _sx32(v)).view(U32)),
    "umin": Row("b32", ("b32", "b32"), np.minimum),
    "umax": Row("b32", ("b32", "b32"), np.maximum),
    "inc": Row("b32", ("b32", "b32"), lambda o, v: np.where(o >= v, U32(0), o + U32(1))),
    "dec": Row("b32", ("b32", "b32"), lambda o, v: np.where((o == 0) | (o > v), v, o - U32(1))),
    "add_f32": Row("b32", ("b32", "b32"), lambda o, v: (o.view(F32) + v.view(F32)).astype(F32).view(U32)),
    "min_f32": Row("b32", ("b32", "b32"), lambda o, v: np.fmin(o.view(F32), v.view(F32)).view(U32)),
    "max_f32": Row("b32", ("b32", "b32"), lambda o, v: np.fmax(o.view(F32), v.view(F32)).view(U32)),
    "pk_add_bf16": Row("b32", ("b32", "b32"), _bf16x2_add),
    "pk_add_f16": Row("b32", ("b32", "b32"), _f16x2_add),
}, aliases={
    # DS spellings of the buffer/global atomics
    "min_i32": "smin", "max_i32": "smax", "min_u32": "umin", "max_u32": "umax", "add_u32": "add",
    "sub_u32": "sub", "rsub_u32": "rsub", "and_b32": "and", "or_b32": "or", "xor_b32": "xor", "inc_u32": "inc",
    "dec_u32": "dec", "wrxchg_b32": "swap",
})
