"""Narrow floating-point formats and the gfx950 conversion instructions (wave64, vectorised numpy).

Formats (gfx950 uses the OCP variants, not the gfx942 FNUZ ones):
  bf16      E8M7  IEEE-like (inf, NaN)
  f16       E5M10 IEEE
  fp8_e4m3  E4M3FN: bias 7, no inf, NaN = S.1111.111 (0x7f/0xff), max 448
  bf8_e5m2  E5M2: bias 15, IEEE-like (inf = S.11111.00), max 57344
  fp6_e2m3  bias 1, no inf/NaN, max 7.5
  bf6_e3m2  bias 3, no inf/NaN, max 28
  fp4_e2m1  bias 1, no inf/NaN, max 6
  e8m0      unsigned power of two 2^(e-127), 255 = NaN
(OCP MX spec v1.0; the same table is in AMD's hip/amd_detail/amd_hip_ocp_fp.hpp and the ROCm
"Matrix Core Programming on CDNA3 and CDNA4" blog.)

Rounding is round-to-nearest-even computed exactly in float64 (every input here is a float32/f16/bf16 or a
narrow value, so scaling by a power of two and np.rint are exact): one rounding, no double rounding.

Out-of-range / special values when encoding (`saturate` chooses the overflow policy):
  E4M3: NaN -> S|0x7f; +-inf and overflow -> S|0x7f (NaN) unless saturate (-> +-448).
  E5M2: NaN -> S|0x7e; +-inf stays inf unless saturate; overflow -> +-inf unless saturate (-> +-57344).
  FP6/FP4: no inf/NaN encodings; overflow and +-inf saturate to +-max; NaN -> S|max.
     (AMD's host reference for the gfx950 conversions, amd_hip_ocp_host.hpp fcbx::nan/inf, maps NaN and
     overflow of E2M1/E2M3/E3M2 to the max-magnitude code with the input's sign.)
  bf16/f16: IEEE (overflow -> inf unless saturate); NaN quietened keeping the sign and top payload bits.

Conversion-instruction semantics (execute_cvt) and the evidence for each choice:
  * op_sel placement is taken from LLVM 22 (llvm-mc -mcpu=gfx950 -show-encoding): the asm list maps to the
    VOP3 OPSEL bits as follows -
      v_cvt_pk_{fp8,bf8}_f32           op_sel:[a,b,d]   d = OPSEL[3] (Inst bit 14) selects the dst half
      v_cvt_sr_{fp8,bf8}_f32            op_sel:[a,b,c,d] dst byte = c + 2d (OPSEL[3:2])
      v_cvt_scalef32_pk_{fp8,bf8}_*     op_sel:[a,b,c,d] d selects the dst half
      v_cvt_scalef32_sr_{fp8,bf8}_*     op_sel:[a,b,c,d] dst byte = c + 2d
      v_cvt_scalef32_pk_fp4_* / sr_pk_fp4_*  dst byte = c + 2d  (LLVM commit 1a86d44c: "OPSEL[3:2] selects
                                        which dst_byte to write")
      v_cvt_scalef32_pk_{f32,f16,bf16}_fp4   src byte = a + 2b  ("OPSEL[1:0] selects which src_byte")
      v_cvt_scalef32_pk_{f32,f16,bf16}_{fp8,bf8}  src half = a  (gem5 MI355X model: OPSEL & 1)
      v_cvt_scalef32_{f32,f16}_{fp8,bf8}  src byte = a + 2b; for the f16 result op_sel:[a,b,z], z is
                                        OPSEL[3] (Inst bit 14, LLVM commit 7ad1084b) = dst half
      v_cvt_f32_{fp8,bf8} / v_cvt_pk_f32_{fp8,bf8}: byte/half from the SDWA src0_sel (mods["src0_sel"]);
                                        LLVM 22 accepts no op_sel on their VOP3 forms.
    A 4-element list is always read as the raw OPSEL bits [0..3]; the 3-element spellings above are mapped.
    Partial writes preserve the rest of the destination dword (dst_old).
  * Scale operand (scalef32 forms): only the f32 exponent field is used, as an E8M0 scale 2^(e-127)
    (amd_hip_ocp_fp.hpp __amd_scale_to_float: "the scale operand is encoded in the exponent bits of an
    IEEE-754 float"); exponent 255 -> NaN results for every format (host reference: scale NaN -> NaN).
    Down-conversions DIVIDE by the scale, up-conversions MULTIPLY (amd_hip_ocp_host.hpp from_float:
    `srcExp -= scale_exp`, to_float: `exp + scale_exp`; gem5 vop3_cvt.hh scaleDiv/scaleMul; MLIR
    arith.scaling_truncf lowers to these ops passing the scale unchanged).
  * Saturation: UNSURE. The conversions are treated as non-saturating (E4M3 overflow/inf -> NaN,
    E5M2 overflow -> inf); FP6/FP4 always saturate (no inf/NaN). Evidence for NaN on E4M3 overflow:
    AITER's mxfp8 code ("v_cvt_scalef32_pk_fp8_f32 ... overflow -> NaN if |fval/scale| > fp8 max; see CK
    mxf8_utils"), ROCm rocjitsu PR #8800 (gfx1250). Counter-evidence: AMD's host emulation header calls the
    E5M2 path with sat=true (-> 0x7b). Flip E5M2_OVERFLOW_SATURATES to change the E5M2 choice in one place.
    The VOP3 clamp bit (not accepted by LLVM 22 asm on v_cvt_pk_fp8_f32) is taken to mean "saturate" for
    down-conversions and "clamp to [0,1]" for f32/f16/bf16 results (gem5 clamps to [0,1]): UNSURE.
  * Up-conversions are exact into f32 except where the scale pushes the value out of f32 range (-> inf, or
    RNE into f32 subnormals); into f16/bf16 they round once (RNE).
  * Stochastic rounding (v_cvt_sr_*, *_sr_*): the source magnitude, truncated to the 23-bit f32 fraction
    grid below the kept bits, gets (seed >> (9 + m)) added and is then truncated - AMD's host reference
    fcbx::from_float_sr. UNSURE for destination subnormals (the reference shifts first, then adds).
"""

