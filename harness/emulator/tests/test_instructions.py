"""Instruction semantics: small gfx950 programs assembled with llvm-mc-22, run in the emulator, checked
against the ISA's documented behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from harness.emulator.engine import LaunchError
from harness.emulator.tests.asmkernel import run

L = np.arange(64, dtype=np.uint32)
RNG = np.random.default_rng(0)


def rnd_u32(n=64):
    return RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


# ---- SALU / branches ------------------------------------------------------------------------------

def test_salu_64bit_add_with_carry_and_shifts():
    r = run("""
      s_mov_b32 s12, 0xffffffff
      s_mov_b32 s13, 1
      s_add_u32 s14, s12, 2
      s_addc_u32 s15, s13, 0
      s_lshl_b64 s[16:17], s[12:13], 4
      s_mov_b32 s18, 0xabcd1234
      s_bfe_u32 s18, s18, 0x80004
      s_mul_hi_u32 s19, s12, s12
      s_ff1_i32_b32 s22, 0x100
      s_bcnt1_i32_b32 s23, 0xf0f0
      s_ashr_i32 s24, 0x80000000, 4
    """)
    assert (r.s(14), r.s(15)) == (1, 2)
    v = (0x1FFFFFFFF << 4) & (2**64 - 1)
    assert (r.s(16), r.s(17)) == (v & 0xFFFFFFFF, v >> 32)
    assert r.s(18) == 0x23
    assert r.s(19) == (0xFFFFFFFF * 0xFFFFFFFF) >> 32
    assert r.s(22) == 8 and r.s(23) == 8
    assert r.s(24) == 0xF8000000


def test_scalar_compare_branch_loop():
    # sum 1..10 with a backward branch
    r = run("""
      s_mov_b32 s12, 0
      s_mov_b32 s13, 1
    loop:
      s_add_u32 s12, s12, s13
      s_add_u32 s13, s13, 1
      s_cmp_le_u32 s13, 10
      s_cbranch_scc1 loop
      s_cselect_b32 s14, 7, 9
    """)
    assert r.s(12) == 55 and r.s(14) == 9


def test_smem_loads_kernarg_inputs():
    r = run("", sin=[1, 2, 3, 0xDEADBEEF])
    assert [r.s(8), r.s(9), r.s(10), r.s(11)] == [1, 2, 3, 0xDEADBEEF]


# ---- VALU integer ------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_valu_integer_ops(a, b):
    va = (L * np.uint32(2654435761) + np.uint32(a)).astype(np.uint32)
    vb = (L * np.uint32(40503) ^ np.uint32(b)).astype(np.uint32)
    r = run("""
      v_add_u32 v10, v2, v3
      v_sub_u32 v11, v2, v3
      v_mul_lo_u32 v12, v2, v3
      v_mul_hi_u32 v13, v2, v3
      v_lshlrev_b32 v14, v3, v2
      v_ashrrev_i32 v15, v3, v2
      v_bfe_u32 v16, v2, 5, 9
      v_alignbit_b32 v17, v2, v3, 7
      v_xad_u32 v18, v2, v3, v2
      v_lshl_or_b32 v19, v2, 3, v3
      v_max_i32 v20, v2, v3
      v_min_u32 v21, v2, v3
    """, vin=[va, vb])
    a64, b64 = va.astype(np.uint64), vb.astype(np.uint64)
    np.testing.assert_array_equal(r.v(10), va + vb)
    np.testing.assert_array_equal(r.v(11), va - vb)
    np.testing.assert_array_equal(r.v(12), va * vb)
    np.testing.assert_array_equal(r.v(13), ((a64 * b64) >> np.uint64(32)).astype(np.uint32))
    np.testing.assert_array_equal(r.v(14), va << (vb & 31))
    np.testing.assert_array_equal(r.v(15), (va.view(np.int32) >> (vb & 31).astype(np.int32)).view(np.uint32))
    np.testing.assert_array_equal(r.v(16), (va >> 5) & 0x1FF)
    np.testing.assert_array_equal(r.v(17), (((a64 << np.uint64(32)) | b64) >> np.uint64(7)).astype(np.uint32))
    np.testing.assert_array_equal(r.v(18), (va ^ vb) + va)
    np.testing.assert_array_equal(r.v(19), (va << 3) | vb)
    np.testing.assert_array_equal(r.v(20), np.maximum(va.view(np.int32), vb.view(np.int32)).view(np.uint32))
    np.testing.assert_array_equal(r.v(21), np.minimum(va, vb))


def test_valu_64bit_carry_mad_and_lshl_add():
    va, vb = rnd_u32(), rnd_u32()
    r = run("""
      v_add_co_u32 v10, vcc, v2, v3
      v_addc_co_u32 v11, vcc, v3, v2, vcc
      v_mad_u64_u32 v[12:13], s[30:31], v2, v3, v[2:3]
      v_lshl_add_u64 v[14:15], v[2:3], 3, v[4:5]
    """, vin=[va, vb, rnd_u32(), rnd_u32()])
    a, b = va.astype(np.uint64), vb.astype(np.uint64)
    lo = a + b
    carry = lo >> np.uint64(32)
    np.testing.assert_array_equal(r.v(10), lo.astype(np.uint32))
    np.testing.assert_array_equal(r.v(11), (b + a + carry).astype(np.uint32))
    pair = a | (b << np.uint64(32))
    mad = a * b + pair
    got = r.v(12).astype(np.uint64) | (r.v(13).astype(np.uint64) << np.uint64(32))
    np.testing.assert_array_equal(got, mad)
    w = r.w
    pair45 = w.v[4].astype(np.uint64) | (w.v[5].astype(np.uint64) << np.uint64(32))
    got = r.v(14).astype(np.uint64) | (r.v(15).astype(np.uint64) << np.uint64(32))
    np.testing.assert_array_equal(got, (pair << np.uint64(3)) + pair45)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 255))
def test_bitop3_truth_table(table):
    a, b, c = rnd_u32(), rnd_u32(), rnd_u32()
    r = run(f"v_bitop3_b32 v10, v2, v3, v4 bitop3:{table:#x}", vin=[a, b, c])
    want = np.zeros(64, np.uint32)
    for i in range(8):
        if table >> i & 1:
            want |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
    np.testing.assert_array_equal(r.v(10), want)


def test_bfrev_reverses_bits():
    # LLVM materializes masks such as 0xfc as v_bfrev_b32 of the inline constant 0.5 (0x3f000000)
    a = rnd_u32()
    r = run("""
      v_bfrev_b32 v10, v2
      v_bfrev_b32 v11, 0.5
    """, vin=[a])
    want = np.array([int(f"{int(x):032b}"[::-1], 2) for x in a], np.uint32)
    np.testing.assert_array_equal(r.v(10), want)
    assert (r.v(11) == 0xFC).all()


def test_perm_b32_selects_bytes_and_constants():
    r = run("v_perm_b32 v10, v2, v3, s8", vin=[np.full(64, 0x87654321, np.uint32), np.full(64, 0x0FEDCBA9, np.uint32)],
            sin=[0x0C0D0407])
    # sel bytes (lsb first): 07 -> s0 byte3 (0x87), 04 -> s0 byte0 (0x21), 0D -> 0xff, 0C -> 0x00
    assert r.v(10)[0] == 0x00FF2187


def test_perm_b32_every_selector_byte():
    """Every selector byte value 0-255 in every result byte, against the ISA's byte table taken lane by lane."""
    rng = np.random.default_rng(5)
    a, b = rnd_u32(), rnd_u32()
    a[:8] = 0x80008000                                   # sign bits set, so 8-11 give 0xFF in some lanes
    for first in range(0, 256, 64):
        sel = ((np.arange(first, first + 64)[:, None] + 64 * np.arange(4)[None, :]) % 256).astype(np.uint8)
        sel = np.ascontiguousarray(rng.permuted(sel, axis=1)).view(np.uint32).reshape(64)
        r = run("v_perm_b32 v10, v2, v3, v4", vin=[a, b, sel])
        for lane in range(64):
            x, y = int(a[lane]), int(b[lane])
            table = ([(y >> 8 * i) & 0xFF for i in range(4)] + [(x >> 8 * i) & 0xFF for i in range(4)]
                     + [0xFF * (v >> bit & 1) for v in (y, x) for bit in (15, 31)] + [0x00])
            want = sum((table[s] if s < 13 else 0xFF) << 8 * i
                       for i, s in enumerate(int(sel[lane]) >> 8 * i & 0xFF for i in range(4)))
            assert int(r.v(10)[lane]) == want, (lane, hex(int(sel[lane])))


