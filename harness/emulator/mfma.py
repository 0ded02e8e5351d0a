"""gfx950 (CDNA4, wave64) matrix fused-multiply-add: operand layouts and arithmetic.

D = C + A (MxK) @ B (KxN), each operand spread over 64 lanes x some registers. Every layout lives in the
small functions `_ab_layout` and `_cd_layout` below, so a wrong one is fixed in one place.

Arithmetic (all forms): operands are decoded exactly to float64, every product A*B is exact in float64, the
K products (times the block scales) are summed in float64 (np.matmul order), C is added in float64 and the
result is rounded once to float32 (RNE). The hardware's internal accumulation width/order is not bit-specified
in public documents, so results can differ from silicon in the last bit(s) of large-K sums: compare with an
fp32 tolerance, not bit-exactly. Integer forms (i8) are exact: int64 sum, + C, wrapped to int32.

Layout evidence (lane l, element e of the lane, registers packed low bits first):
  * Non-f8f6f4 forms (bf16/f16/fp8/bf8/i8/f32): with G = 64 / M lane groups and kpl = K / G values per lane,
      A: lane l holds A[l % M][kpl*(l // M) + e];  B: lane l holds B[kpl*(l // N) + e][l % N].
    Source: AMD Matrix Instruction Calculator (ROCm/amd_matrix_instruction_calculator, CDNA3 tables for
    v_mfma_f32_16x16x16_bf16, 32x32x8_bf16, 16x16x32_fp8_fp8, 32x32x16_fp8_fp8, 16x16x32_i8, 16x16x4_f32),
    and the ROCm CDNA3/CDNA4 matrix-core blog (32x32x16 fp8: A + (l/32)*8 + (l%32)*16). The gfx950-only
    double-K forms (16x16x32 / 32x32x16 bf16 & f16, 16x16x64 / 32x32x32 i8) are given the same rule
    (8 resp. 16 contiguous K per lane) - GFX950.md's reading of the ROCm blog; UNSURE until FlyDSL's
    hardware-checked bf16 GEMM / flash attention run here.
  * f8f6f4 forms (v_mfma[_scale]_f32_16x16x128_f8f6f4, _32x32x64_f8f6f4), per operand format:
      FP8/BF8 (8 regs, 32 bytes): e = 16h + j -> k = (K/2)*h + 16*(l // M) + j   (two K halves)
      FP6/BF6 (6 regs), FP4 (4 regs): 32 values -> k = 32*(l // M) + e  (contiguous; 6- or 4-bit fields
      packed from bit 0 of the first register, an FP6 value may straddle two registers).
    FP8 and FP4 for 32x32x64: ROCm CDNA4 matrix-core blog (HIP examples 5.4 / 5.5:
    a_reg[i*16+j] = A[l%32][16*(l/32) + 32*i + j]; FP4: 32 contiguous nibbles from (l%32)*32 + (l/32)*16 bytes).
    16x16x128 FP4 also matches GFX950.md. 16x16x128 FP8 two-halves rule: by analogy with the 32x32x64
    blog example and GFX950.md's "probably" - UNSURE. FP6 contiguous: by analogy with FP4 (FP6 and FP4 run
    at the same rate, FP8 at half, i.e. FP8 is two K passes) - UNSURE.
  * C/D (f32 or i32):
      16x16: register r, lane l -> D[4*(l // 16) + r][l % 16]
      32x32: register r, lane l -> D[8*(r // 4) + 4*(l // 32) + r % 4][l % 32]
    Source: the AMD calculator's CDNA3 32x32 D tables and the CDNA4 blog's 32x32x64 store loop
    (C[l%32 + (l/32)*4*32 + 32*j + i*32*8] = c_reg[4i + j]) agree; GFX950.md's "UNSURE" 32x32 mapping is
    taken as settled by these two AMD sources.
  * Scales (v_mfma_scale_*): scale_a / scale_b hold 4 E8M0 bytes per lane; A uses byte
    op_sel[0] + 2*op_sel_hi[0], B byte op_sel[1] + 2*op_sel_hi[1] (GFX950.md, checked on LLVM 22). Lane l's
    byte scales row (A) / column (B) l % M of K-block l // M (32 K values per block): 4 blocks for
    16x16x128, 2 for 32x32x64 (CDNA4 blog: "each thread stores 1 entry of Ax (32x2)"). E8M0 255 = NaN
    (-> NaN products). The scales multiply each 32-wide block sum (exact power-of-two scaling here).
  * Evidence from FlyDSL kernels that FlyDSL's CI checks on MI355X, run here on CPU tensors against torch
    (tests/test_upstream_evidence.py; kernels/shapes/cosines listed there). Note that a K permutation
    applied to BOTH operands of one MFMA leaves D unchanged, so for same-format operands (bf16 x bf16, fp8 x
    fp8, fp4 x fp4) only the A/B pairing and the scale blocks are observable; the per-format K orders are
    pinned by mixed-format runs:
      - FP8 two K halves: mxfp4_preshuffle fp8 x fp4 matches torch (cos 0.99999+); with FP8 contiguous it
        gives cos 0.23. FP6 contiguous (packed 6-bit fields from bit 0): fp6 x fp4 matches; the two-halves
        alternative gives cos 0.23. FP4 contiguous: fp4 x fp4 with per-32 scales matches; two halves
        gives cos 0.92. Scale byte = op_sel + 2*op_sel_hi: swapping the two gives cos 0.75.
      - 32x32 C/D row mapping above: flash_attn_gfx950 (v_mfma_f32_32x32x16_bf16, softmax across the
        accumulator rows) matches sdpa (cos 0.99999+); rows 16*(l//32)+r gives cos 0.27.
  * ds_read_b64_tr_b16 is an LDS op (ops_memory.py) but exists only to build MFMA operands; its lane
    permutation lives here in `ds_read_tr_sources` (settled by gemm_a16w16_gfx950 nn/tn/tt and flash
    attention, see that function).
  * cbsz/abid/blgp on non-f8f6f4 forms are broadcast/lane-group controls that FlyDSL kernels do not use:
    nonzero values raise NotImplementedError (never a silent wrong result); so does neg (LLVM 22 rejects it
    on gfx950 MFMA).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from . import numerics

# f8f6f4 format codes (cbsz for A, blgp for B)
F8F6F4_FORMATS = {0: "fp8_e4m3", 1: "bf8_e5m2", 2: "fp6_e2m3", 3: "bf6_e3m2", 4: "fp4_e2m1"}
_BITS = {"bf16": 16, "f16": 16, "f32": 32, "i8": 8, **{f: numerics.WIDTH[f] for f in F8F6F4_FORMATS.values()}}
_NAME_FMT = {"bf16": "bf16", "f16": "f16", "f32": "f32", "i8": "i8", "fp8": "fp8_e4m3", "bf8": "bf8_e5m2"}


@dataclass(frozen=True)
class Form:
    mnemonic: str
    M: int
    N: int
    K: int
    a_fmt: str | None       # None: chosen by cbsz (f8f6f4)
    b_fmt: str | None       # None: chosen by blgp
    out: str                # "f32" or "i32"
    f8f6f4: bool = False
    scaled: bool = False


def _parse(mnemonic: str) -> Form:
    m = re.fullmatch(r"v_mfma_(scale_)?(f32|i32)_(\d+)x(\d+)x(\d+)_?(\w+)", mnemonic)
    if not m:
        raise NotImplementedError(f"MFMA {mnemonic} is not modelled")
    scaled, out, M, N, K, ty = m.group(1) is not None, m.group(2), *map(int, m.group(3, 4, 5)), m.group(6)
    if ty == "f8f6f4":
        return Form(mnemonic, M, N, K, None, None, out, True, scaled)
    parts = ty.split("_")
    fa, fb = (parts * 2)[:2] if len(parts) == 1 else parts
    if fa not in _NAME_FMT or fb not in _NAME_FMT or scaled:
        raise NotImplementedError(f"MFMA {mnemonic} is not modelled")
    return Form(mnemonic, M, N, K, _NAME_FMT[fa], _NAME_FMT[fb], out)


FORMS = {f.mnemonic: f for f in map(_parse, [
    "v_mfma_f32_16x16x32_bf16", "v_mfma_f32_32x32x16_bf16", "v_mfma_f32_16x16x32_f16", "v_mfma_f32_32x32x16_f16",
    "v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x16_f16", "v_mfma_f32_32x32x8_bf16", "v_mfma_f32_32x32x8_f16",
    "v_mfma_f32_16x16x4_f32", "v_mfma_f32_32x32x2_f32",
    "v_mfma_i32_16x16x64_i8", "v_mfma_i32_32x32x32_i8", "v_mfma_i32_16x16x32_i8", "v_mfma_i32_32x32x16_i8",
    *[f"v_mfma_f32_{s}_{a}_{b}" for s in ("16x16x32", "32x32x16") for a in ("fp8", "bf8") for b in ("fp8", "bf8")],
    "v_mfma_f32_16x16x128_f8f6f4", "v_mfma_f32_32x32x64_f8f6f4",
    "v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4",
])}
MFMA_MNEMONICS = frozenset(FORMS)


def _form(mnemonic: str) -> Form:
    f = FORMS.get(mnemonic)
    if f is None:
        raise NotImplementedError(f"MFMA {mnemonic} is not modelled")
    return f


def operand_formats(mnemonic: str, mods: dict) -> tuple[str, str]:
    f = _form(mnemonic)
    if not f.f8f6f4:
        return f.a_fmt, f.b_fmt
    try:
        return F8F6F4_FORMATS[int(mods.get("cbsz", 0))], F8F6F4_FORMATS[int(mods.get("blgp", 0))]
    except KeyError:
        raise NotImplementedError(f"{mnemonic}: cbsz/blgp {mods.get('cbsz')}/{mods.get('blgp')} is not a format")


# --------------------------------------------------------------------------------------------- layouts

@lru_cache(maxsize=None)
def _ab_layout(mnemonic: str, fmt: str, which: str):
    """(nregs, width, outer, k): element e of lane l sits at bits [width*e, +width) of the lane's register
    tuple and is A[outer[l, e]][k[l, e]] (which="a") or B[k[l, e]][outer[l, e]] (which="b")."""
    f = _form(mnemonic)
    MN = f.M if which == "a" else f.N
    width = _BITS[fmt]
    lane = np.arange(64)[:, None]
    group = lane // MN                                  # lane group: 64 / MN groups
    if f.f8f6f4:
        e = np.arange(32)[None, :]
        if width == 8:                                  # FP8/BF8: two K halves of 16 bytes
            k = (f.K // 2) * (e // 16) + 16 * group + e % 16
        else:                                           # FP6/FP4: 32 contiguous K values
            k = 32 * group + e
    else:
        kpl = f.K // (64 // MN)
        e = np.arange(kpl)[None, :]
        k = kpl * group + e
    outer = np.broadcast_to(lane % MN, k.shape)
    nregs = k.shape[1] * width // 32
    return nregs, width, np.ascontiguousarray(outer), np.ascontiguousarray(k)


@lru_cache(maxsize=None)
def _cd_layout(M: int):
    """(row, col), each (nregs, 64): register r of lane l holds D[row[r, l]][col[r, l]]."""
    lane = np.arange(64)[None, :]
    if M == 16:
        r = np.arange(4)[:, None]
        return 4 * (lane // 16) + r + 0 * lane, np.broadcast_to(lane % 16, (4, 64)).copy()
    r = np.arange(16)[:, None]
    return 8 * (r // 4) + 4 * (lane // 32) + r % 4, np.broadcast_to(lane % 32, (16, 64)).copy()


@lru_cache(maxsize=None)
def ds_read_tr_sources(bits: int) -> tuple[np.ndarray, np.ndarray]:
    """ds_read_b64_tr_b{bits} (gfx950 transposing LDS read), per block of 16 lanes: every lane addresses one
    64-bit chunk (E = 64 // bits elements); element j of lane i in the result is element src_elem[i, j] of
    the chunk addressed by lane src_lane[i, j] of the same block:
        src_lane = (16 // E) * j + i // E,   src_elem = i % E.
    I.e. the chunks of lanes c, c + 16/E, c + 2*16/E, ... are the E rows of one E x E tile, transposed into
    lanes E*c .. E*c+E-1 ("interleaved" transposes: b16 = four interleaved 4x4, b8 = two interleaved 8x8 -
    the wording of Modular's ds_read_tr8_b64 docs - and b4 = one 16x16).
    Evidence (b16): FlyDSL's gemm_a16w16_gfx950 (B or A read with ds_read_b64_tr_b16) matches torch for
    layouts nn/tn/tt (cos 0.99999+) only with this rule; the earlier model (consecutive groups of E lanes
    transposed) gave cos 0.25/0.06/0.24, and flash_attn_gfx950 (V via tr_b16) 0.26 instead of 0.99999.
    b8 and b4 follow the same rule by analogy: UNSURE (no hardware-checked kernel run here uses them)."""
    E = 64 // bits
    i = np.arange(16)[:, None]
    j = np.arange(E)[None, :]
    return (16 // E) * j + i // E + 0 * j, np.broadcast_to(i % E, (16, E)).copy()


def ds_read_tr(bits: int, chunks: np.ndarray) -> np.ndarray:
    """Apply ds_read_b64_tr_b{bits}: chunks (..., 64, 8) uint8 = the 8 bytes each lane addressed -> (..., 64, 8)
    uint8 = the 8 bytes each lane receives (its 2 destination dwords, little-endian); leading axes: waves
    (lockstep), each transposed on its own."""
    chunks = np.asarray(chunks, np.uint8)
    lead = chunks.shape[:-2]
    chunks = chunks.reshape(lead + (4, 16, 8))
    src_lane, src_elem = ds_read_tr_sources(bits)
    if bits in (8, 16):
        el = chunks.view(np.uint8 if bits == 8 else np.uint16)             # (..., 4, 16, E)
        return np.ascontiguousarray(el[..., src_lane, src_elem]).view(np.uint8).reshape(lead + (64, 8))
    if bits == 4:
        nib = np.stack([chunks & 0xF, chunks >> 4], axis=-1).reshape(lead + (4, 16, 16))
        out = nib[..., src_lane, src_elem].reshape(lead + (4, 16, 8, 2))
        return (out[..., 0] | (out[..., 1] << 4)).astype(np.uint8).reshape(lead + (64, 8))
    raise ValueError(f"ds_read_b64_tr_b{bits} does not exist")


def operand_regs(mnemonic: str, mods: dict) -> tuple[int, int, int]:
    """Register counts (a_regs, b_regs, c_regs) of one lane."""
    f = _form(mnemonic)
    fa, fb = operand_formats(mnemonic, mods)
    return _ab_layout(mnemonic, fa, "a")[0], _ab_layout(mnemonic, fb, "b")[0], f.M * f.N // 64


# --------------------------------------------------------------------------------------------- pack/unpack

def _decode(fmt: str, codes: np.ndarray) -> np.ndarray:
    if fmt == "i8":
        return codes.astype(np.uint8).view(np.int8).astype(np.int64)
    if fmt == "f32":
        return codes.astype(np.uint32).view(np.float32).astype(np.float64)
    return numerics.decode64(fmt, codes)


def unpack_ab(mnemonic: str, which: str, regs: np.ndarray, mods: dict) -> np.ndarray:
    """Registers (nregs, 64) -> element codes as a matrix: A (M, K) or B (K, N), uint32."""
    f = _form(mnemonic)
    fmt = operand_formats(mnemonic, mods)[0 if which == "a" else 1]
    nregs, width, outer, k = _ab_layout(mnemonic, fmt, which)
    regs = np.asarray(regs, dtype=np.uint32)
    if regs.shape[0] < nregs:
        raise ValueError(f"{mnemonic}: operand {which} needs {nregs} registers, got {regs.shape[0]}")
    codes = numerics._unpack_bits(regs[:nregs], width, k.shape[1])          # (64, E)
    mat = np.zeros((f.M, f.K) if which == "a" else (f.K, f.N), dtype=np.uint32)
    if which == "a":
        mat[outer, k] = codes
    else:
        mat[k, outer] = codes
    return mat


def pack_ab(mnemonic: str, which: str, mat_codes: np.ndarray, mods: dict) -> np.ndarray:
    """Element codes A (M, K) / B (K, N) -> registers (nregs, 64) (inverse of unpack_ab; for tests/tools)."""
    fmt = operand_formats(mnemonic, mods)[0 if which == "a" else 1]
    nregs, width, outer, k = _ab_layout(mnemonic, fmt, which)
    mat = np.asarray(mat_codes).astype(np.uint32)
    codes = mat[outer, k] if which == "a" else mat[k, outer]
    return numerics._pack_bits(codes & np.uint32((1 << width) - 1), width, nregs)


def unpack_cd(mnemonic: str, regs: np.ndarray) -> np.ndarray:
    """Registers (c_regs, 64) -> raw 32-bit matrix (M, N)."""
    f = _form(mnemonic)
    row, col = _cd_layout(f.M)
    mat = np.zeros((f.M, f.N), dtype=np.uint32)
    mat[row, col] = np.asarray(regs, dtype=np.uint32)[: row.shape[0]]
    return mat


def pack_cd(mnemonic: str, mat_bits: np.ndarray) -> np.ndarray:
    """Raw 32-bit matrix (M, N) -> registers (c_regs, 64)."""
    f = _form(mnemonic)
    row, col = _cd_layout(f.M)
    return np.asarray(mat_bits, dtype=np.uint32)[row, col]


# --------------------------------------------------------------------------------------------- execute

def _check_mods(f: Form, mods: dict) -> None:
    if any(int(x) for x in (mods.get("neg") or [])):
        raise NotImplementedError(f"{f.mnemonic}: neg is not modelled (LLVM 22 rejects it on gfx950 MFMA)")
    if int(mods.get("abid", 0)):
        raise NotImplementedError(f"{f.mnemonic}: abid broadcast is not modelled")
    if not f.f8f6f4 and (int(mods.get("cbsz", 0)) or int(mods.get("blgp", 0))):
        raise NotImplementedError(f"{f.mnemonic}: cbsz/blgp broadcast is not modelled")
    if not f.scaled and (any(int(x) for x in (mods.get("op_sel") or []))
                         or any(int(x) for x in (mods.get("op_sel_hi") or []))):
        raise NotImplementedError(f"{f.mnemonic}: op_sel/op_sel_hi are not modelled on unscaled MFMA")


def scale_bytes(mods: dict) -> tuple[np.ndarray, np.ndarray]:
    """The E8M0 byte each lane contributes for A and for B (uint32 (64,) each)."""
    ops = [int(x) for x in (mods.get("op_sel") or [])] + [0, 0]
    hi = [int(x) for x in (mods.get("op_sel_hi") or [])] + [0, 0]
    sel_a, sel_b = ops[0] + 2 * hi[0], ops[1] + 2 * hi[1]
    sa = (np.asarray(mods["scale_a"], dtype=np.uint32) >> np.uint32(8 * sel_a)) & 0xFF
    sb = (np.asarray(mods["scale_b"], dtype=np.uint32) >> np.uint32(8 * sel_b)) & 0xFF
    return sa, sb


def _scale_matrices(f: Form, mods: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per-element scales: SA (M, K) and SB (K, N) as float64 powers of two (NaN for E8M0 255)."""
    sa, sb = scale_bytes(mods)
    lane = np.arange(64)
    nblk = 64 // f.M
    ga = np.zeros((f.M, nblk))
    ga[lane % f.M, lane // f.M] = numerics.decode64("e8m0", sa)
    gb = np.zeros((f.N, nblk))
    gb[lane % f.N, lane // f.N] = numerics.decode64("e8m0", sb)
    kblk = np.arange(f.K) // 32
    return ga[:, kblk], gb[:, kblk].T


def execute(mnemonic: str, a, b, c, mods: dict) -> np.ndarray:
    """One MFMA for the whole wave: a (a_regs, 64), b (b_regs, 64), c (c_regs, 64) uint32 -> D (c_regs, 64).
    For v_mfma_scale_* mods must hold scale_a / scale_b (uint32 (64,): the scale VGPR of each lane)."""
    f = _form(mnemonic)
    _check_mods(f, mods)
    fa, fb = operand_formats(mnemonic, mods)
    A = _decode(fa, unpack_ab(mnemonic, "a", a, mods))
    B = _decode(fb, unpack_ab(mnemonic, "b", b, mods))
    C = unpack_cd(mnemonic, c)
    if f.out == "i32":
        D = A @ B + C.view(np.int32).astype(np.int64)
        return pack_cd(mnemonic, D.astype(np.int64).astype(np.uint32))
    with np.errstate(invalid="ignore", over="ignore"):
        if f.scaled:
            SA, SB = _scale_matrices(f, mods)
            A, B = A * SA, B * SB
        D = A @ B + C.view(np.float32).astype(np.float64)
        return pack_cd(mnemonic, D.astype(np.float32).view(np.uint32))


# --------------------------------------------------------------------------------------------- fast path
#
# The same arithmetic as execute(), for the forms the kernels run (f8f6f4 with FP8/BF8/FP4 operands, scaled
# or not; bf16 / f16 / fp8 / bf8 ones: attention, GEMMs), with the per-call layout work done once per
# instruction: the register bytes (halfwords for 16-bit formats) are gathered straight into matrix order
# with a precomputed index and decoded with one table lookup (np.take, faster than fancy indexing here).
# Every array that reaches a floating-point operation has the same values, shape and memory layout
# (strides) as in execute(), so numpy runs the same loops and results are bitwise equal, NaN payloads and
# signs included (test_mfma.py::test_fast_path_bitwise, test_fast_path_float_forms check it).

@lru_cache(maxsize=None)
def _gather_plan(mnemonic: str, fmt: str, which: str):
    """How to build the operand matrix (A (M, K) / B (K, N), C order) straight from the register bytes
    (the operand's (nregs, 64) uint32 rows viewed as bytes, register-major): (nregs, byte_index, shift)
    with element i = code (bytes[byte_index[i]] >> shift[i]) & field mask; None when fields are not whole
    bytes / nibbles or the layout does not hold every matrix element exactly once."""
    f = _form(mnemonic)
    nregs, width, outer, k = _ab_layout(mnemonic, fmt, which)
    if width not in (4, 8) or fmt not in numerics._LUT64:
        return None
    flat, size = _element_index(f, outer, k, which)
    if flat is None:
        return None
    lane = np.arange(64)[:, None]
    bit = width * np.arange(k.shape[1])[None, :]         # element e at bits [width*e, +width) of the lane
    src_byte = ((bit // 32) * 256 + 4 * lane + (bit % 32) // 8).ravel()   # register-major byte index
    src_shift = np.broadcast_to(bit % 8, k.shape).ravel()
    byte_index = np.empty(size, np.intp)
    shift = np.empty(size, np.uint8)
    byte_index[flat], shift[flat] = src_byte, src_shift
    return nregs, byte_index, shift


def _element_index(f, outer, k, which: str):
    """(flat, size): each operand slot's element index in the matrix (A row-major M x K, B K x N), and the
    element count; flat None when the layout does not hold every element exactly once."""
    flat = (outer * f.K + k if which == "a" else k * f.N + outer).ravel()
    size = f.M * f.K if which == "a" else f.K * f.N
    return (flat if flat.size == size and np.unique(flat).size == size else None), size


@lru_cache(maxsize=None)
def _half_plan(mnemonic: str, fmt: str, which: str):
    """_gather_plan for 16-bit elements (bf16 / f16 forms): (nregs, half_index) with element i = the
    register file's halfword half_index[i] (the (nregs, 64) uint32 rows viewed as uint16, register-major);
    None when the layout does not hold every matrix element exactly once."""
    f = _form(mnemonic)
    nregs, width, outer, k = _ab_layout(mnemonic, fmt, which)
    if width != 16:
        return None
    flat, size = _element_index(f, outer, k, which)
    if flat is None:
        return None
    lane = np.arange(64)[:, None]
    e = np.arange(k.shape[1])[None, :]
    src = ((e // 2) * 128 + 2 * lane + e % 2).ravel()       # element e: register e // 2, half e % 2
    half_index = np.empty(size, np.intp)
    half_index[flat] = src
    return nregs, half_index


@lru_cache(maxsize=None)
def _lut16(fmt: str) -> np.ndarray:
    """decode64 of every 16-bit code (bf16 / f16): a table lookup gives decode64's bits element by element."""
    return numerics.decode64(fmt, np.arange(1 << 16, dtype=np.uint32))


@lru_cache(maxsize=None)
def _byte_decoder(mnemonic: str, fmt: str, which: str):
    """(nregs, decode, decode_many): decode(regs (nregs, 64) uint32, C-contiguous) -> the operand matrix of
    exact float64 values (copies of numerics' decode-table entries, NaN bits too); decode_many(regs (waves,
    nregs, 64) uint32, C-contiguous) -> (waves, matrix size) the same values per wave; None (see
    _gather_plan / _half_plan)."""
    f = _form(mnemonic)
    shape = (f.M, f.K) if which == "a" else (f.K, f.N)
    if fmt in ("bf16", "f16"):
        hplan = _half_plan(mnemonic, fmt, which)
        if hplan is None:
            return None
        nregs, half_index = hplan
        lut = _lut16(fmt)
        return (nregs, lambda regs: lut.take(regs.view(np.uint16).reshape(-1).take(half_index)).reshape(shape),
                lambda regs: lut.take(regs.view(np.uint16).reshape(regs.shape[0], -1).take(half_index, axis=1)))
    plan = _gather_plan(mnemonic, fmt, which)
    if plan is None:
        return None
    nregs, byte_index, shift = plan
    lut = numerics._LUT64[fmt]

    def raw(regs):
        return regs.view(np.uint8).reshape(regs.shape[0], -1)
    if numerics.WIDTH[fmt] == 8:
        return (nregs, lambda regs: lut.take(regs.view(np.uint8).reshape(-1).take(byte_index)).reshape(shape),
                lambda regs: lut.take(raw(regs).take(byte_index, axis=1)))
    # FP4: every byte decoded to its value pair (low nibble first) in register order, then one gather of the
    # values into the matrix (half the index work of gathering nibbles, then decoding them)
    pair = np.ascontiguousarray(np.stack([lut[np.arange(256) & 0xF], lut[np.arange(256) >> 4]], axis=1))
    nibble = 2 * byte_index + (shift >> 2)                  # the element's index in the pair-decoded bytes

    def many(regs):
        return pair.take(raw(regs), axis=0).reshape(regs.shape[0], -1).take(nibble, axis=1)
    if (byte_index[0::2] == byte_index[1::2]).all() and not shift[0::2].any() and (shift[1::2] == 4).all():
        # both nibbles of each byte adjacent in the matrix (A): the pairs are already in matrix order
        first = byte_index[0::2].copy()
        return nregs, lambda regs: pair.take(regs.view(np.uint8).reshape(-1).take(first), axis=0).reshape(shape), many
    return nregs, lambda regs: lut.take((regs.view(np.uint8).reshape(-1).take(byte_index) >> shift) & 0xF
                                        ).reshape(shape), many


@lru_cache(maxsize=None)
def _cd_gather(M: int):
    """perm with D-matrix.ravel() = regs.ravel()[perm] (inverse of _cd_layout's scatter)."""
    row, col = _cd_layout(M)
    N = M                                             # the square forms only (16x16, 32x32)
    flat = (row * N + col).ravel()
    perm = np.empty(flat.size, np.intp)
    perm[flat] = np.arange(flat.size)
    return perm


class _Recent:
    """An operand of a whole group that fast_executor's lockstep form met lately (_RecentOperands): its form,
    wave count, register rows and scale rows (copies: (waves, regs, 64) and (waves, 64) uint32), its values,
    and what the calls that met it learnt about the group's B operands (b_part, _distinct_rows' answer for the
    last B: the MFMAs of a K-step meet one grouping of B tiles)."""

    __slots__ = ("key", "regs", "scales", "value", "b_part", "_data")

    def __init__(self, key, regs, scales, value):
        self.key, self.regs, self.scales, self.value = key, regs, scales, value
        self.b_part = self._data = None

    @property
    def data(self) -> bytes:
        if self._data is None:
            self._data = _RecentOperands.data(self.regs, self.scales)
        return self._data


class _RecentOperands:
    """The A operands fast_executor's lockstep form decoded (and scaled) last: the MFMAs of one K-step often
    multiply one A tile, with the same scales, by several B tiles, and lockstep interleaves a few wave groups
    between barriers. Equal form, register bytes and scale bytes give equal values, so a kept copy is reused
    as it is (never written: it only enters the product)."""

    def __init__(self, size=4):
        self.size, self.entries = size, []          # _Recent, the newest first

    @staticmethod
    def data(regs, scales) -> bytes:
        """What decides the values besides the form: the shape, the register bytes and the scale bytes."""
        return repr(regs.shape).encode() + regs.tobytes() + (b"" if scales is None else scales.tobytes())

    def get(self, key, regs, scales):
        """The entry of this form whose rows equal these arrays', or None."""
        data = self.data(regs, scales)
        return self._first(lambda e: e.key == key and e.data == data)

    def get_at(self, key, nw, lib, a_src, s_src):
        """get() for operands at sources of the compiled library (_Sources): its rows compared in place."""
        def same(e):
            return (e.key == key and len(e.regs) == nw and a_src.equal(lib, e.regs)
                    and (s_src is None or s_src.equal(lib, e.scales)))
        return self._first(same)

    def _first(self, match):
        for n, e in enumerate(self.entries):
            if match(e):
                if n:
                    self.entries.insert(0, self.entries.pop(n))
                return e
        return None

    def put(self, key, regs, scales, value):
        """Keep copies (a caller's arrays may be views of the register file, which later instructions
        write)."""
        e = _Recent(key, regs.copy(), None if scales is None else scales.copy(), value)
        self.entries.insert(0, e)
        del self.entries[self.size:]
        return e


_RECENT_A = _RecentOperands()
_PLANNED_FROM = [None]      # the (_ab_layout, _cd_layout) pair the plan caches were filled from


def _plans_for_current_layouts():
    """The current (_ab_layout, _cd_layout), with the fast path's plan caches (filled from the layouts)
    cleared if they were filled from another pair: a test that swaps in a wrong layout
    (test_upstream_evidence) must get plans from it, and the code after it plans from the restored one."""
    layouts = (_ab_layout, _cd_layout)
    if _PLANNED_FROM[0] != layouts:
        for cached in (_gather_plan, _half_plan, _byte_decoder, _cd_gather, _fp4_b_plan, _cd_axes, _cd_row_starts):
            cached.cache_clear()
        _PLANNED_FROM[0] = layouts
    return layouts
# waves per numpy pass in fast_executor's many: a 16x16x128 operand is 16 KiB of float64 per wave, and a few
# such temporaries per pass fall out of a CPU core's cache past ~8 waves (README.md: Speed)
MANY_WAVES = 8
# odd 64-bit multipliers: a row's hash is the wrapping dot product of its 64-bit words with these
_ROW_HASH = (np.random.default_rng(0x6D666D61).integers(0, 1 << 62, 2048, dtype=np.uint64) << np.uint64(1)) | 1
_ALL_DISTINCT = ()              # a _Recent.b_part: no two B operands of the group were equal (or too few)
# B operands are decoded once per distinct wave only when at most this share of the group's are distinct
# (checking the equal ones costs about what decoding a third of them saves)
DEDUPE_AT = 0.5
_ROWS_A = {}                    # (mnemonic, A format, scale byte) -> _RowCache of decoded, scaled A rows
ROW_CACHE = 512                 # rows a _RowCache keeps (16 KiB of float64 each for the f8f6f4 forms)


def _row_hashes(parts, n):
    """Each wave's hash over its bytes in every part (the parts' rows whole 64-bit words): a list of n ints,
    or None when the rows are longer than _ROW_HASH."""
    h, off = None, 0
    for p in parts:
        words = p.reshape(n, -1).view(np.uint64)
        if off + words.shape[1] > _ROW_HASH.size:
            return None
        x = words @ _ROW_HASH[off: off + words.shape[1]]
        h = x if h is None else h + x
        off += words.shape[1]
    return h.tolist()


def _same_rows(parts, dup, rep) -> bool:
    """Are the bytes of wave dup[i] those of wave rep[i], for every i and part?"""
    for p in parts:
        if not (p.take(dup, axis=0) == p.take(rep, axis=0)).all():
            return False
    return True


def _classes(h, waves):
    """(first, inverse) of the hash values h[i] of these waves: first[j] the first wave of the j-th distinct
    value, inverse[k] the class of waves[k]."""
    seen, first, inv = {}, [], []
    for i in waves:
        j = seen.get(h[i])
        if j is None:
            j = seen[h[i]] = len(first)
            first.append(i)
        inv.append(j)
    return np.array(first, np.intp), np.array(inv, np.intp)


def _distinct_rows(*parts):
    """The equal waves of a group (lockstep: the waves of a workgroup often read one staged tile). parts:
    (waves, ...) C-contiguous arrays, or None (skipped), each wave's bytes whole 64-bit words; waves are equal
    when every part's bytes are. _ALL_DISTINCT when no two waves are found equal, else (first, inverse, dup,
    rep): intp arrays with first[j] the first wave of the j-th distinct row (increasing), wave i equal to wave
    first[inverse[i]], and dup the waves that are not first, rep their first. A hash of each row finds the
    candidates and a byte compare confirms them (on a hash collision between different rows the waves are
    all taken as distinct: only the dedupe is lost)."""
    parts = [p for p in parts if p is not None]
    n = parts[0].shape[0]
    h = _row_hashes(parts, n)
    if h is None:
        return _ALL_DISTINCT
    first, inv = _classes(h, range(n))
    if len(first) == n:
        return _ALL_DISTINCT
    rep = first.take(inv)
    dup = np.flatnonzero(rep != np.arange(n))
    rep = rep.take(dup)
    if not _same_rows(parts, dup, rep):
        return _ALL_DISTINCT
    return first, inv, dup, rep


class _RowCache:
    """Decoded (scaled) operand rows by content, for the rows that come back in other groups (lockstep
    regroups waves at barriers and between workgroup batches; a token tile's A meets many groups). `cap`
    rows, the oldest replaced first; a row is found by its hash and taken only when its bytes are equal."""

    def __init__(self, cap, shape):
        self.cap, self.shape = cap, shape
        self.vals = self.keys = None
        self.slot_of, self.hash_of, self.next = {}, [None] * cap, 0

    def stack(self, parts, decode):
        """(waves, *shape): decode(*rows) for each wave, rows the wave's slice of every part (C-contiguous
        (waves, ...) arrays or None), decoded only for the distinct rows this cache does not hold."""
        parts = [p for p in parts if p is not None]
        n = parts[0].shape[0]
        h = _row_hashes(parts, n)
        if h is None or n > self.cap // 4:
            d = _distinct_rows(*parts)
            if d is _ALL_DISTINCT:
                return decode(*parts)
            return decode(*[p.take(d[0], axis=0) for p in parts]).take(d[1], axis=0)
        key = np.concatenate([p.reshape(n, -1).view(np.uint8) for p in parts], axis=1)
        if self.vals is None or self.keys.shape[1] != key.shape[1]:
            self.vals = np.empty((self.cap,) + self.shape)
            self.keys = np.empty((self.cap, key.shape[1]), np.uint8)
            self.slot_of, self.hash_of = {}, [None] * self.cap
        slots = np.array([self.slot_of.get(x, -1) for x in h], np.intp)
        hit = np.flatnonzero(slots >= 0)
        if hit.size == n and (self.keys.take(slots, axis=0) == key).all():
            return self.vals.take(slots, axis=0)
        out = np.empty((n,) + self.shape)
        if hit.size:
            ok = (self.keys.take(slots.take(hit), axis=0) == key.take(hit, axis=0)).all(axis=1)
            hit = hit[ok]
            out[hit] = self.vals.take(slots.take(hit), axis=0)
            slots[:] = -1
            slots[hit] = 0
        new = np.flatnonzero(slots < 0)
        # the rows to decode: distinct among the new ones (hash, then bytes)
        first, inv = _classes(h, new.tolist())
        if not np.array_equal(key.take(new, axis=0), key.take(first.take(inv), axis=0)):
            first, inv = new, np.arange(new.size)
        vals = decode(*[p.take(first, axis=0) for p in parts])
        out[new] = vals.take(inv, axis=0)
        for j, i in enumerate(first.tolist()):      # kept after the hits are read: a new row may replace one
            s = self.next
            self.next = (s + 1) % self.cap
            old = self.hash_of[s]
            if old is not None and self.slot_of.get(old) == s:
                del self.slot_of[old]
            self.slot_of[h[i]] = s
            self.hash_of[s] = h[i]
            self.keys[s] = key[i]
            self.vals[s] = vals[j]
        return out


@lru_cache(maxsize=None)
def _fp4_pair_table() -> np.ndarray:
    """(65536, 2) float64: row 256 * s + byte = the byte's two FP4 E2M1 values (low nibble first) times
    E8M0 s. Every product is exact (FP4 has no NaN or inf, a scale is a power of two or NaN, and x * NaN is
    that NaN), so these are the bits of execute()'s B * SB whatever loop computes them."""
    lut, e8m0 = numerics._LUT64["fp4_e2m1"], numerics._LUT64["e8m0"]
    byte = np.arange(256)
    pair = np.stack([lut[byte & 0xF], lut[byte >> 4]], axis=1)
    with np.errstate(invalid="ignore"):
        return np.ascontiguousarray((pair[None, :, :] * e8m0[:, None, None]).reshape(65536, 2))


@lru_cache(maxsize=None)
def _fp4_b_plan(mnemonic: str):
    """For an FP4 B operand (f8f6f4 forms): (nregs, reg_shape, axes) such that the value pairs of the register
    bytes (_fp4_pair_table rows, register-major: (nregs, 64 lanes, 4 bytes, 2 nibbles)) viewed as reg_shape
    and transposed by axes are B (K, N) in C order, and every element is scaled by its own lane's byte
    (lane l scales column l % N of K-block l // N, the 32 K values it holds); None when the layout is not
    that (then the generic gather). mfma_decode.c's fp4_b_operand is written for this layout."""
    f = _form(mnemonic)
    plan = _gather_plan(mnemonic, "fp4_e2m1", "b")
    if not f.f8f6f4 or plan is None:
        return None
    nregs, byte_index, shift = plan
    N, G = f.N, 64 // f.N
    reg_shape, axes = (nregs, G, N, 4, 2), (1, 0, 3, 4, 2)     # (reg, group, n, byte, nibble) -> (g, r, b, h, n)
    src = np.arange(nregs * 512).reshape(reg_shape).transpose(axes).ravel()
    if f.K != 32 * G or not np.array_equal(src, 2 * byte_index + (shift >> 2)):
        return None
    lane = (src // 8) % 64                                    # the lane whose register byte holds the element
    k, n = np.divmod(np.arange(f.K * N), N)
    if not np.array_equal(lane, (k // 32) * N + n):
        return None
    return nregs, reg_shape, axes


@lru_cache(maxsize=None)
def _cd_axes(M: int):
    """(reg_shape, axes) with D (M, N) in C order = the C/D registers (nregs, 64) viewed as reg_shape and
    transposed by axes (the permutation _cd_gather indexes), or None."""
    cand = {16: ((4, 4, 16), (1, 0, 2)), 32: ((4, 4, 2, 32), (0, 2, 1, 3))}.get(M)
    if cand is None:
        return None
    shape, axes = cand
    if not np.array_equal(np.arange(M * M).reshape(shape).transpose(axes).ravel(), _cd_gather(M)):
        return None
    return cand


@lru_cache(maxsize=None)
def _cd_row_starts(M: int) -> np.ndarray:
    """int32 (M,): row i of D (M, N) is the N register values (register r, lane l at r * 64 + l) from
    start[i] on (the compiled C/D conversions rely on it: checked against _cd_layout here)."""
    row, col = _cd_layout(M)
    pos = np.empty((M, M), np.int64)
    pos[row, col] = np.arange(row.size).reshape(row.shape)
    if not (np.diff(pos, axis=1) == 1).all():
        raise NotImplementedError(f"C/D rows of {M}x{M} are not consecutive register values")
    return np.ascontiguousarray(pos[:, 0], np.int32)


# ------------------------------------------------------------------------------ compiled lockstep steps

_DECODE_SOURCE = Path(__file__).resolve().parent / "mfma_decode.c"
_decode_lib = None              # the loaded library, False when it cannot be built (numpy forms then)
C_DECODE = os.environ.get("AMD_KERNELS_EMULATOR_C", "1") != "0"     # tests set False to run the numpy forms
_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
_SRC = [_P, _L, _P, _L]                                  # an operand source: base, stride, idx, offset
_SIGNATURES = {
    "rows_equal": ([_I] + _SRC + [_L, _P], _I),
    "rows_gather": ([_I] + _SRC + [_L, _P], None),
    "fp4_b_operand": ([_I, _I, _I] + _SRC + _SRC + [_I, _P, _P, _P], None),
    "f32_to_f64": ([_I, _I, _I] + _SRC + [_P, _P], None),
    "f64_to_f32": ([_I, _I, _I, _P, _P] + _SRC, None),
}


def _build_decode_lib():
    """Compile mfma_decode.c into .cache/emulator/ (keyed by a hash of its source; built to a temp name
    and renamed, as shim.py does) and load it."""
    from harness.toolchain import CACHE
    src = _DECODE_SOURCE.read_bytes()
    out_dir = CACHE / "emulator" / f"mfma-{hashlib.sha256(src).hexdigest()[:16]}"
    lib = out_dir / "libmfma_decode.so"
    if not lib.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f"libmfma_decode.so.{os.getpid()}.tmp"
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(tmp), str(_DECODE_SOURCE)],
                       check=True, capture_output=True)
        tmp.replace(lib)
    dll = ctypes.CDLL(str(lib))
    for name, (args, res) in _SIGNATURES.items():
        fn = getattr(dll, name)
        fn.argtypes, fn.restype = args, res
    return dll


def decode_lib():
    """The compiled lockstep steps (mfma_decode.c), or None when C_DECODE is off or no C compiler built them
    (then the numpy forms run: the same bits)."""
    global _decode_lib
    if not C_DECODE:
        return None
    if _decode_lib is None:
        try:
            _decode_lib = _build_decode_lib()
        except (OSError, subprocess.SubprocessError):
            _decode_lib = False
    return _decode_lib or None


class Rows:
    """Where the library finds an operand of each wave of a group: `nrows` register rows (256 bytes each)
    from row `row` of slot idx[k] of `base`, a (slots, registers, 64) uint32 array whose last two axes are
    C-contiguous (a batch's register file; a (waves, registers, 64) array with idx 0, 1, ...; one operand
    shared by every wave, broadcast with stride 0)."""

    __slots__ = ("base", "ptr", "stride", "idx", "idx_ptr", "off", "nbytes")

    def __init__(self, base, idx, row, nrows, ptr=None, idx_ptr=None):
        self.base, self.idx = base, idx
        self.ptr = base.ctypes.data if ptr is None else ptr
        self.idx_ptr = idx.ctypes.data if idx_ptr is None else idx_ptr
        self.stride, self.off, self.nbytes = base.strides[0], 256 * row, 256 * nrows

    def args(self):
        return self.ptr, self.stride, self.idx_ptr, self.off

    def equal(self, lib, kept) -> bool:
        """Are the rows of every wave the bytes of kept ((waves, ...) C-contiguous)?"""
        return bool(lib.rows_equal(len(self.idx), *self.args(), self.nbytes, kept.ctypes.data))

    def gather(self, lib, shape) -> np.ndarray:
        """The rows of every wave as a (waves,) + shape uint32 array."""
        out = np.empty((len(self.idx),) + shape, np.uint32)
        lib.rows_gather(len(self.idx), *self.args(), self.nbytes, out.ctypes.data)
        return out

    def select(self, waves):
        """The same rows of these waves (an index array into idx)."""
        return Rows(self.base, np.ascontiguousarray(self.idx.take(waves)), self.off // 256, self.nbytes // 256,
                    ptr=self.ptr)


def array_rows(x, nrows):
    """Rows over a (waves, registers, 64) (or (waves, 64): one row) array of the many() form."""
    x = np.asarray(x, np.uint32)
    if x.ndim == 2:
        x = x[:, None, :]
    if x.strides[1:] != (256, 4) or x.shape[1] < nrows:
        x = np.ascontiguousarray(x)
    return Rows(x, np.arange(x.shape[0], dtype=np.int64), 0, nrows)


_EXECUTORS = {}     # (mnemonic, modifiers, layouts) -> fast_executor's answer, shared by the MFMAs of a form
_MISSING = object()  # not in _EXECUTORS (which holds None for forms with no fast path)


def fast_executor(mnemonic: str, mods: dict):
    """A function (a, b, c, scale_a, scale_b) -> D equal bit for bit to execute() for this instruction's
    static modifiers (scale_a / scale_b: the scale VGPRs, uint32 (64,), ignored when unscaled), or None
    when the form has no fast path (then call execute()). Forms: f8f6f4 (scaled or not) and the float
    bf16 / f16 / fp8 / bf8 forms, square, f32 out. Its `many` runs a lockstep group of waves (arrays of
    operands), its `at` the same with the operands read from (and D written to) a register file.
    One per form and layouts (it keeps no state of its own: a kernel's thousands of MFMAs share a few)."""
    key = (mnemonic, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in mods.items())),
           _plans_for_current_layouts())
    run = _EXECUTORS.get(key, _MISSING)
    if run is _MISSING:
        run = _EXECUTORS[key] = _fast_executor(mnemonic, mods)
    return run


def _fast_executor(mnemonic: str, mods: dict):
    f = _form(mnemonic)
    if f.out != "f32" or f.M != f.N:
        return None
    try:
        _check_mods(f, mods)
        fa, fb = operand_formats(mnemonic, mods)
    except NotImplementedError:
        return None                                   # execute() raises it when the instruction runs
    ab_layout, cd_layout = _plans_for_current_layouts()
    pa, pb = _byte_decoder(mnemonic, fa, "a"), _byte_decoder(mnemonic, fb, "b")
    if pa is None or pb is None:
        return None
    (na, dec_a, many_a), (nb, dec_b, many_b) = pa, pb
    M, N, K = f.M, f.N, f.K
    perm_c = _cd_gather(M)
    row, col = _cd_layout(M)
    nc = row.shape[0]
    d_index = row * N + col                         # pack_cd's D[row, col] as one flat gather
    scaled = f.scaled
    sel_a = sel_b = 0
    if scaled:
        ops = [int(x) for x in (mods.get("op_sel") or [])] + [0, 0]
        hi = [int(x) for x in (mods.get("op_sel_hi") or [])] + [0, 0]
        sel_a, sel_b = ops[0] + 2 * hi[0], ops[1] + 2 * hi[1]
        sh_a, sh_b = np.uint32(8 * sel_a), np.uint32(8 * sel_b)
        e8m0 = numerics._LUT64["e8m0"]
        nblk = 64 // M
        kblk = np.arange(K) // 32

    # what decides A's values besides its register and scale bytes (the layout too: _RECENT_A and _ROWS_A
    # outlive a swapped one)
    a_key = (mnemonic, fa, sel_a, ab_layout)

    def swapped():
        # a test has replaced a layout function since the plan was made (test_upstream_evidence swaps in
        # wrong ones): the caller runs execute(), which reads the current layouts
        return _ab_layout is not ab_layout or _cd_layout is not cd_layout
    rows_a = _ROWS_A.get(a_key)
    if rows_a is None:
        rows_a = _ROWS_A[a_key] = _RowCache(ROW_CACHE, (M, K))

    def run(a, b, c, scale_a=None, scale_b=None):
        # None -> the caller runs execute(): operands too short (it raises), or a layout swapped
        if a.shape[0] < na or b.shape[0] < nb or swapped():
            return None
        A = dec_a(np.ascontiguousarray(a[:na], np.uint32))
        B = dec_b(np.ascontiguousarray(b[:nb], np.uint32))
        C = np.asarray(c, np.uint32)[:nc].reshape(-1).take(perm_c).reshape(M, N)
        if scaled:
            # _scale_matrices' SA is F-ordered (M, K), its SB C-ordered (K, N): built here in those layouts
            da = e8m0.take((np.asarray(scale_a, np.uint32) >> sh_a) & 0xFF)
            db = e8m0.take((np.asarray(scale_b, np.uint32) >> sh_b) & 0xFF)
            SA = da.reshape(nblk, M).take(kblk, axis=0).T
            SB = db.reshape(nblk, N).take(kblk, axis=0)
            A, B = A * SA, B * SB
        D = A @ B + C.view(np.float32).astype(np.float64)
        return D.astype(np.float32).view(np.uint32).reshape(-1).take(d_index)

    # The same for a group of waves at once (lockstep). Equal operands give equal values, so each is decoded
    # once: A operands are kept across calls (_RECENT_A: the whole group's; _ROWS_A: rows by content), B
    # operands decoded once per distinct wave of the group when enough are equal (_distinct_rows, its answer
    # kept with the group's A for the next MFMA of the K-step and checked there). The element-wise steps run
    # over a leading wave axis, the products one wave at a time (the same 2-D matmul as run, so the same
    # bits). With the compiled library (mfma_decode.c) the operands are read where they are, FP4 B decoded
    # and C, D converted in compiled loops, with the same values.
    def decode_a(ra, xa=None):
        """(waves, M, K) float64: each wave's A (scaled), MANY_WAVES waves per pass (the float64
        temporaries stay in cache)."""
        A = np.empty((len(ra), M, K))
        for s in range(0, len(ra), MANY_WAVES):
            As = many_a(ra[s: s + MANY_WAVES]).reshape(-1, M, K)
            if scaled:
                # run's scaled operands for every wave at once: the same exact products (powers of two),
                # each K-block's scale broadcast over its 32 K values; C-ordered as run's are
                da = e8m0.take((xa[s: s + MANY_WAVES] >> sh_a) & 0xFF).reshape(-1, nblk, M).transpose(0, 2, 1)
                As = (As.reshape(-1, M, nblk, 32) * da[..., None]).reshape(-1, M, K)
            A[s: s + MANY_WAVES] = As
        return A

    fp4_b = _fp4_b_plan(mnemonic) if fb == "fp4_e2m1" else None
    if fp4_b is not None:
        _, b_shape, b_axes = fp4_b
        b_out = tuple(b_shape[x] for x in b_axes)
        b_axes = (0,) + tuple(x + 1 for x in b_axes)
        # the high bytes of the four 16-bit table indices in a lane's register: its scale byte (1.0 = 127
        # when unscaled)
        spread = np.arange(256, dtype=np.uint64) * np.uint64(0x0100010001000100)
        unit = spread[127]
        fp4_lut, e8m0_lut = numerics._LUT64["fp4_e2m1"], numerics._LUT64["e8m0"]

    def decode_b(rb, xb):
        """(waves, K, N) float64: each wave's B (scaled), from (waves, nb, 64) registers and (waves, 64)
        scale registers."""
        nw = len(rb)
        B = np.empty((nw, K, N))
        if fp4_b is not None:
            # one table row per register byte (its two values, scaled by its lane's E8M0), then one transposed
            # copy into matrix order
            idx = np.empty((nw, nb, 64, 4), np.uint16)
            idx[...] = rb.view(np.uint8).reshape(nw, nb, 64, 4)
            words = idx.view(np.uint64).reshape(nw, nb, 64)
            words |= spread.take(xb.view(np.uint8).reshape(nw, 64, 4)[:, :, sel_b])[:, None, :] if scaled else unit
            vals = _fp4_pair_table().take(idx, axis=0).reshape((nw,) + b_shape)
            np.copyto(B.reshape((nw,) + b_out), vals.transpose(b_axes))
            return B
        for s in range(0, nw, MANY_WAVES):
            Bs = many_b(rb[s: s + MANY_WAVES]).reshape(-1, K, N)
            if scaled:
                db = e8m0.take((xb[s: s + MANY_WAVES] >> sh_b) & 0xFF).reshape(-1, nblk, 1, N)
                Bs = (Bs.reshape(-1, nblk, 32, N) * db).reshape(-1, K, N)
            B[s: s + MANY_WAVES] = Bs
        return B

    def b_grouping(entry, rb, xb, nw):
        """The distinct B operands to decode: (first, inverse) from _distinct_rows, kept with the group's A
        entry and checked on its next call, or None (every wave its own)."""
        part = entry.b_part
        if part is not None and part is not _ALL_DISTINCT and not _same_rows(
                (rb,) if xb is None else (rb, xb), part[2], part[3]):
            part = None
        if part is None:
            part = _distinct_rows(rb, xb) if nw > 1 else _ALL_DISTINCT
            if part is not _ALL_DISTINCT and len(part[0]) > DEDUPE_AT * nw:
                part = _ALL_DISTINCT
            entry.b_part = part
        return None if part is _ALL_DISTINCT else part[:2]

    cd = _cd_axes(M)
    if cd is not None:
        c_shape, c_axes = cd
        c_axes = (0,) + tuple(x + 1 for x in c_axes)
        d_shape = tuple(c_shape[x - 1] for x in c_axes[1:])
        d_axes = tuple(int(x) for x in np.argsort(c_axes))

    def many(a, b, c, scale_a=None, scale_b=None):
        """a, b, c: (waves, regs, 64) uint32; scale_a / scale_b: (waves, 64) -> (waves, nc, 64), or None."""
        if a.shape[1] < na or b.shape[1] < nb or swapped():
            return None
        lib = decode_lib()
        if lib is not None:
            nw = a.shape[0]
            out = np.empty((nw, nc, 64), np.uint32)
            at(lib, array_rows(a, na), array_rows(b, nb), array_rows(c, nc),
               array_rows(scale_a, 1) if scaled else None, array_rows(scale_b, 1) if scaled else None,
               array_rows(out, nc))
            return out
        nw = a.shape[0]
        ra = np.ascontiguousarray(a[:, :na], np.uint32)
        xa = np.ascontiguousarray(scale_a, np.uint32) if scaled else None
        entry = _RECENT_A.get(a_key, ra, xa)
        if entry is None:
            entry = _RECENT_A.put(a_key, ra, xa, rows_a.stack((ra, xa), decode_a))
        A = entry.value
        rb = np.ascontiguousarray(b[:, :nb], np.uint32)
        xb = np.ascontiguousarray(scale_b, np.uint32) if scaled else None
        part = b_grouping(entry, rb, xb, nw)
        if part is None:
            B = decode_b(rb, xb)
        else:
            B = decode_b(rb.take(part[0], axis=0), None if xb is None else xb.take(part[0], axis=0))
            B = B.take(part[1], axis=0)
        # one 2-D product per wave with run's operand layouts (numpy's stacked matmul calls the same gemm per
        # slice): the same bits as run (tests/test_mfma.py::test_fast_path_many_is_run_per_wave)
        P = np.matmul(A, B)
        c32 = np.asarray(c, np.uint32)[:, :nc].view(np.float32)
        if cd is None:
            C = c32.reshape(nw, -1).take(perm_c, axis=1).reshape(nw, M, N).astype(np.float64)
            D = (P + C).astype(np.float32).view(np.uint32).reshape(nw, -1)
            return D.take(d_index, axis=1)
        # the C/D register order is a transposition of matrix order: converted in the same pass
        C = c32.reshape((nw,) + c_shape).transpose(c_axes).astype(np.float64, order="C")
        P += C.reshape(nw, M, N)
        D = P.reshape((nw,) + d_shape).transpose(d_axes).astype(np.float32, order="C")
        return D.view(np.uint32).reshape(nw, nc, 64)

    row_start = _cd_row_starts(M)
    row_ptr = row_start.ctypes.data
    if fp4_b is not None:
        lut_ptr, e8m0_ptr = fp4_lut.ctypes.data, e8m0_lut.ctypes.data

    def at(lib, a, b, c, sa, sb, d):
        """The group's MFMAs with the compiled library: operands at Rows a, b, c, sa, sb (None when unscaled),
        D written to Rows d."""
        nw = len(a.idx)
        entry = _RECENT_A.get_at(a_key, nw, lib, a, sa)
        if entry is None:
            ra = a.gather(lib, (na, 64))
            xa = sa.gather(lib, (64,)) if scaled else None
            entry = _RECENT_A.put(a_key, ra, xa, rows_a.stack((ra, xa), decode_a))
        A = entry.value
        part = entry.b_part
        if part is None or part is not _ALL_DISTINCT:
            part = b_grouping(entry, b.gather(lib, (nb, 64)), sb.gather(lib, (64,)) if scaled else None, nw)
        else:
            part = None
        bu, sbu = (b, sb) if part is None else (b.select(part[0]), sb.select(part[0]) if scaled else None)
        if fp4_b is not None:
            B = np.empty((len(bu.idx), K, N))
            lib.fp4_b_operand(len(bu.idx), nb, N, *bu.args(), *(sbu.args() if scaled else (None, 0, None, 0)),
                              sel_b, lut_ptr, e8m0_ptr, B.ctypes.data)
        else:
            B = decode_b(bu.gather(lib, (nb, 64)), sbu.gather(lib, (64,)) if scaled else None)
        if part is not None:
            B = B.take(part[1], axis=0)
        # one 2-D product per wave with run's operand layouts (numpy's stacked matmul calls the same gemm per
        # slice): the same bits as run (tests/test_mfma.py::test_fast_path_many_is_run_per_wave)
        P = np.matmul(A, B)
        C = np.empty((nw, M, N))
        lib.f32_to_f64(nw, M, N, *c.args(), row_ptr, C.ctypes.data)
        P += C
        lib.f64_to_f32(nw, M, N, P.ctypes.data, row_ptr, *d.args())

    def at_regs(regs, idx, a_row, b_row, c_row, sa_row, sb_row, d_row):
        """at() over a batch's register file: the waves at slots idx (int64), each operand at its first
        register row there or at a Rows of its own (a constant); sa_row / sb_row None when unscaled. False
        when the library is not there or the layout was replaced (then the caller gathers and calls many)."""
        lib = decode_lib()
        if lib is None or swapped():
            return False
        ptr, ip = regs.ctypes.data, idx.ctypes.data

        def rows(r, n):
            return r if isinstance(r, Rows) else Rows(regs, idx, r, n, ptr, ip)
        at(lib, rows(a_row, na), rows(b_row, nb), rows(c_row, nc), rows(sa_row, 1) if scaled else None,
           rows(sb_row, 1) if scaled else None, rows(d_row, nc))
        return True

    run.many = many
    run.at_regs = at_regs
    run.keep = row_start                            # the array row_ptr points into
    return run