from __future__ import annotations

import functools

import numpy as np

# --------------------------------------------------------------------------------------------- formats

# name: (exponent bits, mantissa bits, bias, kind); kind: ieee (inf+NaN), fn (E4M3: NaN only), finite
FORMATS = {
    "bf16": (8, 7, 127, "ieee"),
    "f16": (5, 10, 15, "ieee"),
    "fp8_e4m3": (4, 3, 7, "fn"),
    "bf8_e5m2": (5, 2, 15, "ieee"),
    "fp6_e2m3": (2, 3, 1, "finite"),
    "bf6_e3m2": (3, 2, 3, "finite"),
    "fp4_e2m1": (2, 1, 1, "finite"),
}
ALL_FORMATS = tuple(FORMATS) + ("e8m0",)
WIDTH = {f: 1 + e + m for f, (e, m, _b, _k) in FORMATS.items()} | {"e8m0": 8}

# The one switch for the UNSURE E5M2 overflow policy of the conversion instructions (see module doc).
E5M2_OVERFLOW_SATURATES = False


def max_finite(fmt: str) -> float:
    e, m, bias, kind = FORMATS[fmt]
    top = (1 << e) - 1
    if kind == "ieee":
        return (2.0 - 2.0 ** -m) * 2.0 ** (top - 1 - bias)
    if kind == "fn":  # the all-ones mantissa at the top exponent is NaN
        return (2.0 - 2.0 ** (1 - m)) * 2.0 ** (top - bias)
    return (2.0 - 2.0 ** -m) * 2.0 ** (top - bias)


def _nan_code(fmt: str, sign: np.ndarray) -> np.ndarray:
    e, m, _bias, kind = FORMATS[fmt]
    s = sign.astype(np.uint32) << (e + m)
    if kind == "fn":
        return s | np.uint32((1 << (e + m)) - 1)
    if kind == "ieee":  # quiet NaN: exponent all ones, top mantissa bit set
        return s | np.uint32((((1 << e) - 1) << m) | (1 << (m - 1)))
    return s | np.uint32((1 << (e + m)) - 1)  # finite formats: NaN -> max magnitude


def _inf_code(fmt: str, sign: np.ndarray) -> np.ndarray:
    e, m, _bias, _kind = FORMATS[fmt]
    return (sign.astype(np.uint32) << (e + m)) | np.uint32(((1 << e) - 1) << m)


# --------------------------------------------------------------------------------------------- decode

def _build_lut(fmt: str) -> np.ndarray:
    codes = np.arange(1 << WIDTH[fmt], dtype=np.uint32)
    if fmt == "e8m0":
        out = np.ldexp(1.0, codes.astype(np.int64) - 127)
        out[255] = np.nan
        return out
    e, m, bias, kind = FORMATS[fmt]
    sign = (codes >> (e + m)) & 1
    field = (codes >> m) & ((1 << e) - 1)
    mant = (codes & ((1 << m) - 1)).astype(np.float64)
    normal = field > 0
    frac = np.where(normal, 1.0 + mant / (1 << m), mant / (1 << m))
    exp = np.where(normal, field.astype(np.int64) - bias, 1 - bias)
    out = np.ldexp(frac, exp)
    top = (1 << e) - 1
    if kind == "ieee":
        out = np.where(field == top, np.where(mant == 0, np.inf, np.nan), out)
    elif kind == "fn":
        out = np.where((field == top) & (mant == (1 << m) - 1), np.nan, out)
    return np.where(sign == 1, -out, out)


_LUT64 = {f: _build_lut(f) for f in ("fp8_e4m3", "bf8_e5m2", "fp6_e2m3", "bf6_e3m2", "fp4_e2m1", "e8m0")}