def test_mbcnt_lane_ids():
    r = run("""
      v_mbcnt_lo_u32_b32 v10, -1, 0
      v_mbcnt_hi_u32_b32 v10, -1, v10
    """)
    np.testing.assert_array_equal(r.v(10), L)


# ---- VALU float ------------------------------------------------------------------------------------

def test_float_ops_modifiers_and_inline_constants():
    a = RNG.standard_normal(64).astype(np.float32)
    b = RNG.standard_normal(64).astype(np.float32)
    r = run("""
      v_fma_f32 v10, v2, v3, 0.5
      v_mul_f32_e64 v11, -v2, |v3|
      v_add_f32_e64 v12, v2, v3 clamp
      v_mul_f32 v13, 0.15915494, v2
      v_max_f32 v14, v2, v3
      v_rcp_f32 v15, v2
      v_mul_f32_e64 v16, v2, 4.0 div:2
      v_fmac_f32 v17, v2, v3
    """, vin=[a, b])
    np.testing.assert_array_equal(r.f(10), (a.astype(np.float64) * b + 0.5).astype(np.float32))
    np.testing.assert_array_equal(r.f(11), -a * np.abs(b))
    np.testing.assert_array_equal(r.f(12), np.clip(a + b, 0, 1))
    np.testing.assert_array_equal(r.f(13), np.float32(0.15915494) * a)
    np.testing.assert_array_equal(r.f(14), np.maximum(a, b))
    np.testing.assert_allclose(r.f(15), 1 / a, rtol=1e-6)
    np.testing.assert_array_equal(r.f(16), a * 2)
    np.testing.assert_allclose(r.f(17), a * b, rtol=1e-6)


