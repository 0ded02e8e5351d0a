"""Operand tokens as LLVM prints them -> register/constant descriptions, and typed read/write closures.

Vector values are numpy arrays over the 64 lanes (0-d arrays for scalar/constant sources, which
broadcast). Scalar values are Python ints.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass

import numpy as np

from .state import EXEC_HI, EXEC_LO, FULL, M0, VCC_HI, VCC_LO, lane_mask, lane_masks

NAMED_SGPRS = {
    "vcc": (VCC_LO, 2), "vcc_lo": (VCC_LO, 1), "vcc_hi": (VCC_HI, 1),
    "exec": (EXEC_LO, 2), "exec_lo": (EXEC_LO, 1), "exec_hi": (EXEC_HI, 1),
    "m0": (M0, 1), "flat_scratch": (102, 2), "flat_scratch_lo": (102, 1), "flat_scratch_hi": (103, 1),
    "xnack_mask": (104, 2), "xnack_mask_lo": (104, 1), "xnack_mask_hi": (105, 1),
}
# Bases the hardware reports for the LDS / scratch apertures (gfx9 src_shared_base etc.): a flat address
# in [base, base + 4 GiB) reaches that segment. Our values only need to be consistent with flat.py.
SHARED_APERTURE = 0x1000000000000
PRIVATE_APERTURE = 0x2000000000000

_REG = re.compile(r"^(s|v|a|ttmp)(\d+)$|^(s|v|a|ttmp)\[(\d+):(\d+)\]$")
WIDTH = {"b16": 16, "u16": 16, "i16": 16, "f16": 16, "bf16": 16,
         "b32": 32, "u32": 32, "i32": 32, "f32": 32,
         "b64": 64, "u64": 64, "i64": 64, "f64": 64}
FLOAT_TYPES = {"f16", "bf16", "f32", "f64"}


@dataclass(frozen=True)     # parse_operand hands one instance to every instruction with that token
class Operand:
    kind: str                 # 's', 'v', 'a', 'const', 'scc', 'execz', 'vccz', 'off'
    index: int = 0
    count: int = 1
    value: float | int = 0    # for consts
    is_float: bool = False    # const printed as a float (inline float constant)
    neg: bool = False
    abs: bool = False
    sext: bool = False
    text: str = ""

    @property
    def is_vector(self) -> bool:
        return self.kind in ("v", "a")


class OperandError(ValueError):
    pass


@functools.lru_cache(maxsize=None)  # a kernel repeats a few thousand distinct tokens in 10^5 operands
def parse_operand(tok: str) -> Operand:
    text = tok
    neg = abs_ = sext = False
    if tok.startswith("sext(") and tok.endswith(")"):
        sext, tok = True, tok[5:-1]
    if tok.startswith("-") and not re.match(r"^-\d|^-0x|^-\.", tok):
        neg, tok = True, tok[1:]
    if tok.startswith("neg(") and tok.endswith(")"):
        neg, tok = True, tok[4:-1]
    if tok.startswith("|") and tok.endswith("|"):
        abs_, tok = True, tok[1:-1]
    if tok.startswith("abs(") and tok.endswith(")"):
        abs_, tok = True, tok[4:-1]
    m = _REG.match(tok)
    if m:
        if m.group(1):
            kind, lo, hi = m.group(1), int(m.group(2)), int(m.group(2))
        else:
            kind, lo, hi = m.group(3), int(m.group(4)), int(m.group(5))
        if kind == "ttmp":
            kind, lo, hi = "s", 108 + lo, 108 + hi
        return Operand(kind, lo, hi - lo + 1, neg=neg, abs=abs_, sext=sext, text=text)
    if tok in NAMED_SGPRS:
        idx, n = NAMED_SGPRS[tok]
        return Operand("s", idx, n, neg=neg, abs=abs_, sext=sext, text=text)
    if tok in ("src_scc", "scc"):
        return Operand("scc", text=text)
    if tok == "src_execz":
        return Operand("execz", text=text)
    if tok == "src_vccz":
        return Operand("vccz", text=text)
    if tok == "off":
        return Operand("off", text=text)
    if tok == "src_shared_base":
        return Operand("const", value=SHARED_APERTURE >> 32, text=text)
    if tok == "src_private_base":
        return Operand("const", value=PRIVATE_APERTURE >> 32, text=text)
    if tok in ("src_shared_limit", "src_private_limit"):
        base = SHARED_APERTURE if "shared" in tok else PRIVATE_APERTURE
        return Operand("const", value=(base >> 32) + 1, text=text)
    try:
        if re.match(r"^-?0x[0-9a-fA-F]+$", tok):
            return Operand("const", value=int(tok, 16), neg=neg, abs=abs_, text=text)
        if re.match(r"^-?\d+$", tok):
            return Operand("const", value=int(tok), neg=neg, abs=abs_, text=text)
        return Operand("const", value=float(tok), is_float=True, neg=neg, abs=abs_, text=text)
    except ValueError:
        raise OperandError(f"unknown operand {text!r}") from None


_INV_2PI = {16: 0x3118, 32: 0x3E22F983, 64: 0x3FC45F306DC9C882}


def float_bits(value: float, typ: str) -> int:
    if typ == "bf16":
        return struct.unpack("<I", struct.pack("<f", value))[0] >> 16
    w = WIDTH[typ]
    if abs(value - 0.15915494) < 1e-7:
        return _INV_2PI[w]
    if w == 16:
        return int(np.array(value, np.float16).view(np.uint16))
    if w == 32:
        return struct.unpack("<I", struct.pack("<f", value))[0]
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def const_bits(op: Operand, typ: str) -> int:
    """Raw bits (of the type's width) a constant operand supplies."""
    w = WIDTH[typ]
    if op.is_float:
        if typ not in FLOAT_TYPES:  # float inline constant on an integer operand: the f32/f64/f16 bits
            typ = {16: "f16", 32: "f32", 64: "f64"}[w]
        return float_bits(op.value, typ)
    v = int(op.value)
    if w == 64 and typ == "f64" and 0 <= v <= 0xFFFFFFFF and v > 64:
        return v << 32                 # a 32-bit f64 literal supplies the high dword
    return v & ((1 << w) - 1)


# ---- vector reads ---------------------------------------------------------------------------------

def row_of(op: Operand, acc_offset: int) -> int:
    return op.index + (acc_offset if op.kind == "a" else 0)


def _f16_to_f32(bits):
    return np.asarray(bits, np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def _bf16_to_f32(bits):
    return (np.asarray(bits, np.uint32) << np.uint32(16)).view(np.float32)


def raw_reader(op: Operand, acc_offset: int, width: int = 32):
    """Closure w -> uint32 (32-bit) or uint64 (64-bit) lanes/0-d value of an operand's raw bits."""
    if op.kind in ("v", "a"):
        r = row_of(op, acc_offset)
        if width == 64:
            return lambda w: w.v[r].astype(np.uint64) | (w.v[r + 1].astype(np.uint64) << np.uint64(32))
        return lambda w: w.v[r]
    if op.kind == "s":
        i = op.index
        if width == 64:
            return lambda w: np.array(w.s[i] | (w.s[i + 1] << 32), np.uint64)
        return lambda w: np.array(w.s[i], np.uint32)
    if op.kind == "const":
        typ = {16: "b16", 32: "b32", 64: "b64"}[width]
        c = np.array(const_bits(op, typ), np.uint64 if width == 64 else np.uint32)
        return lambda w: c
    if op.kind == "scc":
        return lambda w: np.array(w.scc, np.uint32)
    if op.kind == "execz":
        return lambda w: np.array(int(w.exec == 0), np.uint32)
    if op.kind == "vccz":
        return lambda w: np.array(int(w.vcc == 0), np.uint32)
    raise OperandError(f"cannot read operand {op.text!r}")


def typed_reader(op: Operand, typ: str, acc_offset: int, hi: bool = False, sel=None):
    """Closure w -> lanes of `typ` (f16/bf16 come back as float32, u16/i16 as uint32/int32).

    hi picks the upper 16 bits of a 32-bit register (op_sel); sel is an SDWA (shift, bits) selection.
    Float neg/abs modifiers are applied here.
    """
    width = WIDTH[typ]
    if op.kind == "const" and width in (16, 32):
        bits = const_bits(op, typ)
        raw = lambda w, c=np.array(bits, np.uint32): c  # noqa: E731
        hi = False if width == 16 else hi
    else:
        raw = raw_reader(op, acc_offset, 64 if width == 64 else 32)
    if sel is not None:
        shift, nbits, sext = sel
        if (shift, nbits) != (0, 32):
            mask = np.uint32((1 << nbits) - 1)
            base = raw
            if sext:
                sh = np.uint32(32 - nbits)
                raw = lambda w: ((((base(w) >> np.uint32(shift)) & mask) << sh).view(np.int32) >> sh).view(np.uint32)  # noqa: E731
            else:
                raw = lambda w: (base(w) >> np.uint32(shift)) & mask  # noqa: E731
    if width == 16 and hi:
        base16 = raw
        raw = lambda w: base16(w) >> np.uint32(16)  # noqa: E731
    if typ in ("b32", "u32"):
        f = raw
    elif typ == "i32":
        f = lambda w: raw(w).view(np.int32)  # noqa: E731
    elif typ == "f32":
        f = lambda w: raw(w).view(np.float32)  # noqa: E731
    elif typ in ("b16", "u16"):
        f = lambda w: raw(w) & np.uint32(0xFFFF)  # noqa: E731
    elif typ == "i16":
        f = lambda w: ((raw(w) << np.uint32(16)).view(np.int32) >> np.int32(16))  # noqa: E731
    elif typ == "f16":
        f = lambda w: _f16_to_f32(raw(w) & np.uint32(0xFFFF))  # noqa: E731
    elif typ == "bf16":
        f = lambda w: _bf16_to_f32(raw(w) & np.uint32(0xFFFF))  # noqa: E731
    elif typ in ("b64", "u64"):
        f = raw
    elif typ == "i64":
        f = lambda w: raw(w).view(np.int64)  # noqa: E731
    elif typ == "f64":
        f = lambda w: raw(w).view(np.float64)  # noqa: E731
    else:
        raise OperandError(f"unknown operand type {typ}")
    if typ in FLOAT_TYPES and (op.abs or op.neg):
        g = f
        if op.abs and op.neg:
            f = lambda w: -np.abs(g(w))  # noqa: E731
        elif op.abs:
            f = lambda w: np.abs(g(w))  # noqa: E731
        else:
            f = lambda w: -g(w)  # noqa: E731
    return f


# ---- vector writes --------------------------------------------------------------------------------

def to_bits(val, typ: str):
    """Typed lane values -> uint32 (or uint64 for 64-bit types) raw bits."""
    if typ == "f32":
        return np.asarray(val, np.float32).view(np.uint32)
    if typ in ("b32", "u32", "i32"):
        a = np.asarray(val)
        return a if a.dtype == np.uint32 else a.astype(np.int64).astype(np.uint32)
    if typ == "f16":
        return np.asarray(val, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    if typ == "bf16":
        return bf16_bits_rne(np.asarray(val, np.float32))
    if typ in ("b16", "u16", "i16"):
        return np.asarray(val).astype(np.int64).astype(np.uint32) & np.uint32(0xFFFF)
    if typ == "f64":
        return np.asarray(val, np.float64).view(np.uint64)
    if typ in ("b64", "u64", "i64"):
        a = np.asarray(val)
        return a if a.dtype == np.uint64 else a.astype(np.int64).view(np.uint64) if a.dtype.kind == "i" else a.astype(np.uint64)
    raise OperandError(f"unknown result type {typ}")


def bf16_bits_rne(f32: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even; NaNs stay NaN (quieted)."""
    u = np.asarray(f32, np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(f32, np.float32))
    return np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), r).astype(np.uint32)


def exec_mask(w):
    """None when every lane is active, else the boolean lane mask (all-False arrays included); for a lockstep
    batch whose waves' EXEC differ (its SGPR reads give (waves, 1) arrays), the (waves, 64) masks."""
    ex = w.s[EXEC_LO] | (w.s[EXEC_HI] << 32)
    if type(ex) is np.ndarray:
        return lane_masks(ex)
    return None if ex == FULL else lane_mask(ex)


def store_row(w, row: int, bits, mask) -> None:
    if mask is None:
        w.v[row] = bits
    elif type(w.v) is np.ndarray:
        np.copyto(w.v[row], bits, where=mask)
    else:
        w.v.where(row, bits, mask)      # a lockstep batch's rows (lockstep._Rows, _IndexedRows)


def row_writer(op: Operand, typ: str, acc_offset: int, hi: bool = False):
    """Closure (w, value, mask) -> None writing a typed result into a VGPR/AGPR (exec handled by caller)."""
    if not op.is_vector:
        raise OperandError(f"expected a vector register destination, got {op.text!r}")
    r = row_of(op, acc_offset)
    width = WIDTH[typ]
    if width == 64:
        def wr(w, val, mask):
            b = np.broadcast_to(to_bits(val, typ), w.v.shape[1:])   # (64,), or (waves, 64) in lockstep
            store_row(w, r, (b & np.uint64(0xFFFFFFFF)).astype(np.uint32), mask)
            store_row(w, r + 1, (b >> np.uint64(32)).astype(np.uint32), mask)
        return wr
    if width == 16:
        if hi:
            def wr(w, val, mask):
                b = (to_bits(val, typ) << np.uint32(16)) | (w.v[r] & np.uint32(0xFFFF))
                store_row(w, r, b, mask)
        else:
            def wr(w, val, mask):
                store_row(w, r, to_bits(val, typ), mask)
        return wr

    def wr(w, val, mask):
        store_row(w, r, to_bits(val, typ), mask)
    return wr


# ---- scalar reads/writes --------------------------------------------------------------------------

def scalar_reader(op: Operand, width: int = 32, signed: bool = False):
    """Closure w -> Python int of the operand (SGPR, constant or special)."""
    mask = (1 << width) - 1
    if op.kind == "s":
        i = op.index
        if width == 64:
            f = lambda w: w.s[i] | (w.s[i + 1] << 32)  # noqa: E731
        else:
            f = lambda w: w.s[i]  # noqa: E731
    elif op.kind == "const":
        if op.is_float:
            c = const_bits(op, "f64" if width == 64 else "f32")
        else:
            c = int(op.value) & mask
        f = lambda w: c  # noqa: E731
    elif op.kind == "scc":
        f = lambda w: w.scc  # noqa: E731
    elif op.kind == "execz":
        f = lambda w: int(w.exec == 0)  # noqa: E731
    elif op.kind == "vccz":
        f = lambda w: int(w.vcc == 0)  # noqa: E731
    else:
        raise OperandError(f"cannot read {op.text!r} as a scalar")
    if signed:
        top = 1 << (width - 1)
        g = f
        f = lambda w: ((g(w) & mask) ^ top) - top  # noqa: E731
    return f


def scalar_writer(op: Operand, width: int = 32):
    if op.kind != "s":
        raise OperandError(f"expected an SGPR destination, got {op.text!r}")
    i = op.index
    if width == 64:
        def wr(w, val):
            w.s[i] = val & 0xFFFFFFFF
            w.s[i + 1] = (val >> 32) & 0xFFFFFFFF
    else:
        def wr(w, val):
            w.s[i] = val & 0xFFFFFFFF
    return wr