def decode64(fmt: str, codes) -> np.ndarray:
    """Codes -> exact float64 values (NaN for NaN codes)."""
    codes = np.asarray(codes).astype(np.uint32)
    with np.errstate(invalid="ignore"):  # signalling-NaN patterns are data, not errors
        if fmt == "bf16":
            return ((codes & 0xFFFF) << 16).view(np.float32).astype(np.float64)
        if fmt == "f16":
            return (codes & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    return _LUT64[fmt][codes & np.uint32((1 << WIDTH[fmt]) - 1)]


def decode(fmt: str, codes) -> np.ndarray:
    """Codes (unsigned ints) -> float32. Exact for every format here (all fit in float32)."""
    with np.errstate(invalid="ignore"):
        return decode64(fmt, codes).astype(np.float32)


# --------------------------------------------------------------------------------------------- encode

def _round_rne(fmt: str, a: np.ndarray) -> np.ndarray:
    """|x| (finite, >= 0, float64) -> nearest representable magnitude with an unbounded exponent above."""
    _e, m, bias, _kind = FORMATS[fmt]
    _f, ex = np.frexp(a)
    exp = np.maximum(ex - 1, 1 - bias)          # subnormals share the minimum exponent's quantum
    q = np.ldexp(1.0, exp - m)
    return np.rint(a / q) * q                   # a/q is exact; rint is round-half-even


def _magnitude_bits(fmt: str, v: np.ndarray) -> np.ndarray:
    """Representable magnitude (float64, <= max) -> exponent|mantissa bits."""
    _e, m, bias, _kind = FORMATS[fmt]
    _f, ex = np.frexp(v)
    exp = ex - 1
    normal = (v > 0) & (exp >= 1 - bias)
    field = np.where(normal, exp + bias, 0)
    mant = np.where(normal, np.ldexp(v, m - exp) - (1 << m), np.ldexp(v, m - (1 - bias)))
    return (field.astype(np.uint32) << m) | mant.astype(np.uint32)


def _finish(fmt: str, x: np.ndarray, mag: np.ndarray, saturate: bool) -> np.ndarray:
    """Assemble codes from the sign of x and an already-rounded magnitude; apply the special-value policy."""
    e, m, _bias, kind = FORMATS[fmt]
    sign = np.signbit(x).astype(np.uint32)
    nan = np.isnan(x)
    inf = np.isinf(x)
    mx = max_finite(fmt)
    over = ~nan & (inf | (np.nan_to_num(mag, nan=0.0, posinf=np.inf) > mx))
    safe = np.where(nan | over, 0.0, mag)
    code = (sign << (e + m)) | _magnitude_bits(fmt, safe)
    maxcode = (sign << (e + m)) | _magnitude_bits(fmt, np.full_like(safe, mx))
    if kind == "finite" or saturate:
        over_code = maxcode
    elif kind == "fn":
        over_code = _nan_code(fmt, sign)
    else:
        over_code = _inf_code(fmt, sign)
    code = np.where(over, over_code, code)
    if kind == "ieee" and saturate:  # saturate clips finite overflow, but an infinite input stays infinite
        code = np.where(inf, _inf_code(fmt, sign), code)
    return np.where(nan, _nan_code(fmt, sign), code).astype(np.uint32)


def _encode_bf16_f32bits(bits: np.ndarray) -> np.ndarray:
    """f32 bit patterns -> bf16 codes, RNE, NaN quietened keeping sign and top payload (v_cvt_pk_bf16_f32)."""
    bits = bits.astype(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint32) & 0xFFFF


def encode64(fmt: str, x, *, saturate: bool) -> np.ndarray:
    """Exact float64 values -> codes with one RNE rounding (inputs must carry <= 53 significant bits)."""
    x = np.asarray(x, dtype=np.float64)
    if fmt == "e8m0":
        return _encode_e8m0(x, saturate)
    a = np.abs(np.where(np.isfinite(x), x, 0.0))
    return _finish(fmt, x, _round_rne(fmt, a), saturate)


def encode(fmt: str, values, *, saturate: bool) -> np.ndarray:
    """float32 values -> unsigned codes (uint32 array), round-to-nearest-even. See module doc for specials."""
    v = np.asarray(values, dtype=np.float32)
    if fmt == "bf16":
        out = _encode_bf16_f32bits(v.view(np.uint32))
        if saturate:  # finite overflow clips to +-max finite; inf and NaN stay
            over = np.isfinite(v) & ((out & 0x7FFF) == 0x7F80)
            out = np.where(over, (out & 0x8000) | 0x7F7F, out)
        return out.astype(np.uint32)
    with np.errstate(invalid="ignore"):
        return encode64(fmt, v.astype(np.float64), saturate=saturate)


def _encode_e8m0(x: np.ndarray, saturate: bool) -> np.ndarray:
    """E8M0 (no sign, no zero): nearest power of two of |x|, the linear midpoint 1.5*2^e rounding up (RNE with
    no mantissa bit). Zero and tiny values -> 0x00 (2^-127), NaN -> 0xff, overflow -> 0xff (0xfe if saturate).
    No gfx950 instruction encodes E8M0; the sign and zero handling mirror torch's float8_e8m0fnu cast."""
    a = np.abs(x)
    ok = np.isfinite(a) & (a > 0)
    safe = np.where(ok, a, 1.0)
    _f, ex = np.frexp(safe)
    e = ex - 1
    r = np.rint(np.ldexp(safe, -e))            # in {1, 2}
    code = e + (r.astype(np.int64) - 1) + 127
    over = (ok & (code > 254)) | np.isinf(a)
    code = np.where(ok, np.clip(code, 0, 254), 0)
    code = np.where(over, 254 if saturate else 255, code)
    return np.where(np.isnan(a), 255, code).astype(np.uint32)


# --------------------------------------------------------------------------------------------- helpers

def f32_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def bits_f32(u) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def scale_exponent(scale_bits: np.ndarray) -> np.ndarray:
    """Biased E8M0 exponent field (int64) of an f32 scale operand: the scale is 2^(field-127), 255 = NaN."""
    return ((np.asarray(scale_bits, dtype=np.uint32) >> 23) & 0xFF).astype(np.int64)


def _apply_scale_up(vals: np.ndarray, scale_bits: np.ndarray) -> np.ndarray:
    e = scale_exponent(scale_bits)
    out = np.ldexp(vals, (e - 127)[..., None] if vals.ndim > e.ndim else e - 127)
    nan = (e == 255)[..., None] if vals.ndim > e.ndim else e == 255
    return np.where(nan, np.nan, out)


def _apply_scale_down(vals: np.ndarray, scale_bits: np.ndarray) -> np.ndarray:
    e = scale_exponent(scale_bits)
    out = np.ldexp(vals, (127 - e)[..., None] if vals.ndim > e.ndim else 127 - e)
    nan = (e == 255)[..., None] if vals.ndim > e.ndim else e == 255
    return np.where(nan, np.nan, out)


def _overflow_saturates(fmt: str, clamp: bool) -> bool:
    if clamp:
        return True
    return fmt == "bf8_e5m2" and E5M2_OVERFLOW_SATURATES


def _down(fmt: str, vals64: np.ndarray, clamp: bool) -> np.ndarray:
    return encode64(fmt, vals64, saturate=_overflow_saturates(fmt, clamp))


def _sr_down(fmt: str, vals64: np.ndarray, seed: np.ndarray, clamp: bool) -> np.ndarray:
    """Stochastic rounding (see module doc): add seed >> (9+m) below the kept bits, then truncate."""
    _e, m, bias, _kind = FORMATS[fmt]
    a = np.abs(np.where(np.isfinite(vals64), vals64, 0.0))
    _f, ex = np.frexp(a)
    exp = np.maximum(ex - 1, 1 - bias)
    t = np.ldexp(a, m - exp)                     # magnitude in units of the kept quantum
    base = np.floor(t)
    drop = 23 - m                                # fraction bits of the f32 source below the kept ones
    frac = np.floor(np.ldexp(t - base, drop))
    rnd = (np.asarray(seed, dtype=np.uint32) >> np.uint32(9 + m)).astype(np.float64)
    if rnd.ndim < frac.ndim:
        rnd = rnd[..., None]
    up = (frac + rnd) >= (1 << drop)
    mag = np.ldexp(base + up, exp - m)
    return _finish(fmt, vals64, mag, _overflow_saturates(fmt, clamp))


def _up(vals64: np.ndarray, out: str, clamp: bool) -> np.ndarray:
    """Exact values -> f32/f16/bf16 bits (one RNE rounding)."""
    if clamp:  # VOP3 clamp on a float result: [0, 1], NaN -> 0 (UNSURE for these conversions)
        vals64 = np.where(np.isnan(vals64), 0.0, np.clip(vals64, 0.0, 1.0))
    if out == "f32":
        with np.errstate(over="ignore"):
            return vals64.astype(np.float32).view(np.uint32)
    if out == "f16":
        return encode64("f16", vals64, saturate=False)
    return encode64("bf16", vals64, saturate=False)


def _sel(mods: dict, n: int) -> list[int]:
    """VOP3 OPSEL bits [0..n) from the asm op_sel list (a 4-element list is the raw bits), zero-padded."""
    ops = [int(x) for x in (mods.get("op_sel") or [])][:n]
    return ops + [0] * (n - len(ops))


def _dst_half_bit(mods: dict, three_elem_index: int = 2) -> int:
    """OPSEL[3] (Inst bit 14): written as op_sel[2] in LLVM's 3-element spellings, op_sel[3] in 4-element ones."""
    ops = list(mods.get("op_sel") or [])
    if len(ops) >= 4:
        return int(ops[3])
    if len(ops) == 3:
        return int(ops[three_elem_index])
    return 0


_SDWA_SEL = {"BYTE_0": 0, "BYTE_1": 1, "BYTE_2": 2, "BYTE_3": 3, "WORD_0": 4, "WORD_1": 5, "DWORD": 6}


def _sdwa_sel(mods: dict) -> int:
    sel = mods.get("src0_sel", 6)
    return _SDWA_SEL[sel.upper()] if isinstance(sel, str) else int(sel)


def _f32_src(raw: np.ndarray, mods: dict, idx: int) -> np.ndarray:
    """Apply VOP3 abs then neg (float source modifiers) to an f32 source; return float64 values."""
    bits = np.asarray(raw, dtype=np.uint32)
    if _flag(mods, "abs", idx):
        bits = bits & np.uint32(0x7FFFFFFF)
    if _flag(mods, "neg", idx):
        bits = bits ^ np.uint32(0x80000000)
    return bits.view(np.float32).astype(np.float64)


def _flag(mods: dict, key: str, idx: int) -> bool:
    lst = list(mods.get(key) or [])
    return idx < len(lst) and bool(lst[idx])


def _no_float_mods(mnemonic: str, mods: dict, idxs) -> None:
    for key in ("abs", "neg"):
        lst = list(mods.get(key) or [])
        for i in idxs:
            if i < len(lst) and lst[i]:
                raise NotImplementedError(f"{mnemonic}: {key} modifier on a packed/narrow source is not modelled")
    if mods.get("omod"):
        raise NotImplementedError(f"{mnemonic}: omod is not modelled")


def _insert(old: np.ndarray, value: np.ndarray, shift: int, width: int) -> np.ndarray:
    mask = np.uint32(((1 << width) - 1) << shift)
    return ((old & ~mask) | ((value.astype(np.uint32) << np.uint32(shift)) & mask)).astype(np.uint32)


def _extract(raw: np.ndarray, shift: int, width: int) -> np.ndarray:
    return (np.asarray(raw, dtype=np.uint32) >> np.uint32(shift)) & np.uint32((1 << width) - 1)


def _halves16(raw: np.ndarray, fmt16: str) -> np.ndarray:
    """Packed 2x16-bit source -> (64, 2) float64 values, low half first."""
    raw = np.asarray(raw, dtype=np.uint32)
    return np.stack([decode64(fmt16, raw & 0xFFFF), decode64(fmt16, raw >> 16)], axis=-1)


def _pack_bits(codes: np.ndarray, width: int, ndwords: int) -> np.ndarray:
    """(64, n) codes -> (ndwords, 64) dwords, element i at bits [width*i, width*i+width) of the lane's value."""
    lanes, n = codes.shape
    out = np.zeros((ndwords, lanes), dtype=np.uint64)
    for i in range(n):
        pos = width * i
        w, sh = divmod(pos, 32)
        v = codes[:, i].astype(np.uint64) << np.uint64(sh)
        out[w] |= v & np.uint64(0xFFFFFFFF)
        if sh + width > 32:
            out[w + 1] |= v >> np.uint64(32)
    return out.astype(np.uint32)


def _unpack_bits(dwords: np.ndarray, width: int, n: int) -> np.ndarray:
    """(ndwords, 64) dwords -> (64, n) codes (inverse of _pack_bits)."""
    if width in (4, 8, 16, 32) and np.little_endian:
        # Fields never straddle dwords: read them from the lanes' little-endian bytes.
        lanes = np.ascontiguousarray(np.asarray(dwords, dtype=np.uint32).T)       # (64, ndwords)
        if width == 32:
            return lanes[:, :n].copy()
        if width == 4:
            b = lanes.view(np.uint8)
            out = np.empty((b.shape[0], 2 * b.shape[1]), dtype=np.uint32)
            out[:, 0::2] = b & 0xF
            out[:, 1::2] = b >> 4
            return out[:, :n]
        return lanes.view(np.uint8 if width == 8 else np.uint16)[:, :n].astype(np.uint32)
    d = np.asarray(dwords, dtype=np.uint64)
    d = np.concatenate([d, np.zeros((1, d.shape[1]), dtype=np.uint64)])
    out = np.empty((d.shape[1], n), dtype=np.uint32)
    for i in range(n):
        w, sh = divmod(width * i, 32)
        both = d[w] | (d[w + 1] << np.uint64(32))
        out[:, i] = ((both >> np.uint64(sh)) & np.uint64((1 << width) - 1)).astype(np.uint32)
    return out


# --------------------------------------------------------------------------------------------- instructions

_F8 = {"fp8": "fp8_e4m3", "bf8": "bf8_e5m2"}
_F6 = {"fp6": "fp6_e2m3", "bf6": "bf6_e3m2"}
_WIDE = {"f32", "f16", "bf16"}


def _cvt_pk_bf16_f32(srcs, dst_old, mods):
    lo = _encode_bf16_f32bits(f32_bits(_f32_src(srcs[0], mods, 0).astype(np.float32)))
    hi = _encode_bf16_f32bits(f32_bits(_f32_src(srcs[1], mods, 1).astype(np.float32)))
    return (lo | (hi << 16)).astype(np.uint32)


def _make_pk_f8_f32(fmt, scaled):
    def run(srcs, dst_old, mods):
        a = _f32_src(srcs[0], mods, 0)
        b = _f32_src(srcs[1], mods, 1)
        if scaled:
            a, b = _apply_scale_down(a, srcs[2]), _apply_scale_down(b, srcs[2])
        clamp = bool(mods.get("clamp"))
        packed = _down(fmt, a, clamp) | (_down(fmt, b, clamp) << 8)
        half = _dst_half_bit(mods) if not scaled else _sel(mods, 4)[3]
        return _insert(dst_old, packed, 16 * half, 16)
    return run


def _make_sr_f8_f32(fmt, scaled):
    def run(srcs, dst_old, mods):
        a = _f32_src(srcs[0], mods, 0)
        if scaled:
            a = _apply_scale_down(a, srcs[2])
        code = _sr_down(fmt, a, srcs[1], bool(mods.get("clamp")))
        s = _sel(mods, 4)
        return _insert(dst_old, code, 8 * (s[2] + 2 * s[3]), 8)
    return run


def _make_f32_f8(fmt):
    """v_cvt_f32_{fp8,bf8}: byte from SDWA src0_sel (default byte 0)."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_f32_f8", mods, [0])
        sel = _sdwa_sel(mods)
        byte = sel if sel < 4 else (2 if sel == 5 else 0)
        v = decode64(fmt, _extract(srcs[0], 8 * byte, 8))
        return _up(v, "f32", bool(mods.get("clamp")))
    return run


def _make_pk_f32_f8(fmt):
    """v_cvt_pk_f32_{fp8,bf8}: half from SDWA src0_sel WORD_1 (or op_sel[0]); dst is 2 dwords."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_pk_f32_f8", mods, [0])
        half = 1 if _sdwa_sel(mods) == 5 else _sel(mods, 4)[0]
        w = _extract(srcs[0], 16 * half, 16)
        clamp = bool(mods.get("clamp"))
        return np.stack([_up(decode64(fmt, w & 0xFF), "f32", clamp), _up(decode64(fmt, w >> 8), "f32", clamp)])
    return run