def test_division_sequence_matches_true_division():
    num = RNG.standard_normal(64).astype(np.float32) * 100
    den = RNG.standard_normal(64).astype(np.float32)
    r = run("""
      v_div_scale_f32 v10, s[30:31], v3, v3, v2
      v_rcp_f32 v11, v10
      v_div_scale_f32 v12, vcc, v2, v3, v2
      v_fma_f32 v13, -v10, v11, 1.0
      v_fmac_f32 v11, v13, v11
      v_mul_f32 v13, v12, v11
      v_fma_f32 v14, -v10, v13, v12
      v_fmac_f32 v13, v14, v11
      v_fma_f32 v10, -v10, v13, v12
      v_div_fmas_f32 v10, v10, v11, v13
      v_div_fixup_f32 v10, v10, v3, v2
    """, vin=[num, den])
    np.testing.assert_allclose(r.f(10), num / den, rtol=2e-7)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31))
def test_cvt_pk_bf16_f32_rounds_to_nearest_even(seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(64) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
    b = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32).view(np.float32)  # includes NaN/inf
    r = run("v_cvt_pk_bf16_f32 v10, v2, v3", vin=[a, b])
    ref_lo = torch.from_numpy(a).bfloat16().view(torch.int16).numpy().view(np.uint16)
    ref_hi = torch.from_numpy(b.copy()).bfloat16().view(torch.int16).numpy().view(np.uint16)
    got = r.v(10)
    np.testing.assert_array_equal(got & 0xFFFF, ref_lo)
    finite = np.isfinite(b)
    np.testing.assert_array_equal((got >> 16)[finite], ref_hi[finite])
    assert np.isnan((got[~finite & np.isnan(b)] & 0xFFFF0000).view(np.float32)).all()


def test_packed_f32_op_sel_hi_and_packed_f16():
    a = RNG.standard_normal(64).astype(np.float32)
    b = RNG.standard_normal(64).astype(np.float32)
    h = RNG.standard_normal(128).astype(np.float16)
    hb = h.view(np.uint32)
    r = run("""
      v_pk_mul_f32 v[10:11], v[2:3], v[2:3] op_sel_hi:[0,1]
      v_pk_add_f32 v[12:13], v[2:3], v[2:3] op_sel:[1,0] op_sel_hi:[0,1]
      v_pk_add_f16 v14, v4, v4
      v_pk_fma_f32 v[16:17], v[2:3], v[2:3], v[2:3] neg_lo:[1,0,0]
      v_pk_mov_b32 v[18:19], v[2:3], v[4:5] op_sel:[1,0]
    """, vin=[a, b, hb])
    # v_pk_mov_b32: D.lo = src0[op_sel[0]], D.hi = src1[op_sel[1]] (settled by FlyDSL's fp8 GEMM epilogue)
    np.testing.assert_array_equal(r.f(18), b)
    np.testing.assert_array_equal(r.v(19), hb)
    np.testing.assert_array_equal(r.f(10), a * a)
    np.testing.assert_array_equal(r.f(11), a * b)
    np.testing.assert_array_equal(r.f(12), b + a)
    np.testing.assert_array_equal(r.f(13), a + b)
    np.testing.assert_array_equal(r.v(14).view(np.float16), (h.astype(np.float32) * 2).astype(np.float16))
    np.testing.assert_array_equal(r.f(16), (-a.astype(np.float64) * a + a).astype(np.float32))


