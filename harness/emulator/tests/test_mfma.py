"""MFMA semantics (harness/emulator/mfma.py) against a torch matmul built from the documented layouts.

The reference packer below is written independently of mfma.py (per-lane Python-int bit packing) from the
layout rules in mfma.py's docstring; the spot checks pin those rules to the public sources they cite.
"""

import itertools

import numpy as np
import pytest
import torch

from harness.emulator import mfma
from harness.emulator import numerics as N

RNG = np.random.default_rng(77)
FMT_BITS = {"bf16": 16, "f16": 16, "f32": 32, "i8": 8, "fp8_e4m3": 8, "bf8_e5m2": 8, "fp6_e2m3": 6,
            "bf6_e3m2": 6, "fp4_e2m1": 4}
TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn,
               "bf8_e5m2": torch.float8_e5m2}


# ------------------------------------------------------------------------------------- reference model

def ref_k(form, fmt, lane, e, MN):
    """K index of element e held by `lane` (documented rule)."""
    g = lane // MN
    if form.f8f6f4:
        if FMT_BITS[fmt] == 8:
            return (form.K // 2) * (e // 16) + 16 * g + e % 16
        return 32 * g + e
    kpl = form.K * MN // 64
    return kpl * g + e


def ref_pack(form, fmt, which, mat):
    """Codes matrix (A: MxK, B: KxN) -> registers (nregs, 64) using Python ints per lane."""
    MN = form.M if which == "a" else form.N
    bits = FMT_BITS[fmt]
    per_lane = form.K * MN // 64
    nregs = per_lane * bits // 32
    out = np.zeros((nregs, 64), dtype=np.uint32)
    for lane in range(64):
        acc = 0
        for e in range(per_lane):
            k = ref_k(form, fmt, lane, e, MN)
            code = int(mat[lane % MN, k] if which == "a" else mat[k, lane % MN])
            acc |= (code & ((1 << bits) - 1)) << (bits * e)
        for r in range(nregs):
            out[r, lane] = (acc >> (32 * r)) & 0xFFFFFFFF
    return out


def ref_cd_index(M, reg, lane):
    if M == 16:
        return 4 * (lane // 16) + reg, lane % 16
    return 8 * (reg // 4) + 4 * (lane // 32) + reg % 4, lane % 32


def ref_pack_c(M, mat):
    regs = M * M // 64
    out = np.zeros((regs, 64), dtype=np.uint32)
    for r in range(regs):
        for lane in range(64):
            out[r, lane] = mat[ref_cd_index(M, r, lane)]
    return out


def ref_unpack_d(M, regs):
    mat = np.zeros((M, M), dtype=np.uint32)
    for r in range(regs.shape[0]):
        for lane in range(64):
            mat[ref_cd_index(M, r, lane)] = regs[r, lane]
    return mat


def torch_values(fmt, codes):
    """Decode with torch where it has the dtype (independent of numerics.py), else numerics tables."""
    if fmt in TORCH_DTYPE:
        dt = TORCH_DTYPE[fmt]
        if dt.itemsize == 1:
            t = torch.from_numpy(codes.astype(np.uint8)).view(dt)
        else:
            t = torch.from_numpy(codes.astype(np.uint16).view(np.int16)).view(dt)
        return t.to(torch.float64)
    if fmt == "i8":
        return torch.from_numpy(codes.astype(np.uint8).view(np.int8).astype(np.int64))
    if fmt == "f32":
        return torch.from_numpy(codes.astype(np.uint32).view(np.float32).astype(np.float64))
    return torch.from_numpy(N.decode64(fmt, codes))


def random_codes(fmt, shape):
    """Finite codes; fp8 avoids NaN/inf so the reference comparison is numeric."""
    if fmt == "f32":
        return RNG.standard_normal(shape).astype(np.float32).view(np.uint32)
    if fmt in ("bf16", "f16"):
        v = RNG.standard_normal(shape).astype(np.float32)
        return N.encode(fmt, v, saturate=False)
    codes = RNG.integers(0, 1 << FMT_BITS[fmt], shape).astype(np.uint32)
    if fmt == "fp8_e4m3":
        codes[(codes & 0x7F) == 0x7F] = 0x38
    if fmt == "bf8_e5m2":
        codes[(codes & 0x7C) == 0x7C] = 0x3C
    return codes


def scale_lane_matrix(form, byte_per_lane):
    """E8M0 bytes per lane -> (M x nblk) value matrix following 'lane l scales row l%M, block l//M'."""
    nblk = 64 // form.M
    s = np.zeros((form.M, nblk))
    for lane in range(64):
        s[lane % form.M, lane // form.M] = 2.0 ** (int(byte_per_lane[lane]) - 127)
    return s


def run_case(mnemonic, mods, scales=None):
    form = mfma.FORMS[mnemonic]
    fa, fb = mfma.operand_formats(mnemonic, mods)
    A = random_codes(fa, (form.M, form.K))
    B = random_codes(fb, (form.K, form.N))
    if form.out == "i32":
        C = RNG.integers(-2**31, 2**31, (form.M, form.N)).astype(np.int64).astype(np.uint32)
    else:
        C = (RNG.standard_normal((form.M, form.N)) * 4).astype(np.float32).view(np.uint32)
    a = ref_pack(form, fa, "a", A)
    b = ref_pack(form, fb, "b", B)
    c = ref_pack_c(form.M, C)
    assert (a.shape[0], b.shape[0], c.shape[0]) == mfma.operand_regs(mnemonic, mods)
    D = ref_unpack_d(form.M, mfma.execute(mnemonic, a, b, c, mods))
    At, Bt = torch_values(fa, A), torch_values(fb, B)
    if form.out == "i32":
        ref = (At @ Bt + torch.from_numpy(C.view(np.int32).astype(np.int64))).numpy()
        assert np.array_equal(D.view(np.int32), ref.astype(np.int64).astype(np.uint32).view(np.int32))
        return
    if form.scaled:
        sa, sb = scales
        kb = np.arange(form.K) // 32
        At = At * torch.from_numpy(sa[:, kb])
        Bt = Bt * torch.from_numpy(sb[:, kb].T)
    ref = (At @ Bt + torch.from_numpy(C.view(np.float32).astype(np.float64))).to(torch.float32).numpy()
    np.testing.assert_allclose(D.view(np.float32), ref, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------- every form

UNSCALED = sorted(m for m, f in mfma.FORMS.items() if not f.f8f6f4)
F8F6F4 = sorted(m for m, f in mfma.FORMS.items() if f.f8f6f4)


@pytest.mark.parametrize("mnemonic", UNSCALED)
def test_unscaled_forms_against_torch(mnemonic):
    run_case(mnemonic, {})


@pytest.mark.parametrize("mnemonic", F8F6F4)
@pytest.mark.parametrize("cbsz,blgp", list(itertools.product(range(5), range(5))))
def test_f8f6f4_every_format_pair(mnemonic, cbsz, blgp):
    form = mfma.FORMS[mnemonic]
    mods = {"cbsz": cbsz, "blgp": blgp}
    scales = None
    if form.scaled:
        # distinct scale per lane and per byte; op_sel picks byte 1 for A, op_sel_hi picks byte 2 for B
        sa = RNG.integers(120, 135, (64, 4)).astype(np.uint32)
        sb = RNG.integers(120, 135, (64, 4)).astype(np.uint32)
        mods.update(scale_a=(sa << np.arange(0, 32, 8, dtype=np.uint32)).sum(1).astype(np.uint32),
                    scale_b=(sb << np.arange(0, 32, 8, dtype=np.uint32)).sum(1).astype(np.uint32),
                    op_sel=[1, 0, 0], op_sel_hi=[0, 1, 0])
        scales = (scale_lane_matrix(form, sa[:, 1]), scale_lane_matrix(form, sb[:, 2]))
    run_case(mnemonic, mods, scales)


@pytest.mark.parametrize("mnemonic", ["v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4"])
@pytest.mark.parametrize("sel_a,sel_b", list(itertools.product(range(4), range(4))))
def test_scale_byte_selection(mnemonic, sel_a, sel_b):
    form = mfma.FORMS[mnemonic]
    sa = RNG.integers(118, 138, (64, 4)).astype(np.uint32)
    sb = RNG.integers(118, 138, (64, 4)).astype(np.uint32)
    mods = {"cbsz": 4, "blgp": 0,
            "scale_a": (sa << np.arange(0, 32, 8, dtype=np.uint32)).sum(1).astype(np.uint32),
            "scale_b": (sb << np.arange(0, 32, 8, dtype=np.uint32)).sum(1).astype(np.uint32),
            "op_sel": [sel_a & 1, sel_b & 1, 0], "op_sel_hi": [sel_a >> 1, sel_b >> 1, 0]}
    run_case(mnemonic, mods, (scale_lane_matrix(form, sa[:, sel_a]), scale_lane_matrix(form, sb[:, sel_b])))


def test_scale_nan_gives_nan():
    m = "v_mfma_scale_f32_16x16x128_f8f6f4"
    mods = {"cbsz": 0, "blgp": 0, "scale_a": np.full(64, 0x7F7F7F7F, np.uint32),
            "scale_b": np.full(64, 0x7F7F7F7F, np.uint32)}
    mods["scale_a"][3] = 0x7F7F7FFF                  # lane 3, byte 0: row 3, K block 0 -> NaN
    a = np.full((8, 64), 0x38383838, np.uint32)      # all ones
    d = mfma.unpack_cd(m, mfma.execute(m, a, a, np.zeros((4, 64), np.uint32), mods)).view(np.float32)
    assert np.isnan(d[3]).all() and not np.isnan(np.delete(d, 3, axis=0)).any()
    assert np.all(np.delete(d, 3, axis=0) == 128.0)


# ------------------------------------------------------------------------------------- spot checks vs sources

def _where(mnemonic, which, mods, lane, e):
    fa, fb = mfma.operand_formats(mnemonic, mods)
    _n, _w, outer, k = mfma._ab_layout(mnemonic, fa if which == "a" else fb, which)
    return (int(outer[lane, e]), int(k[lane, e])) if which == "a" else (int(k[lane, e]), int(outer[lane, e]))


def test_layout_spot_checks_amd_calculator_cdna3():
    # AMD Matrix Instruction Calculator, --architecture cdna3 --matrix-layout (same encodings on gfx950)
    assert _where("v_mfma_f32_32x32x8_bf16", "a", {}, 32, 3) == (0, 7)          # lane 32 v1.[31:16] = A[0][7]
    assert _where("v_mfma_f32_32x32x8_bf16", "b", {}, 33, 0) == (4, 1)          # lane 33 v0.[15:0] = B[4][1]
    assert _where("v_mfma_f32_16x16x32_fp8_fp8", "a", {}, 63, 7) == (15, 31)    # lane 63 v1.[31:24] = A[15][31]
    assert _where("v_mfma_i32_16x16x32_i8", "b", {}, 16, 0) == (8, 0)           # lane 16 v0.[7:0] = B[8][0]
    assert _where("v_mfma_f32_16x16x4_f32", "a", {}, 32, 0) == (0, 2)           # lane 32 v0 = A[0][2]
    row, col = mfma._cd_layout(32)
    assert (row[4, 0], col[4, 0]) == (8, 0) and (row[15, 63], col[15, 63]) == (31, 31)   # D v4 lane 0 = D[8][0]
    assert (row[1, 32], col[1, 32]) == (5, 0)                                    # D v1 lane 32 = D[5][0]
    row, col = mfma._cd_layout(16)
    assert (row[2, 17], col[2, 17]) == (6, 1)                                    # D v2 lane 17 = D[6][1]


def test_layout_spot_checks_cdna4_blog():
    # ROCm blog "Matrix Core Programming on AMD CDNA3 and CDNA4", 32x32x64 examples
    fp8 = {"cbsz": 0, "blgp": 0}
    assert _where("v_mfma_f32_32x32x64_f8f6f4", "a", fp8, 32, 16) == (0, 48)    # a_reg[16] = A[0][16*1+32*1]
    assert _where("v_mfma_f32_32x32x64_f8f6f4", "b", fp8, 5, 17) == (33, 5)     # b_reg[17] = B[32+1][5]
    fp4 = {"cbsz": 4, "blgp": 4}
    assert _where("v_mfma_f32_32x32x64_f8f6f4", "a", fp4, 33, 0) == (1, 32)     # (l%32)*32 + (l/32)*16 bytes
    assert _where("v_mfma_f32_32x32x64_f8f6f4", "a", fp4, 33, 31) == (1, 63)
    # GFX950.md: 16x16x128 FP4 lane l holds A[l%16][32*(l/16)+t]; 16x16x32 bf16 A[l%16][8*(l/16)+j]
    assert _where("v_mfma_f32_16x16x128_f8f6f4", "a", fp4, 50, 9) == (2, 105)
    assert _where("v_mfma_f32_16x16x32_bf16", "a", {}, 37, 5) == (5, 21)


def test_wrong_k_order_is_detected():
    """A kernel that permutes K inside a lane must not agree with the reference."""
    m = "v_mfma_f32_16x16x32_bf16"
    form = mfma.FORMS[m]
    A = random_codes("bf16", (16, 32))
    B = random_codes("bf16", (32, 16))
    good = ref_pack(form, "bf16", "a", A)
    swapped = good[[1, 0, 2, 3]]                         # swap k pairs (0,1)<->(2,3) in every lane
    c = np.zeros((4, 64), np.uint32)
    b = ref_pack(form, "bf16", "b", B)
    d_good = mfma.execute(m, good, b, c, {})
    d_bad = mfma.execute(m, swapped, b, c, {})
    assert not np.allclose(d_good.view(np.float32), d_bad.view(np.float32))


def test_pack_unpack_inverse():
    for m in sorted(mfma.FORMS):
        f = mfma.FORMS[m]
        for cb, bl in ([(0, 0)] if not f.f8f6f4 else [(0, 2), (3, 4), (1, 1)]):
            mods = {"cbsz": cb, "blgp": bl} if f.f8f6f4 else {}
            fa, fb = mfma.operand_formats(m, mods)
            A = RNG.integers(0, 1 << FMT_BITS[fa], (f.M, f.K), dtype=np.uint64).astype(np.uint32)
            assert np.array_equal(mfma.unpack_ab(m, "a", mfma.pack_ab(m, "a", A, mods), mods), A)
            assert np.array_equal(mfma.pack_ab(m, "a", A, mods), ref_pack(f, fa, "a", A))
            Cm = RNG.integers(0, 2**32, (f.M, f.N), dtype=np.uint64).astype(np.uint32)
            assert np.array_equal(mfma.unpack_cd(m, mfma.pack_cd(m, Cm)), Cm)


def test_i32_wraps():
    m = "v_mfma_i32_16x16x64_i8"
    a = np.full((4, 64), 0x7F7F7F7F, np.uint32)          # all 127
    c = np.full((4, 64), 0x7FFFFFFF, np.uint32)
    d = mfma.execute(m, a, a, c, {}).view(np.int32)
    assert np.all(d == np.int32(np.int64(0x7FFFFFFF + 64 * 127 * 127 - 2**32)))


@pytest.mark.parametrize("mods", [{"cbsz": 1}, {"abid": 1}, {"blgp": 2}, {"neg": [1, 0, 0]}, {"op_sel": [1, 0, 0]}])
def test_unmodelled_modifiers_raise(mods):
    with pytest.raises(NotImplementedError):
        mfma.execute("v_mfma_f32_16x16x32_bf16", np.zeros((4, 64), np.uint32), np.zeros((4, 64), np.uint32),
                     np.zeros((4, 64), np.uint32), mods)


def test_unknown_mfma_raises():
    with pytest.raises(NotImplementedError):
        mfma.operand_regs("v_mfma_f64_16x16x4_f64", {})


# ------------------------------------------------------------------------------------- fast path

@pytest.mark.parametrize("mnemonic", ["v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4",
                                      "v_mfma_f32_16x16x128_f8f6f4", "v_mfma_f32_32x32x64_f8f6f4"])
@pytest.mark.parametrize("cbsz,blgp", [(0, 0), (1, 0), (0, 4), (4, 0), (4, 4), (1, 1), (4, 1)])
def test_fast_path_bitwise(mnemonic, cbsz, blgp):
    """mfma.fast_executor gives execute()'s bits exactly: random register bits (NaN / inf codes and
    NaN-ish accumulators included), random E8M0 scales with NaN (255) and extreme exponents, every op_sel."""
    rng = np.random.default_rng(cbsz * 10 + blgp)
    for op_sel in ([0, 0], [1, 0], [0, 1], [1, 1]):
        for op_sel_hi in ([0, 0], [1, 1]):
            scaled = "scale" in mnemonic
            if not scaled and (any(op_sel) or any(op_sel_hi)):
                continue
            mods = {"cbsz": cbsz, "blgp": blgp}
            if scaled:
                mods.update(op_sel=op_sel, op_sel_hi=op_sel_hi)
            run = mfma.fast_executor(mnemonic, mods)
            assert run is not None
            na, nb, nc = mfma.operand_regs(mnemonic, mods)
            for trial in range(6):
                a = rng.integers(0, 1 << 32, (na, 64), dtype=np.uint64).astype(np.uint32)
                b = rng.integers(0, 1 << 32, (nb, 64), dtype=np.uint64).astype(np.uint32)
                c = rng.normal(size=(nc, 64)).astype(np.float32).view(np.uint32)
                if trial == 1:
                    c = rng.integers(0, 1 << 32, (nc, 64), dtype=np.uint64).astype(np.uint32)
                sa = rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32)
                sb = rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32)
                if trial == 2:    # moderate scales: finite, mostly non-NaN results
                    sa = (rng.integers(120, 134, 64) * 0x01010101).astype(np.uint32)
                    sb = (rng.integers(120, 134, 64) * 0x01010101).astype(np.uint32)
                m = dict(mods, scale_a=sa, scale_b=sb) if scaled else dict(mods)
                with np.errstate(all="ignore"):
                    want = mfma.execute(mnemonic, a, b, c, m)
                    got = run(a, b, c, sa, sb)
                assert got.dtype == want.dtype and np.array_equal(got, want), (op_sel, op_sel_hi, trial)


_FLOAT_FORMS = ["v_mfma_f32_16x16x32_bf16", "v_mfma_f32_32x32x16_bf16", "v_mfma_f32_16x16x16_bf16",
                "v_mfma_f32_32x32x8_bf16", "v_mfma_f32_16x16x32_f16", "v_mfma_f32_32x32x16_f16",
                "v_mfma_f32_16x16x32_fp8_bf8", "v_mfma_f32_32x32x16_bf8_fp8"]


def _float_operands(rng, mnemonic, shape, nregs, trial):
    """Register bits for a bf16 / f16 / fp8 operand: random bits (NaN, inf, subnormal codes, exponents far
    apart), or values of one scale (trial 1: the float64 K sums round, so their order shows)."""
    if trial == 0:
        return rng.integers(0, 1 << 32, shape + (nregs, 64), dtype=np.uint64).astype(np.uint32)
    vals = rng.normal(size=shape + (nregs, 64, 2)) * np.exp2(rng.integers(-3, 4, shape + (nregs, 64, 2)))
    if mnemonic.endswith("bf16"):
        half = (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint32)
    elif mnemonic.endswith("f16"):
        half = vals.astype(np.float16).view(np.uint16).astype(np.uint32)
    else:   # fp8 forms: any byte pattern is a code
        return rng.integers(0, 1 << 32, shape + (nregs, 64), dtype=np.uint64).astype(np.uint32)
    return half[..., 0] | (half[..., 1] << 16)


@pytest.mark.parametrize("mnemonic", _FLOAT_FORMS)
def test_fast_path_float_forms(mnemonic):
    """fast_executor for the bf16 / f16 / fp8 forms gives execute()'s bits (random register bits, and values
    of one scale whose K sums round), and its .many (lockstep) gives run()'s bits for each wave."""
    rng = np.random.default_rng(sum(map(ord, mnemonic)))
    run = mfma.fast_executor(mnemonic, {})
    assert run is not None
    na, nb, nc = mfma.operand_regs(mnemonic, {})
    for trial in range(3):
        a = _float_operands(rng, mnemonic, (), na, trial % 2)
        b = _float_operands(rng, mnemonic, (), nb, trial % 2)
        c = rng.normal(size=(nc, 64)).astype(np.float32).view(np.uint32)
        if trial == 2:
            c = rng.integers(0, 1 << 32, (nc, 64), dtype=np.uint64).astype(np.uint32)
        with np.errstate(all="ignore"):
            want = mfma.execute(mnemonic, a, b, c, {})
            got = run(a, b, c)
        assert got.dtype == want.dtype and np.array_equal(got, want), trial
    for nw, trial in ((1, 0), (3, 1), (17, 1), (5, 0)):
        a = _float_operands(rng, mnemonic, (nw,), na, trial)
        b = _float_operands(rng, mnemonic, (nw,), nb, trial)
        c = rng.normal(size=(nw, nc, 64)).astype(np.float32).view(np.uint32)
        with np.errstate(all="ignore"):
            got = run.many(a, b, c)
            for k in range(nw):
                want = mfma.execute(mnemonic, a[k], b[k], c[k], {})
                assert np.array_equal(got[k], want), (nw, k)


@pytest.mark.parametrize("mnemonic", ["v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4",
                                      "v_mfma_f32_16x16x128_f8f6f4", "v_mfma_f32_32x32x64_f8f6f4"])
@pytest.mark.parametrize("cbsz,blgp", [(0, 0), (1, 0), (0, 4), (4, 0), (4, 4), (1, 1), (4, 1)])
def test_fast_path_many_is_run_per_wave(mnemonic, cbsz, blgp):
    """fast_executor(...).many (lockstep: a group of waves at once) gives run()'s bits for each wave: random
    register bits, wave-varying E8M0 scales (extreme, NaN, and moderate ones, where the sums round)."""
    rng = np.random.default_rng(100 + cbsz * 10 + blgp)
    scaled = "scale" in mnemonic
    for op_sel, op_sel_hi in (([0, 0], [0, 0]), ([1, 1], [1, 0]), ([0, 1], [1, 1])):
        mods = {"cbsz": cbsz, "blgp": blgp}
        if scaled:
            mods.update(op_sel=op_sel, op_sel_hi=op_sel_hi)
        run = mfma.fast_executor(mnemonic, mods)
        na, nb, nc = mfma.operand_regs(mnemonic, mods)
        for nw in (1, 3, 17):
            a = rng.integers(0, 1 << 32, (nw, na, 64), dtype=np.uint64).astype(np.uint32)
            b = rng.integers(0, 1 << 32, (nw, nb, 64), dtype=np.uint64).astype(np.uint32)
            c = rng.normal(size=(nw, nc, 64)).astype(np.float32).view(np.uint32)
            sa = rng.integers(0, 1 << 32, (nw, 64), dtype=np.uint64).astype(np.uint32)
            sb = (rng.integers(100, 154, (nw, 64)) * 0x01010101).astype(np.uint32)
            sb[0, :8] = rng.integers(0, 1 << 32, 8, dtype=np.uint64).astype(np.uint32)
            with np.errstate(all="ignore"):
                got = run.many(a, b, c, sa, sb) if scaled else run.many(a, b, c)
                for k in range(nw):
                    want = run(a[k], b[k], c[k], sa[k], sb[k])
                    assert np.array_equal(got[k], want), (op_sel, nw, k)
            if not scaled:
                break


def test_fast_path_many_reuses_a_only_when_it_is_equal():
    """.many keeps the last few A operands it decoded and scaled (the MFMAs of a K-step share A): a call with
    the same A bytes but another scale, op_sel or form, or with A given as a view of registers written since,
    gets run()'s bits for each wave, never a stale copy."""
    rng = np.random.default_rng(7)
    name = "v_mfma_scale_f32_16x16x128_f8f6f4"
    plain = {"cbsz": 0, "blgp": 4}
    forms = [mfma.fast_executor(name, dict(plain, op_sel=s, op_sel_hi=h)) for s, h in
             (([0, 0], [0, 0]), ([1, 1], [0, 0]))] + [mfma.fast_executor(name, {"cbsz": 1, "blgp": 4})]
    na, nb, nc = mfma.operand_regs(name, plain)
    nw = 5
    a = rng.integers(0, 1 << 32, (nw, na, 64), dtype=np.uint64).astype(np.uint32)  # registers, written in place
    sa = (rng.integers(110, 144, (nw, 64)) * 0x01020304).astype(np.uint32)
    calls = [(0, False, False), (0, False, False), (1, False, False), (2, False, False), (0, True, False),
             (0, False, True), (0, False, False)]
    for form, new_scale, write_a in calls:
        run = forms[form]
        if new_scale:
            sa = sa ^ np.uint32(0x00000101)
        if write_a:
            a ^= rng.integers(0, 2, (nw, na, 64), dtype=np.uint64).astype(np.uint32)
        b = rng.integers(0, 1 << 32, (nw, nb, 64), dtype=np.uint64).astype(np.uint32)
        c = rng.normal(size=(nw, nc, 64)).astype(np.float32).view(np.uint32)
        sb = (rng.integers(110, 144, (nw, 64)) * 0x01010101).astype(np.uint32)
        with np.errstate(all="ignore"):
            got = run.many(a, b, c, sa, sb)
            for k in range(nw):
                assert np.array_equal(got[k], run(a[k], b[k], c[k], sa[k], sb[k])), (form, new_scale, write_a, k)


def _wrong_fp8_k_order(orig):
    """_ab_layout with the FP8 operands' two 16-byte K halves replaced by 32 contiguous K values."""
    def alt(mn, fmt, which):
        n, w, outer, k = orig(mn, fmt, which)
        if fmt.startswith(("fp8", "bf8")) and mfma._form(mn).f8f6f4:
            k = 32 * (np.arange(64)[:, None] // mfma._form(mn).M) + np.arange(32)[None, :]
        return n, w, outer, k
    return alt


def _wrong_cd_rows(orig):
    """_cd_layout with the 16x16 form's rows taken in another order."""
    def alt(M):
        row, col = orig(M)
        return (row[::-1].copy(), col) if M == 16 else (row, col)
    return alt


@pytest.mark.parametrize("name,wrong", [("_ab_layout", _wrong_fp8_k_order), ("_cd_layout", _wrong_cd_rows)])
def test_fast_path_follows_a_swapped_layout(monkeypatch, name, wrong):
    """A layout function swapped in (test_upstream_evidence's wrong-layout checks) is what every MFMA then
    computes with, whatever fast executors, plans and kept A operands exist from before; once restored, the
    original is again. (Plans cached from the other layout made those checks pass or fail by test order.)"""
    rng = np.random.default_rng(11)
    mn, mods = "v_mfma_scale_f32_16x16x128_f8f6f4", {"cbsz": 0, "blgp": 4}
    na, nb, nc = mfma.operand_regs(mn, mods)
    nw = 3
    a = rng.integers(0, 1 << 32, (nw, na, 64), dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 1 << 32, (nw, nb, 64), dtype=np.uint64).astype(np.uint32)
    c = rng.normal(size=(nw, nc, 64)).astype(np.float32).view(np.uint32)
    sa = (rng.integers(120, 134, (nw, 64)) * 0x01010101).astype(np.uint32)
    sb = (rng.integers(120, 134, (nw, 64)) * 0x01010101).astype(np.uint32)

    def exact():
        return np.stack([mfma.execute(mn, a[k], b[k], c[k], dict(mods, scale_a=sa[k], scale_b=sb[k]))
                         for k in range(nw)])

    with np.errstate(all="ignore"):
        before = mfma.fast_executor(mn, mods)
        right = exact()
        assert np.array_equal(before.many(a, b, c, sa, sb), right)       # plans and a kept A from the original
        monkeypatch.setattr(mfma, name, wrong(getattr(mfma, name)))
        wrong_bits = exact()
        assert not np.array_equal(wrong_bits, right)
        assert before(a[0], b[0], c[0], sa[0], sb[0]) is None and before.many(a, b, c, sa, sb) is None
        under = mfma.fast_executor(mn, mods)
        assert under is not before and mfma.fast_executor(mn, dict(mods)) is under   # one per form and layouts
        assert np.array_equal(under.many(a, b, c, sa, sb), wrong_bits)
        monkeypatch.undo()
        assert under.many(a, b, c, sa, sb) is None
        assert mfma.fast_executor(mn, dict(mods)) is before
        assert np.array_equal(mfma.fast_executor(mn, mods).many(a, b, c, sa, sb), right)


@pytest.mark.parametrize("mnemonic", ["v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4",
                                      "v_mfma_f32_16x16x128_f8f6f4"])
@pytest.mark.parametrize("cbsz,blgp", [(0, 4), (4, 4), (0, 0)])
@pytest.mark.parametrize("c_decode", [True, False])
def test_fast_path_lockstep_shared_operands(monkeypatch, mnemonic, cbsz, blgp, c_decode):
    """The lockstep forms (many over arrays; at_regs in a register file, the compiled steps of mfma_decode.c
    when built) give run()'s bits for each wave when some waves share B (and A) and others do not, in a
    shuffled group, with NaN scales and a constant accumulator; B decoded once per distinct wave
    (DEDUPE_AT 1) or per wave, and again with the kept A and B grouping of the previous call."""
    monkeypatch.setattr(mfma, "C_DECODE", c_decode)
    if c_decode and mfma.decode_lib() is None:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(cbsz * 7 + blgp)
    scaled = "scale" in mnemonic
    mods = dict(cbsz=cbsz, blgp=blgp, **({"op_sel": [1, 0], "op_sel_hi": [0, 1]} if scaled else {}))
    run = mfma.fast_executor(mnemonic, mods)
    na, nb, nc = mfma.operand_regs(mnemonic, mods)
    slots, nw = 24, 11
    regs = rng.integers(0, 1 << 32, (slots, 64, 64), dtype=np.uint64).astype(np.uint32)
    ra, rb, rc, rsa, rsb, rd = 0, 8, 16, 20, 21, 24
    regs[:, rsb] = (rng.integers(100, 154, (slots, 64)) * 0x01010101).astype(np.uint32)
    regs[3, rsb, :5] = 0xFFFFFFFF                        # NaN scales
    idx = rng.permutation(slots)[:nw].astype(np.int64)
    for src, dst in ((idx[0], idx[4]), (idx[0], idx[7]), (idx[2], idx[9]), (idx[1], idx[3])):
        regs[dst, rb: rb + nb] = regs[src, rb: rb + nb]  # shared B tiles (scales too, but for one pair)
        regs[dst, rsb] = regs[src, rsb] if dst != idx[3] else regs[dst, rsb]
        regs[dst, ra: ra + na] = regs[idx[5], ra: ra + na]
    zero_c = np.broadcast_to(np.zeros((nc, 64), np.uint32), (1, nc, 64))
    for dedupe in (1.0, 0.0):
        monkeypatch.setattr(mfma, "DEDUPE_AT", dedupe)
        mfma._RECENT_A.entries.clear()
        for call in range(2):                            # the second call finds the kept A and B grouping
            regs[:, rb: rb + nb] ^= np.uint32(call)      # ... and has to check the grouping against new B
            for const_c in (False, True):
                r = regs.copy()
                with np.errstate(all="ignore"):             # NaN scales: casts of NaN, as in the engine
                    want = [run(r[s, ra: ra + na], r[s, rb: rb + nb], np.zeros((nc, 64), np.uint32) if const_c
                                else r[s, rc: rc + nc], r[s, rsa], r[s, rsb]) for s in idx]
                with np.errstate(all="ignore"):
                    got = run.many(r[idx, ra: ra + na], r[idx, rb: rb + nb],
                                   np.broadcast_to(zero_c[0], (nw, nc, 64)) if const_c else r[idx, rc: rc + nc],
                                   r[idx, rsa], r[idx, rsb])
                    for k in range(nw):
                        assert np.array_equal(got[k], want[k]), (dedupe, call, const_c, k)
                    if run.at_regs(r, idx, ra, rb, mfma.Rows(zero_c, idx, 0, nc) if const_c else rc,
                                   rsa if scaled else None, rsb if scaled else None, rd):
                        for k, s in enumerate(idx):
                            assert np.array_equal(r[s, rd: rd + nc], want[k]), (dedupe, call, const_c, k)
                    else:
                        assert not c_decode