def _make_scale_pk_f8_from16(fmt, src16):
    """v_cvt_scalef32_pk_{fp8,bf8}_{f16,bf16}: src0 packed 2x16, src1 scale; dst half OPSEL[3]."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_scalef32_pk_f8_16", mods, [0])
        v = _apply_scale_down(_halves16(srcs[0], src16), srcs[1])
        clamp = bool(mods.get("clamp"))
        packed = _down(fmt, v[:, 0], clamp) | (_down(fmt, v[:, 1], clamp) << 8)
        return _insert(dst_old, packed, 16 * _sel(mods, 4)[3], 16)
    return run


def _make_scale_pk_up_f8(fmt, out):
    """v_cvt_scalef32_pk_{f32,f16,bf16}_{fp8,bf8}: src half op_sel[0]. The 16-bit results are lanewise over
    any leading axes; when every lane has the same scale exponent they come from a table of all 65536 source
    halves, built by the exact path itself (the attention's fp8 KV loads convert at one scale)."""
    def exact(w, scale_bits, clamp):
        v = _apply_scale_up(np.stack([decode64(fmt, w & 0xFF), decode64(fmt, w >> 8)], axis=-1), scale_bits)
        return _up(v, out, clamp)

    @functools.lru_cache(maxsize=16)
    def table(exponent: int, clamp: bool) -> np.ndarray:
        r = exact(np.arange(1 << 16, dtype=np.uint32), np.uint32(exponent << 23), clamp)
        return (r[..., 0] | (r[..., 1] << 16)).astype(np.uint32)

    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_scalef32_pk_up_f8", mods, [0])
        w = _extract(srcs[0], 16 * _sel(mods, 4)[0], 16)
        clamp = bool(mods.get("clamp"))
        if out == "f32":
            return exact(w, srcs[1], clamp).T.copy()
        e = scale_exponent(srcs[1])
        if e.size and (e == e.flat[0]).all():
            return table(int(e.flat[0]), clamp)[w]
        r = exact(w, srcs[1], clamp)
        return (r[..., 0] | (r[..., 1] << 16)).astype(np.uint32)
    return run


def _make_scale_up_f8(fmt, out):
    """v_cvt_scalef32_{f32,f16}_{fp8,bf8}: src byte a+2b; f16 result goes to the half OPSEL[3]."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_scalef32_up_f8", mods, [0])
        s = _sel(mods, 2)
        v = _apply_scale_up(decode64(fmt, _extract(srcs[0], 8 * (s[0] + 2 * s[1]), 8)), srcs[1])
        r = _up(v, out, bool(mods.get("clamp")))
        if out == "f32":
            return r.astype(np.uint32)
        return _insert(dst_old, r, 16 * _dst_half_bit(mods), 16)
    return run


def _make_scale_pk_fp4_down(src):
    """v_cvt_scalef32_pk_fp4_{f32,f16,bf16}: two values -> one byte (low nibble = first), byte c+2d."""
    def run(srcs, dst_old, mods):
        if src == "f32":
            a, b = _f32_src(srcs[0], mods, 0), _f32_src(srcs[1], mods, 1)
            scale = srcs[2]
        else:
            _no_float_mods("v_cvt_scalef32_pk_fp4_16", mods, [0])
            h = _halves16(srcs[0], src)
            a, b = h[:, 0], h[:, 1]
            scale = srcs[1]
        clamp = bool(mods.get("clamp"))
        a, b = _apply_scale_down(a, scale), _apply_scale_down(b, scale)
        byte = _down("fp4_e2m1", a, clamp) | (_down("fp4_e2m1", b, clamp) << 4)
        s = _sel(mods, 4)
        return _insert(dst_old, byte, 8 * (s[2] + 2 * s[3]), 8)
    return run


def _cvt_scalef32_sr_pk_fp4_f32(srcs, dst_old, mods):
    """src0 = 2 dwords (f32 pair), src1 seed, src2 scale; dst byte c+2d."""
    _no_float_mods("v_cvt_scalef32_sr_pk_fp4_f32", mods, [0])
    pair = np.asarray(srcs[0], dtype=np.uint32).reshape(2, -1).view(np.float32).astype(np.float64).T
    v = _apply_scale_down(pair, srcs[2])                       # (64, 2)
    clamp = bool(mods.get("clamp"))
    byte = _sr_down("fp4_e2m1", v[:, 0], srcs[1], clamp) | (_sr_down("fp4_e2m1", v[:, 1], srcs[1], clamp) << 4)
    s = _sel(mods, 4)
    return _insert(dst_old, byte, 8 * (s[2] + 2 * s[3]), 8)


def _make_scale_pk_up_fp4(out):
    """v_cvt_scalef32_pk_{f32,f16,bf16}_fp4: src byte a+2b, low nibble -> first result."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_scalef32_pk_up_fp4", mods, [0])
        s = _sel(mods, 2)
        byte = _extract(srcs[0], 8 * (s[0] + 2 * s[1]), 8)
        v = np.stack([decode64("fp4_e2m1", byte & 0xF), decode64("fp4_e2m1", byte >> 4)], axis=-1)
        r = _up(_apply_scale_up(v, srcs[1]), out, bool(mods.get("clamp")))
        return r.T.copy() if out == "f32" else (r[:, 0] | (r[:, 1] << 16)).astype(np.uint32)
    return run