def test_f16_conversions_and_sdwa():
    a = RNG.standard_normal(64).astype(np.float32)
    r = run("""
      v_cvt_f16_f32 v10, v2
      v_cvt_f32_f16 v11, v10
      v_mov_b32_sdwa v12, v2 dst_sel:WORD_1 dst_unused:UNUSED_PAD src0_sel:WORD_0
      v_cvt_f32_ubyte2 v13, v2
    """, vin=[a])
    np.testing.assert_array_equal(r.v(10), a.astype(np.float16).view(np.uint16).astype(np.uint32))
    np.testing.assert_array_equal(r.f(11), a.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(r.v(12), (a.view(np.uint32) & 0xFFFF) << 16)
    np.testing.assert_array_equal(r.f(13), ((a.view(np.uint32) >> 16) & 0xFF).astype(np.float32))


# ---- EXEC, VOPC, lane operations -------------------------------------------------------------------

def test_vopc_saveexec_masks_writes_and_cmpx():
    r = run("""
      v_mov_b32 v10, 7
      v_cmp_gt_u32 vcc, 20, v0
      s_and_saveexec_b64 s[30:31], vcc
      v_mov_b32 v10, 1
      s_or_b64 exec, exec, s[30:31]
      v_mov_b32 v11, 0
      v_cmpx_lt_u32 vcc, 60, v0
      v_mov_b32 v11, 5
      s_mov_b64 exec, -1
      v_cndmask_b32 v12, 3, 4, vcc
    """)
    np.testing.assert_array_equal(r.v(10), np.where(L < 20, 1, 7))
    np.testing.assert_array_equal(r.v(11), np.where(L > 60, 5, 0))
    np.testing.assert_array_equal(r.v(12), np.where(L > 60, 4, 3))


def test_readlane_readfirstlane_writelane():
    r = run("""
      v_mul_u32_u24 v10, 3, v0
      s_mov_b64 exec, 0xf0
      v_readfirstlane_b32 s30, v10
      s_mov_b64 exec, -1
      v_readlane_b32 s31, v10, 9
      v_mov_b32 v11, 0
      v_writelane_b32 v11, s31, 63
    """)
    assert r.s(30) == 12 and r.s(31) == 27
    assert r.v(11)[63] == 27 and r.v(11)[:63].sum() == 0


def test_dpp_controls():
    r = run("""
      v_mov_b32 v10, -1
      v_mov_b32_dpp v10, v0 row_shr:1 row_mask:0xf bank_mask:0xf
      v_mov_b32 v11, -1
      v_mov_b32_dpp v11, v0 row_shr:1 row_mask:0xf bank_mask:0xf bound_ctrl:1
      v_mov_b32_dpp v12, v0 quad_perm:[3,2,1,0] row_mask:0xf bank_mask:0xf
      v_mov_b32 v13, 0
      v_mov_b32_dpp v13, v0 row_bcast:15 row_mask:0xa bank_mask:0xf
      v_add_u32_dpp v14, v0, v0 row_ror:4 row_mask:0xf bank_mask:0xf
    """)
    pos = L & 15
    np.testing.assert_array_equal(r.v(10), np.where(pos == 0, 0xFFFFFFFF, L - 1))
    np.testing.assert_array_equal(r.v(11), np.where(pos == 0, 0, L - 1))
    np.testing.assert_array_equal(r.v(12), (L & np.uint32(0xFFFFFFFC)) | (3 - (L & 3)))
    row = L >> 4
    np.testing.assert_array_equal(r.v(13), np.where((row == 1) | (row == 3), (L & np.uint32(0xFFFFFFF0)) - 1, 0))
    np.testing.assert_array_equal(r.v(14), ((L & np.uint32(0xFFFFFFF0)) | ((pos - 4) & 15)) + L)


def test_permlane_swaps():
    r = run("""
      v_mov_b32 v10, v0
      v_add_u32 v11, 100, v0
      v_permlane32_swap_b32 v10, v11
      v_mov_b32 v12, v0
      v_add_u32 v13, 100, v0
      v_permlane16_swap_b32 v12, v13
    """)
    np.testing.assert_array_equal(r.v(10), np.where(L < 32, L, L - 32 + 100))
    np.testing.assert_array_equal(r.v(11), np.where(L < 32, L + 32, L + 100))
    odd = (L >> 4) & 1
    np.testing.assert_array_equal(r.v(12), np.where(odd == 1, L - 16 + 100, L))
    np.testing.assert_array_equal(r.v(13), np.where(odd == 0, L + 16, L + 100))


def test_ds_swizzle_and_bpermute():
    r = run("""
      ds_swizzle_b32 v10, v0 offset:swizzle(SWAP,8)
      ds_swizzle_b32 v11, v0 offset:swizzle(BROADCAST,4,1)
      v_sub_u32 v12, 63, v0
      v_lshlrev_b32 v12, 2, v12
      ds_bpermute_b32 v13, v12, v0
      s_waitcnt lgkmcnt(0)
    """)
    np.testing.assert_array_equal(r.v(10), L ^ 8)
    np.testing.assert_array_equal(r.v(11), (L & np.uint32(0xFFFFFFFC)) | 1)
    np.testing.assert_array_equal(r.v(13), 63 - L)


# ---- memory ----------------------------------------------------------------------------------------

def test_global_store_and_atomics():
    r = run("""
      s_load_dwordx2 s[22:23], s[0:1], 0x8
      s_waitcnt lgkmcnt(0)
      v_mul_u32_u24 v10, v0, v0
      global_store_dword v1, v10, s[22:23]
      v_mov_b32 v11, 0
      v_mov_b32 v12, 1
      global_atomic_add v13, v11, v12, s[22:23] offset:1024 sc0
      v_mov_b32 v14, 0
      global_store_dwordx2 v14, v[2:3], s[22:23] offset:2048
      global_load_ubyte v15, v0, s[22:23] offset:1
      s_waitcnt vmcnt(0)
    """, vin=[np.full(64, 11, np.uint32), np.full(64, 22, np.uint32)])
    np.testing.assert_array_equal(r.out[:64], L * L)
    assert r.out[256] == 64
    assert sorted(r.v(13).tolist()) == list(range(64))
    assert list(r.out[512:514]) == [11, 22]
    c = r.record.counters
    assert c["global_store_bytes"] == 64 * 4 + 8 * 64 and c["global_atomic_bytes"] == 256
    np.testing.assert_array_equal(r.v(15), (L * L).view(np.uint8)[1:65] if False else
                                  np.frombuffer(r.out.tobytes(), np.uint8)[1:65])


def test_buffer_num_records_bounds():
    # descriptor over the output buffer with num_records = 100 bytes: lanes 25+ are out of range
    r = run("""
      s_load_dwordx2 s[24:25], s[0:1], 0x8
      s_waitcnt lgkmcnt(0)
      s_and_b32 s25, s25, 0xffff
      s_mov_b32 s26, 100
      s_mov_b32 s27, 0x27000
      v_add_u32 v10, 1000, v0
      buffer_store_dword v10, v1, s[24:27], 0 offen
      buffer_load_dword v11, v1, s[24:27], 0 offen
      v_mov_b32 v12, -1
      buffer_load_dwordx4 v[12:15], v1, s[24:27], 0 offen offset:64
      s_waitcnt vmcnt(0)
    """)
    np.testing.assert_array_equal(r.out[:25], 1000 + L[:25])
    assert not r.out[25:64].any()
    np.testing.assert_array_equal(r.v(11), np.where(L < 25, 1000 + L, 0))
    # lane 0: bytes 64..79 -> dwords 16..19, in range up to byte 100 (dwords 16..24)
    assert r.v(12)[0] == 1016 and r.v(15)[0] == 1019
    # lane 6: dwords 22..25; dword 25 ends at byte 104 > 100 so it reads 0
    assert r.v(12)[6] == 1022 and r.v(14)[6] == 1024 and r.v(15)[6] == 0
    assert r.v(12)[9] == 0                              # lane 9: dwords 25.. are all out of range


def test_lds_read_write_forms_and_atomics():
    r = run("""
      v_lshlrev_b32 v20, 4, v0
      v_mov_b32 v10, v0
      v_add_u32 v11, 100, v0
      v_add_u32 v12, 200, v0
      v_add_u32 v13, 300, v0
      ds_write_b128 v20, v[10:13]
      ds_read_b32 v14, v20 offset:8
      ds_read_b64 v[16:17], v20 offset:4
      ds_write2_b32 v1, v10, v11 offset1:64
      s_waitcnt lgkmcnt(0)
      ds_read2st64_b32 v[18:19], v1 offset0:16 offset1:17
      v_mov_b32 v21, 0
      v_mov_b32 v22, 1
      ds_add_u32 v21, v22 offset:8192
      ds_read_b32 v23, v21 offset:8192
      ds_write_b16 v1, v0 offset:12288
      ds_read_u16 v24, v1 offset:12288
      s_waitcnt lgkmcnt(0)
    """)
    np.testing.assert_array_equal(r.v(14), 200 + L)
    np.testing.assert_array_equal(r.v(16), 100 + L)
    np.testing.assert_array_equal(r.v(17), 200 + L)
    # write2 wrote v10 at lane*4 and v11 at lane*4+256, i.e. overwrote the b128 rows' start
    lds = r.w.lds.view(np.uint32)
    assert lds[0] == 0 and lds[64] == 100
    assert (r.v(23) == 64).all()
    np.testing.assert_array_equal(r.v(24), L)
    assert r.record.counters["lds_write_bytes"] > 0


def test_buffer_load_lds_direct_uses_m0():
    r = run("""
      s_load_dwordx2 s[24:25], s[0:1], 0x0
      s_waitcnt lgkmcnt(0)
      s_and_b32 s25, s25, 0xffff
      s_mov_b32 s26, -1
      s_mov_b32 s27, 0x27000
      s_mov_b32 m0, 1024
      buffer_load_dword v1, s[24:27], 0 offen lds
      s_waitcnt vmcnt(0)
      v_add_u32 v10, 1024, v1
      ds_read_b32 v11, v10
      s_waitcnt lgkmcnt(0)
    """, vin=[L * 3])
    np.testing.assert_array_equal(r.v(11), L * 3)


def test_barrier_orders_lds_exchange_between_waves():
    # each wave writes its id to LDS, barrier, then reads the next wave's slot
    r = run("""
      v_lshrrev_b32 v10, 6, v0
      v_lshlrev_b32 v11, 2, v10
      v_add_u32 v12, 10, v10
      ds_write_b32 v11, v12
      s_waitcnt lgkmcnt(0)
      s_barrier
      v_add_u32 v13, 1, v10
      v_and_b32 v13, 3, v13
      v_lshlrev_b32 v13, 2, v13
      ds_read_b32 v14, v13
      s_waitcnt lgkmcnt(0)
    """, block=256)
    for k, w in enumerate(sorted(r.waves, key=lambda w: w.wave_id)):
        assert (w.v[14] == 10 + (k + 1) % 4).all()
    assert r.record.counters["barriers"] == 1 and r.record.counters["waves"] == 4


def test_workitem_ids_exec_for_partial_wave():
    r = run("v_mov_b32 v10, v0", block=80)
    assert len(r.waves) == 2
    w1 = sorted(r.waves, key=lambda w: w.wave_id)[1]
    assert w1.exec == (1 << 16) - 1
    np.testing.assert_array_equal(w1.v[10][:16], 64 + L[:16])


def test_unknown_instruction_stops_with_mnemonic_and_pc():
    with pytest.raises(LaunchError, match=r"v_cvt_norm_i16_f16|unsupported instruction"):
        run("v_cvt_norm_i16_f16 v10, v2")


def test_counters_classify_instructions():
    r = run("v_add_u32 v10, v2, v3\n s_add_u32 s12, s8, s9")
    c = r.record.counters["instructions"]
    assert c["valu"] >= 2 and c["salu"] >= 1 and c["vmem"] == 4 and c["smem"] == 2