def _make_pk32_up(fmt6, out):
    """v_cvt_scalef32_pk32_{f32,f16,bf16}_{fp6,bf6}: src0 = 6 dwords of 32 packed 6-bit values
    (element i at bits 6i.., across dwords), src1 scale. Dst: 32 dwords (f32) or 16 (2x16-bit, low first)."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_scalef32_pk32_up", mods, [0])
        codes = _unpack_bits(np.asarray(srcs[0], dtype=np.uint32).reshape(6, -1), 6, 32)
        r = _up(_apply_scale_up(decode64(fmt6, codes), srcs[1]), out, bool(mods.get("clamp")))
        if out == "f32":
            return r.T.astype(np.uint32).copy()
        return (r[:, 0::2] | (r[:, 1::2] << 16)).T.astype(np.uint32).copy()
    return run


def _make_pk32_down(fmt6, src16):
    """v_cvt_scalef32_pk32_{fp6,bf6}_{f16,bf16}: src0 = 16 dwords (32 values, low half first), src1 scale."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_scalef32_pk32_down", mods, [0])
        d = np.asarray(srcs[0], dtype=np.uint32).reshape(16, -1)
        vals = np.stack([decode64(src16, d & 0xFFFF), decode64(src16, d >> 16)], axis=1)  # (16, 2, 64)
        vals = vals.reshape(32, -1).T                                                      # (64, 32)
        codes = _down(fmt6, _apply_scale_down(vals, srcs[1]), bool(mods.get("clamp")))
        return _pack_bits(codes, 6, 6)
    return run


def _make_2xpk16(fmt6):
    """v_cvt_scalef32_2xpk16_{fp6,bf6}_f32: src0, src1 = 16 dwords each, src2 scale -> 6 dwords.
    UNSURE element order: gem5's MI355X model interleaves dword-wise (element 2i = src0[i],
    2i+1 = src1[i]); followed here."""
    def run(srcs, dst_old, mods):
        _no_float_mods("v_cvt_scalef32_2xpk16", mods, [0, 1])
        s0 = np.asarray(srcs[0], dtype=np.uint32).reshape(16, -1)
        s1 = np.asarray(srcs[1], dtype=np.uint32).reshape(16, -1)
        both = np.stack([s0, s1], axis=1).reshape(32, -1).view(np.float32).astype(np.float64).T
        codes = _down(fmt6, _apply_scale_down(both, srcs[2]), bool(mods.get("clamp")))
        return _pack_bits(codes, 6, 6)
    return run


_HANDLERS = {"v_cvt_pk_bf16_f32": _cvt_pk_bf16_f32,
             "v_cvt_scalef32_sr_pk_fp4_f32": _cvt_scalef32_sr_pk_fp4_f32}
_DST_DWORDS = {"v_cvt_pk_bf16_f32": 1, "v_cvt_scalef32_sr_pk_fp4_f32": 1}
_SRC_DWORDS = {"v_cvt_pk_bf16_f32": (1, 1), "v_cvt_scalef32_sr_pk_fp4_f32": (2, 1, 1)}


def _reg(name, fn, dst, srcs):
    _HANDLERS[name] = fn
    _DST_DWORDS[name] = dst
    _SRC_DWORDS[name] = srcs


for _k, _fmt in _F8.items():
    _reg(f"v_cvt_pk_{_k}_f32", _make_pk_f8_f32(_fmt, False), 1, (1, 1))
    _reg(f"v_cvt_sr_{_k}_f32", _make_sr_f8_f32(_fmt, False), 1, (1, 1))
    _reg(f"v_cvt_f32_{_k}", _make_f32_f8(_fmt), 1, (1,))
    _reg(f"v_cvt_pk_f32_{_k}", _make_pk_f32_f8(_fmt), 2, (1,))
    _reg(f"v_cvt_scalef32_pk_{_k}_f32", _make_pk_f8_f32(_fmt, True), 1, (1, 1, 1))
    _reg(f"v_cvt_scalef32_sr_{_k}_f32", _make_sr_f8_f32(_fmt, True), 1, (1, 1, 1))
    _reg(f"v_cvt_scalef32_pk_f32_{_k}", _make_scale_pk_up_f8(_fmt, "f32"), 2, (1, 1))
    _reg(f"v_cvt_scalef32_f32_{_k}", _make_scale_up_f8(_fmt, "f32"), 1, (1, 1))
    _reg(f"v_cvt_scalef32_f16_{_k}", _make_scale_up_f8(_fmt, "f16"), 1, (1, 1))
    for _w in ("f16", "bf16"):
        _reg(f"v_cvt_scalef32_pk_{_k}_{_w}", _make_scale_pk_f8_from16(_fmt, _w), 1, (1, 1))
        _reg(f"v_cvt_scalef32_pk_{_w}_{_k}", _make_scale_pk_up_f8(_fmt, _w), 1, (1, 1))
for _w in ("f32", "f16", "bf16"):
    _reg(f"v_cvt_scalef32_pk_fp4_{_w}", _make_scale_pk_fp4_down(_w), 1, (1, 1, 1) if _w == "f32" else (1, 1))
    _reg(f"v_cvt_scalef32_pk_{_w}_fp4", _make_scale_pk_up_fp4(_w), 2 if _w == "f32" else 1, (1, 1))
for _k, _fmt in _F6.items():
    _reg(f"v_cvt_scalef32_pk32_f32_{_k}", _make_pk32_up(_fmt, "f32"), 32, (6, 1))
    for _w in ("f16", "bf16"):
        _reg(f"v_cvt_scalef32_pk32_{_w}_{_k}", _make_pk32_up(_fmt, _w), 16, (6, 1))
        _reg(f"v_cvt_scalef32_pk32_{_k}_{_w}", _make_pk32_down(_fmt, _w), 6, (16, 1))
    _reg(f"v_cvt_scalef32_2xpk16_{_k}_f32", _make_2xpk16(_fmt), 6, (16, 16, 1))

CVT_MNEMONICS = frozenset(_HANDLERS)
CVT_DST_DWORDS = dict(_DST_DWORDS)   # destination width in dwords per mnemonic
CVT_SRC_DWORDS = dict(_SRC_DWORDS)   # width in dwords of each source operand


def execute_cvt(mnemonic: str, srcs, dst_old, mods: dict) -> np.ndarray:
    """Run one conversion instruction for all 64 lanes (EXEC masking is the caller's job).

    srcs: raw source bits, one array per operand: (64,) uint32, or (n, 64) for an n-dword operand
      (CVT_SRC_DWORDS), fetched before float neg/abs; abs/neg are applied here to f32 sources only.
      For SDWA forms pass the selector as mods["src0_sel"] ("BYTE_2", "WORD_1", ...) and do not pre-extract.
    dst_old: the destination's previous bits, (64,) or (n, 64); partial writes (a byte or half) keep the rest.
    Returns (64,) uint32 for one-dword destinations, else (CVT_DST_DWORDS[mnemonic], 64).
    """
    mnemonic = mnemonic.removesuffix("_e64").removesuffix("_e32").removesuffix("_sdwa")
    fn = _HANDLERS.get(mnemonic)
    if fn is None:
        raise NotImplementedError(f"conversion {mnemonic} is not modelled")
    srcs = [np.asarray(s, dtype=np.uint32) for s in srcs]
    old = np.asarray(dst_old, dtype=np.uint32) if dst_old is not None else np.zeros(64, np.uint32)
    if old.ndim == 2 and old.shape[0] == 1:
        old = old[0]
    if mods.get("omod"):
        raise NotImplementedError(f"{mnemonic}: omod is not modelled")
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(fn(srcs, old, mods), dtype=np.uint32)
