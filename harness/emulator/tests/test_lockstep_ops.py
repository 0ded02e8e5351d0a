"""Each instruction form that lockstep.py runs over a group of waves gives what every wave alone gives.

Small assembled programs (asmkernel.py) run with 4 waves per workgroup and 2 workgroups, once wave by wave
(lockstep=False) and once in lockstep, with the detectors off, on without interleaving (every wave meets the
others at every PC) and on with a seeded interleaving: every wave's registers and the counters must be
equal. Programs are written so that the waves differ (lanes out of a buffer's bounds in some waves only,
partial EXEC), so both the whole and the partial forms of the group paths run.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.emulator import engine, numerics
from harness.emulator.ops_matrix import LANEWISE_CVT
from harness.emulator.sanitizer import GroupLoad, MemoryMap, WaveSan
from harness.emulator.tests.asmkernel import run

SANITIZE = [dict(), dict(sanitize={"waits", "hazards", "races"}),
            dict(sanitize=True, interleave_seed=7, workgroup_order_seed=3)]
IDS = ["plain", "sanitized", "interleaved"]


def _inputs():
    x = (np.arange(4096, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32)
    x[256:260] = 0                       # s8..s11 (unused)
    return x


def _both(body, opts, regs, memory=None, **kw):
    """Run `body` both ways; assert equal registers (rows `regs` of every wave) and counters."""
    got = []
    for lockstep in (False, True):
        o = dict(opts, lockstep=lockstep)
        if memory is not None:
            o["memory"] = memory
        r = run(body, inputs=_inputs(), block=256, grid=2, options=o, **kw)
        waves = sorted(r.waves, key=lambda w: (w.wg_id, w.wave_id))
        got.append(([w.v[regs].copy() for w in waves], r.record.counters, r.out.copy()))
    (va, ca, oa), (vb, cb, ob) = got
    assert ca == cb
    assert len(va) == 8 and all(np.array_equal(a, b) for a, b in zip(va, vb))
    np.testing.assert_array_equal(oa, ob)
    return got[1]


def _batched(body) -> dict:
    """lockstep.batched_table's entry of each instruction of `body` by mnemonic (None: runs wave by wave)."""
    from harness.emulator import lockstep, runtime
    from harness.emulator.codeobject import read_code_object
    from harness.emulator.tests.asmkernel import assemble

    program, _ = runtime.program_for(read_code_object(assemble(body)), "k")
    table = lockstep.batched_table(program)
    return {inst.mnemonic.removesuffix("_e32"): table[(inst.pc - program.base) >> 2]
            for inst in program.insts.values()}


# buffer over the input, num_records 3000 bytes: lane offset 12 * thread, so wave 3 (threads 192..255,
# bytes 2304..) is partly out of range and waves 0..2 are wholly in range (a different form per wave)
BUFFER = """
  s_load_dwordx2 s[24:25], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  s_and_b32 s25, s25, 0xffff
  s_movk_i32 s26, 3000
  s_mov_b32 s27, 0x27000
  v_mul_u32_u24 v21, 12, v0
"""

LOADS = BUFFER + """
  v_mov_b32 v30, -1
  v_mov_b32 v40, -1
  v_mov_b32 v41, -1
  buffer_load_dword v30, v21, s[24:27], 0 offen
  buffer_load_dwordx4 v[32:35], v21, s[24:27], 0 offen offset:100
  buffer_load_dwordx3 v[36:38], v21, s[24:27], 0 offen offset:600
  buffer_load_dwordx2 v[42:43], v21, s[24:27], 0 offen offset:2
  buffer_load_ushort v39, v21, s[24:27], 0 offen offset:6
  buffer_load_sbyte_d16_hi v40, v21, s[24:27], 0 offen offset:3
  buffer_load_short_d16 v41, v21, s[24:27], 0 offen offset:10
  s_waitcnt vmcnt(0)
  v_cmp_gt_u32 vcc, 0x2a, v0
  v_and_b32 v22, 0x3f, v0
  v_cmp_lt_u32 s[30:31], 20, v22
  s_and_saveexec_b64 s[32:33], s[30:31]
  buffer_load_dwordx4 v[44:47], v21, s[24:27], 0 offen offset:16
  buffer_load_dword v48, v21, s[24:27], 0 offen offset:2900
  s_mov_b64 exec, 0
  buffer_load_dword v49, v21, s[24:27], 0 offen
  s_mov_b64 exec, s[32:33]
  s_waitcnt vmcnt(0)
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_buffer_loads_in_and_out_of_range_and_partial_exec(opts):
    v, c, _ = _both(LOADS, opts, slice(30, 50))
    # the program does what it says: wave 3 of each workgroup has lanes zero-filled, the others none
    assert c["global_load_bytes"] > 0
    wave3 = v[3]
    lane_off = 12 * (192 + np.arange(64))
    np.testing.assert_array_equal(wave3[0], np.where(lane_off + 4 <= 3000, _inputs()[lane_off // 4], 0))
    assert (v[0][0] == _inputs()[12 * np.arange(64) // 4]).all()
    # partial EXEC: lanes 0..20 of every wave keep the register's old value (0), the others loaded
    tid = 64 + np.arange(64)
    assert not v[1][14][:21].any()
    np.testing.assert_array_equal(v[1][14][21:], _inputs()[(12 * tid + 16) // 4][21:])


class _Map:
    """A memory option (emulator.guard's interface) reaching [start, end) of the input and the kernarg."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def memory_map(self, extra=()):
        return MemoryMap([(self.start, self.end, "input", None)] + list(extra))


@pytest.mark.parametrize("access", ["buffer_load_dwordx4 v[32:35], v21, s[24:27], 0 offen offset:100",
                                    "buffer_store_dword v2, v21, s[24:27], 0 offen"])
@pytest.mark.parametrize("interleave", [False, True])
def test_buffer_memory_report_names_the_same_wave(interleave, access):
    """Only wave 3's lanes reach past the mapped bytes (2900 of the input): the report names it both ways."""
    x = _inputs()
    opts = dict(sanitize=True, interleave_seed=5) if interleave else dict(sanitize={"waits", "hazards"})
    msgs = []
    for lockstep in (False, True):
        mem = _Map(x.ctypes.data, x.ctypes.data + 2900)
        with pytest.raises(engine.SanitizerReport) as err:
            run(BUFFER + access + """
              s_waitcnt vmcnt(0)
            """, inputs=x, block=256, grid=1, options=dict(opts, lockstep=lockstep, memory=mem))
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]
    assert "wave 3" in msgs[0] and "out-of-bounds" in msgs[0]


# scalar loads at a per-wave address (wave w reads input bytes 256 w + 0x900..): sanitizer._smem_handler's
# group form checks the group's addresses at once, then loads and queues each wave's
SMEM = """
  v_readfirstlane_b32 s40, v0
  s_lshl_b32 s41, s40, 2
  s_add_u32 s42, s20, s41
  s_addc_u32 s43, s21, 0
  s_load_dwordx4 s[44:47], s[42:43], 0x900
  s_load_dword s48, s[42:43], 0x904
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v30, s44
  v_mov_b32 v31, s47
  v_mov_b32 v32, s48
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_scalar_loads_at_per_wave_addresses(opts):
    v = _both(SMEM, opts, [30, 31, 32])[0]
    x = _inputs()
    for k, regs in enumerate(v):
        first = (k % 4) * 64 + 0x900 // 4    # dword index: the wave's first thread id, then 0x900 bytes
        np.testing.assert_array_equal(regs[0], np.full(64, x[first]))
        np.testing.assert_array_equal(regs[1], np.full(64, x[first + 3]))
        np.testing.assert_array_equal(regs[2], np.full(64, x[first + 1]))


# scalar buffer loads at a per-wave offset (12 x the wave's first thread id + 686) into BUFFER's 3000-byte
# buffer: wave 3 of each workgroup reads bytes 2988.. (num_records clips its x4 load to 12 bytes), the others
# whole; the group form checks each byte count's addresses at once
SBUF = BUFFER + """
  v_readfirstlane_b32 s40, v0
  s_mul_i32 s41, s40, 12
  s_add_u32 s41, s41, 686
  s_buffer_load_dwordx4 s[44:47], s[24:27], s41
  s_buffer_load_dword s48, s[24:27], 0x10
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v30, s44
  v_mov_b32 v31, s46
  v_mov_b32 v32, s47
  v_mov_b32 v33, s48
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_scalar_buffer_loads_clipped_per_wave(opts):
    x = _inputs()
    v = _both(SBUF, opts, [30, 31, 32, 33])[0]
    for k, regs in enumerate(v):
        first = (12 * 64 * (k % 4) + 686) // 4          # the wave's first dword (SMEM drops the low 2 bits)
        want = [x[first + j] if 4 * (first + j) + 4 <= 3000 else 0 for j in (0, 2, 3)] + [x[4]]
        for row, value in zip(regs, want):
            np.testing.assert_array_equal(row, np.full(64, value))
    assert (v[3][2] == 0).all() and (v[3][1] != 0).all()    # wave 3: only its last dword past num_records


def test_scalar_buffer_load_checks_are_grouped(monkeypatch):
    """Lockstep checks each byte count's addresses at once: the same 16 addresses (8 waves, 2 loads) in
    fewer calls than wave by wave, wave 3's clipped 12 bytes in a call of their own."""
    x = _inputs()
    calls = {}
    real_check = MemoryMap.check

    def check(self, addrs, nbytes, lanes, what, *a, **k):
        if "s_buffer_load" in what:
            calls.setdefault(lockstep, []).append((len(addrs), nbytes))
        return real_check(self, addrs, nbytes, lanes, what, *a, **k)
    monkeypatch.setattr(MemoryMap, "check", check)
    for lockstep in (False, True):
        run(SBUF, inputs=x, block=256, grid=2, options=dict(sanitize=True, lockstep=lockstep,
                                                             memory=_Map(x.ctypes.data, x.ctypes.data + x.nbytes)))
    alone, together = calls[False], calls[True]
    assert sorted(n for n, _ in alone) == [1] * 16
    assert sum(n for n, _ in together) == 16 and len(together) < len(alone)
    assert sum(n for n, nb in together if nb == 12) == 2      # wave 3 of each workgroup


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("program,mapped", [pytest.param(SMEM, 2900, id="s_load"),
                                            pytest.param(SBUF, 2990, id="s_buffer_load")])
def test_scalar_load_report_names_the_same_wave(program, mapped, interleave):
    """Only wave 3's scalar load reaches past the mapped bytes (SMEM: bytes 768 + 0x900.. past 2900; SBUF: its
    clipped load, bytes 2988..2999, past 2990): the report names it both ways."""
    x = _inputs()
    opts = dict(sanitize=True, interleave_seed=5) if interleave else dict(sanitize={"waits", "hazards"})
    msgs = []
    for lockstep in (False, True):
        with pytest.raises(engine.SanitizerReport) as err:
            run(program, inputs=x, block=256, grid=1,
                options=dict(opts, lockstep=lockstep, memory=_Map(x.ctypes.data, x.ctypes.data + mapped)))
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]
    assert "wave 3" in msgs[0] and "out-of-bounds" in msgs[0]


# per-wave operands (16 bytes per thread from the input), MFMAs with VGPR and constant accumulators, two
# scale forms, one unscaled FP4 one and two bf16 ones; each wave's registers differ
MFMA = """
  v_lshlrev_b32 v50, 4, v0
  global_load_dwordx4 v[60:63], v50, s[20:21]
  global_load_dwordx4 v[64:67], v50, s[20:21] offset:2048
  global_load_dwordx4 v[68:71], v50, s[20:21] offset:1024
  global_load_dwordx4 v[72:75], v50, s[20:21] offset:3072
  global_load_dwordx4 v[84:87], v50, s[20:21] offset:512
  s_waitcnt vmcnt(0)
  v_and_b32 v76, 0x7f7f7f7f, v60
  v_or_b32 v76, 0x78787878, v76
  v_mov_b32 v77, 0x7c7e8081
  v_mfma_scale_f32_16x16x128_f8f6f4 v[80:83], v[60:67], v[68:75], 0, v76, v77 op_sel_hi:[0,0,0]
  v_mfma_scale_f32_16x16x128_f8f6f4 v[88:91], v[60:67], v[68:75], v[84:87], v77, v76 op_sel:[1,0,0] op_sel_hi:[0,1,0]
  v_mfma_f32_16x16x128_f8f6f4 v[92:95], v[60:63], v[68:71], v[84:87] cbsz:4 blgp:4
  v_mfma_f32_16x16x32_bf16 v[96:99], v[60:63], v[64:67], v[84:87]
  v_mfma_f32_32x32x16_bf16 v[100:115], v[68:71], v[72:75], 0
  s_nop 15
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_mfma_group_gathers_each_waves_operands(opts):
    v, c, _ = _both(MFMA, opts, slice(80, 116))
    assert c["mfma"] == {"v_mfma_scale_f32_16x16x128_f8f6f4": 16, "v_mfma_f32_16x16x128_f8f6f4": 8,
                         "v_mfma_f32_16x16x32_bf16": 8, "v_mfma_f32_32x32x16_bf16": 8}
    assert not np.array_equal(v[0], v[1])          # the waves computed different things


@pytest.mark.parametrize("mnemonic", sorted(LANEWISE_CVT))
def test_lanewise_conversions(mnemonic):
    """A LANEWISE_CVT conversion over (waves, 64) sources gives each wave's (64,) result: random bits, with
    op_sel / clamp / SDWA selector / abs-neg modifiers."""
    rng = np.random.default_rng(len(mnemonic))
    nsrc = len(numerics.CVT_SRC_DWORDS.get(mnemonic, (1,)))
    ran = 0
    for mods in ({}, {"op_sel": [1, 1, 0, 1]}, {"op_sel": [0, 0, 1, 0], "clamp": 1}, {"src0_sel": "BYTE_2"},
                 {"abs": [1, 0], "neg": [0, 1]}):
        srcs = [rng.integers(0, 1 << 32, (3, 64), dtype=np.uint64).astype(np.uint32) for _ in range(nsrc)]
        if nsrc == 3:
            srcs[2] = (rng.integers(100, 150, (3, 64)) << 23).astype(np.uint32)
        old = rng.integers(0, 1 << 32, (3, 64), dtype=np.uint64).astype(np.uint32)
        try:
            want = np.stack([numerics.execute_cvt(mnemonic, [s[k] for s in srcs], old[k], dict(mods))
                             for k in range(3)])
        except NotImplementedError:
            continue                     # a modifier the instruction does not take
        np.testing.assert_array_equal(numerics.execute_cvt(mnemonic, srcs, old, dict(mods)), want)
        ran += 1
    assert ran >= 2


CVT = """
  v_lshlrev_b32 v50, 4, v0
  global_load_dwordx4 v[60:63], v50, s[20:21]
  s_waitcnt vmcnt(0)
  v_lshlrev_b32 v47, 3, v40
  v_add_u32 v47, 0xb000, v47
  v_mov_b32 v70, -1
  v_mov_b32 v71, -1
  v_mov_b32 v73, -1
  v_cvt_pk_fp8_f32 v70, v60, v61
  v_cvt_pk_fp8_f32 v70, v62, v63 op_sel:[0,0,1]
  v_and_b32 v72, 0x3f, v0
  v_cmp_lt_u32 s[30:31], 37, v72
  s_and_saveexec_b64 s[32:33], s[30:31]
  v_mov_b32 v64, 0x3f800000
  v_cvt_scalef32_pk_fp8_f32 v71, v60, v61, v64
  v_cvt_pk_bf16_f32 v73, v62, v63
  s_mov_b64 exec, s[32:33]
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_conversion_group_under_partial_exec(opts):
    v, _, _ = _both(CVT, opts, slice(70, 74))
    assert not np.array_equal(v[0], v[1])
    assert (v[2][1][:38] == 0xFFFFFFFF).all() and (v[2][3][:38] == 0xFFFFFFFF).all()   # outside EXEC: kept


# the special VALU forms lockstep.py batches (fmac with the destination as addend, the literal fma forms,
# the division steps, bitop3 (b16: halves by op_sel); v_div_scale through its group form, its SGPR destination per wave) on finite floats
# that differ per wave, an SGPR that differs per workgroup, and an EXEC that differs per wave (from the data)
SPECIAL_VALU = """
  v_and_b32 v30, 0x3fffffff, v2
  v_or_b32 v30, 0x3c000000, v30
  v_and_b32 v31, 0xbfffffff, v3
  v_or_b32 v31, 0x3c000000, v31
  v_and_b32 v32, 0x3fffffff, v4
  s_lshl_b32 s40, s2, 20
  s_add_u32 s40, s40, 0x3fc00000
  v_mov_b32 v40, v32
  v_fmac_f32_e32 v40, v30, v31
  v_mov_b32 v41, v32
  v_fmac_f32_e32 v41, 0x40490fdb, v31
  v_mov_b32 v42, v32
  v_fmac_f32_e32 v42, s40, v30
  v_fmaak_f32 v43, v30, v31, 0x3e800000
  v_fmamk_f32 v44, v30, 0xc0200000, v31
  v_fmaak_f32 v45, v31, v32, 0x41200000
  v_fmamk_f32 v46, v32, 0x3f000000, v30
  s_mov_b64 vcc, -1
  s_mov_b64 s[34:35], -1
  v_and_b32 v24, 0x3f, v5
  v_cmp_lt_u32 s[30:31], 26, v24
  s_and_saveexec_b64 s[32:33], s[30:31]
  v_div_scale_f32 v47, vcc, v30, v31, v30
  v_div_scale_f32 v48, s[34:35], v31, v31, v30
  v_rcp_f32 v49, v48
  v_div_fmas_f32 v50, v47, v49, 0
  v_div_fixup_f32 v51, v50, v31, v30
  v_fmac_f32_e32 v52, v51, v49
  v_bitop3_b32 v57, v30, v31, v5 bitop3:0x96
  v_bitop3_b16 v58, v30, v5, v32 bitop3:0xe8 op_sel:[1,0,1,1]
  s_mov_b64 exec, s[32:33]
  v_mov_b32 v53, vcc_lo
  v_mov_b32 v54, s34
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_special_valu_forms(opts):
    v, _, _ = _both(SPECIAL_VALU, opts, slice(40, 59))
    assert not np.array_equal(v[0], v[1])
    table = _batched(SPECIAL_VALU)
    assert all(table[m] is not None for m in ("v_fmac_f32", "v_fmaak_f32", "v_fmamk_f32", "v_div_fmas_f32",
                                              "v_div_fixup_f32", "v_bitop3_b32", "v_bitop3_b16")), table
    inp = _inputs()
    f32 = lambda a: a.view(np.float32).astype(np.float64)        # noqa: E731
    for w in (0, 5):                                              # wave 0 of workgroup 0, wave 1 of workgroup 1
        tid = 64 * (w % 4) + np.arange(64)
        x = f32((inp[tid] & 0x3FFFFFFF) | 0x3C000000)
        y = f32((inp[64 + tid] & 0xBFFFFFFF) | 0x3C000000)
        z = f32(inp[128 + tid] & 0x3FFFFFFF)
        s40 = f32(np.uint32(((w // 4) << 20) + 0x3FC00000))
        got = [f32(v[w][r]) for r in range(7)]
        for g, want in zip(got, (x * y + z, 3.14159274 * y + z, s40 * x + z, x * y + 0.25, x * -2.5 + y,
                                 y * z + 10.0, z * 0.5 + x)):
            np.testing.assert_allclose(g, want, rtol=1e-6)
        on = (inp[192 + tid] & 0x3F) > 26                          # this wave's EXEC for the division steps
        assert on.any() and not on.all()
        np.testing.assert_allclose(f32(v[w][11])[on], (x / y)[on], rtol=1e-6)   # the division steps divide
        assert not v[w][12][~on].any()                           # v52 outside EXEC: old (0)
        assert not v[w][13].any() and not v[w][14].any()         # VCC and s34 (-1 before) written 0
    on0, on1 = ((inp[192 + 64 * k + np.arange(64)] & 0x3F) > 26 for k in (0, 1))
    assert not np.array_equal(on0, on1)                          # the waves' EXEC masks differ


# table-driven VALU with an SGPR operand that differs by wave (s7: the wave's first thread id in a NaN) and
# one that does not (s40), both sources NaN, under partial EXEC that differs by wave: a batch must give each
# lane the NaN a wave alone gives
NAN_SGPRS = """
  v_readfirstlane_b32 s7, v0
  s_or_b32 s7, s7, 0x7f800001
  s_mov_b32 s40, 0xffc00005
  v_or_b32 v20, 0x7fa00000, v0
  v_and_b32 v24, 0x3f, v5
  v_cmp_lt_u32 s[30:31], 20, v24
  s_and_saveexec_b64 s[32:33], s[30:31]
  v_add_f32 v30, s7, v20
  v_mul_f32_e64 v31, v20, s7
  v_add_f32 v32, s40, v20
  v_pk_add_f16 v33, s7, v20 op_sel:[1,0]
  v_max_f32 v34, s7, v20
  v_add_f32 v35, v20, v20
  s_mov_b64 exec, s[32:33]
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_valu_nan_operands_with_per_wave_sgprs(opts):
    v, _, _ = _both(NAN_SGPRS, opts, slice(30, 36))
    assert not np.array_equal(v[0][0], v[1][0])                   # the waves' results differ
    assert np.isnan(v[0][0].view(np.float32)[v[0][0] != 0]).all()  # lanes in EXEC: NaN


# integer rows whose SGPR sources differ by wave (s2: the workgroup id; s7: a lane of v0): a wave's result
# never depends on which NaN numpy picks, so they run batched whatever the SGPRs hold
INT_SGPRS = """
  v_readfirstlane_b32 s7, v0
  s_lshl_b32 s40, s2, 7
  v_and_b32 v24, 0x3f, v5
  v_cmp_lt_u32 s[30:31], 20, v24
  s_and_saveexec_b64 s[32:33], s[30:31]
  v_add_u32 v30, s7, v5
  v_lshl_add_u32 v31, v5, 2, s40
  v_mul_lo_u32 v32, s40, v5
  v_sub_u32 v33, s40, v5
  v_pk_add_u16 v34, s7, v5 op_sel:[1,0]
  v_max_i32 v35, s7, v5
  v_add_f32 v36, s7, v5
  v_and_b32 v25, 0x0f0f0f0f, v5
  v_perm_b32 v37, s7, v5, v25
  v_perm_b32 v38, v5, v25, s40
  v_bfrev_b32 v39, v5
  s_mov_b64 exec, s[32:33]
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_valu_integer_rows_batched_with_per_wave_sgprs(opts):
    v, _, _ = _both(INT_SGPRS, opts, slice(30, 40))
    assert not np.array_equal(v[0][0], v[1][0])                   # s7 differs between a workgroup's waves
    assert not np.array_equal(v[0][1], v[4][1])                   # s40 between workgroups
    table = _batched(INT_SGPRS)
    ints = ("v_add_u32", "v_lshl_add_u32", "v_mul_lo_u32", "v_sub_u32", "v_pk_add_u16", "v_max_i32", "v_perm_b32",
            "v_bfrev_b32")
    assert all(table[m] == () for m in ints), table
    assert table["v_add_f32"] == (7,)                             # two float sources: the SGPR is checked


# stores through a buffer over the output (32 KB), each form to its own region, per-thread disjoint bytes
# (the group's one scatter), then a store under partial EXEC and one with lanes past num_records (wave by
# wave)
STORES = """
  s_load_dwordx2 s[24:25], s[0:1], 0x8
  s_waitcnt lgkmcnt(0)
  s_and_b32 s25, s25, 0xffff
  s_mov_b32 s26, 0x8000
  s_mov_b32 s27, 0x27000
  s_lshl_b32 s40, s2, 8
  v_add_u32 v20, s40, v0
  v_lshlrev_b32 v21, 4, v20
  v_lshlrev_b32 v22, 2, v20
  v_lshlrev_b32 v23, 1, v20
  v_lshlrev_b32 v26, 3, v20
  buffer_store_dwordx4 v[2:5], v21, s[24:27], 0 offen
  s_movk_i32 s41, 0x2000
  buffer_store_dword v3, v22, s[24:27], s41 offen
  s_movk_i32 s41, 0x2800
  buffer_store_dwordx2 v[4:5], v26, s[24:27], s41 offen
  s_movk_i32 s41, 0x3800
  buffer_store_short v4, v23, s[24:27], s41 offen
  s_movk_i32 s41, 0x3c00
  buffer_store_byte v5, v20, s[24:27], s41 offen
  s_movk_i32 s41, 0x3e00
  buffer_store_short_d16_hi v2, v23, s[24:27], s41 offen
  v_and_b32 v24, 0x3f, v0
  v_cmp_lt_u32 s[30:31], 40, v24
  s_and_saveexec_b64 s[32:33], s[30:31]
  s_movk_i32 s41, 0x4200
  buffer_store_dword v5, v22, s[24:27], s41 offen
  s_mov_b64 exec, s[32:33]
  s_movk_i32 s26, 0x73a0
  v_mul_u32_u24 v25, 24, v20
  s_movk_i32 s41, 0x4e20
  buffer_store_dwordx3 v[2:4], v25, s[24:27], s41 offen
  s_movk_i32 s26, 0x7ffc
  s_movk_i32 s41, 0x7698
  buffer_store_dwordx2 v[4:5], v26, s[24:27], s41 offen
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_buffer_stores_every_form(opts):
    _, c, out = _both(STORES, opts, slice(2, 6), out_words=8192)
    assert c["global_store_bytes"] > 0
    np.testing.assert_array_equal(out[0:1024:4], _inputs()[:256])            # dwordx4 lane t: v2 = in[t]


# every wave of both workgroups stores to the same 256 bytes: the last writer wins, the same one both ways
# (without interleaving both ways run the waves in slot order)
OVERLAP = """
  s_load_dwordx2 s[24:25], s[0:1], 0x8
  s_waitcnt lgkmcnt(0)
  s_and_b32 s25, s25, 0xffff
  s_mov_b32 s26, 0x4000
  s_mov_b32 s27, 0x27000
  v_and_b32 v20, 0x3f, v0
  v_lshlrev_b32 v21, 2, v20
  v_lshlrev_b32 v22, 10, v0
  v_add_u32 v22, s2, v22
  buffer_store_dword v22, v21, s[24:27], 0 offen
"""


@pytest.mark.parametrize("opts", SANITIZE[:2], ids=IDS[:2])
def test_overlapping_stores_last_wave_wins(opts):
    _, _, out = _both(OVERLAP, opts, slice(20, 23))
    np.testing.assert_array_equal(out[:64], (192 + np.arange(64)) * 1024 + 1)


# compares (VCC, an SGPR pair, EXEC; integer, float, class; an SGPR source that differs per workgroup) and
# selects on their masks under partial EXEC; each wave's data differs
COMPARE = """
  v_xor_b32 v30, v2, v3
  v_and_b32 v24, 0x3f, v0
  v_cmp_gt_u32 vcc, v2, v3
  v_cndmask_b32 v40, v4, v5, vcc
  v_cmp_lt_f32 s[30:31], v4, v5
  v_cndmask_b32 v41, v2, v30, s[30:31]
  v_cmp_class_f32 s[34:35], v5, 0x3f
  v_cmp_eq_u32 s[36:37], s2, v24
  v_cmp_ne_u32 vcc, 0, v24
  v_cndmask_b32 v42, -v4, |v5|, s[34:35]
  s_mov_b64 s[38:39], exec
  v_cmpx_le_u32 s[32:33], 21, v24
  v_cmp_ge_i32 vcc, v2, v5
  v_cndmask_b32 v43, 7, v3, vcc
  v_cndmask_b32 v44, v2, 0, s[36:37]
  s_mov_b64 exec, s[38:39]
  v_mov_b32 v45, s30
  v_mov_b32 v46, s31
  v_mov_b32 v47, s34
  v_mov_b32 v48, s36
  v_mov_b32 v49, s32
  v_mov_b32 v50, vcc_lo
  v_mov_b32 v51, vcc_hi
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_compares_and_selects(opts):
    v, _, _ = _both(COMPARE, opts, slice(40, 52))
    assert not np.array_equal(v[0], v[1])
    assert not v[0][3][:21].any() and v[0][3][21:].all()        # v43 outside EXEC (lanes < 21): old (0)


# LDS in every group form (ds_write/ds_read of each size, d16 halves and sign extension, unaligned bytes,
# write2/read2 b32/b64/st64), with lanes of one wave overlapping (the later lane wins), waves of both
# workgroups in one batch (each its own LDS), reads of another wave's bytes after a barrier, partial EXEC,
# and lanes of wave 3 outside the LDS (writes dropped, reads 0; one read only through its offset): those last
# two run wave by wave
LDS = """
  v_lshlrev_b32 v20, 4, v0
  v_mul_u32_u24 v21, 5, v0
  v_add_u32 v21, 0x7000, v21
  v_xor_b32 v24, v2, v0
  v_add_u32 v24, s2, v24
  v_xor_b32 v25, v3, v0
  v_mul_u32_u24 v26, 3, v4
  v_add_u32 v26, v26, v0
  v_xor_b32 v27, v5, v24
  v_and_b32 v28, 0xffffffe0, v20
  v_add_u32 v29, 0x4000, v20
  v_lshlrev_b32 v30, 2, v0
  v_add_u32 v30, 0x5000, v30
  v_add_u32 v31, 0x2000, v21
  v_lshlrev_b32 v32, 2, v0
  v_add_u32 v32, 0xfc18, v32
  ds_write_b128 v20, v[24:27]
  ds_write_b32 v28, v25 offset:8192
  ds_write_b64 v20, v[26:27] offset:8200
  ds_write2_b32 v29, v24, v25 offset0:1 offset1:3
  ds_write2_b64 v29, v[26:27], v[24:25] offset0:0 offset1:1
  ds_write2st64_b32 v30, v26, v27 offset0:0 offset1:16
  ds_write_b8 v21, v24
  ds_write_b16 v21, v25 offset:2
  ds_write_b8_d16_hi v21, v26 offset:4
  ds_write_b32 v31, v27
  v_lshrrev_b32 v33, 6, v0
  v_lshlrev_b32 v33, 3, v33
  v_add_u32 v33, v31, v33
  ds_write_b64 v33, v[24:25] offset:2048
  ds_write_b16_d16_hi v31, v26 offset:4096
  ds_write_b32 v32, v24
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_add_u32 v40, 64, v0
  v_and_b32 v40, 0xff, v40
  v_lshlrev_b32 v41, 4, v40
  v_add_u32 v42, 0x4000, v41
  v_lshlrev_b32 v43, 2, v40
  v_add_u32 v43, 0x5000, v43
  v_mul_u32_u24 v44, 5, v40
  v_add_u32 v44, 0x7000, v44
  v_add_u32 v45, 0x2000, v44
  v_lshlrev_b32 v47, 3, v40
  v_add_u32 v47, 0xb000, v47
  v_mov_b32 v70, -1
  v_mov_b32 v71, -1
  ds_read_b128 v[50:53], v41
  ds_read_b32 v54, v41 offset:8192
  ds_read_b64 v[56:57], v41 offset:8200
  ds_read2_b32 v[58:59], v42 offset0:1 offset1:3
  ds_read2_b64 v[60:63], v42 offset0:0 offset1:1
  ds_read2st64_b32 v[64:65], v43 offset0:0 offset1:16
  ds_read_u8 v66, v44
  ds_read_i8 v67, v44 offset:1
  ds_read_u16 v68, v44 offset:2
  ds_read_i16 v69, v44 offset:3
  ds_read_u16_d16_hi v70, v44 offset:2
  ds_read_u8_d16 v71, v44 offset:4
  ds_read_b32 v72, v45
  v_lshrrev_b32 v46, 6, v40
  v_lshlrev_b32 v46, 3, v46
  v_add_u32 v46, v45, v46
  ds_read_b64 v[74:75], v46 offset:2048
  ds_read_b96 v[76:78], v41
  ds_read_b32 v79, v32
  v_lshlrev_b32 v34, 2, v0
  v_add_u32 v34, 0xf000, v34
  ds_read_b32 v83, v34 offset:3200
  s_waitcnt lgkmcnt(0)
  v_and_b32 v22, 0x3f, v0
  v_cmp_lt_u32 s[30:31], 20, v22
  s_and_saveexec_b64 s[32:33], s[30:31]
  ds_read_b32 v55, v41 offset:4
  ds_write_b32 v41, v24 offset:4096
  ds_write2_b32 v47, v24, v25 offset0:0 offset1:1
  s_waitcnt lgkmcnt(0)
  s_mov_b64 exec, s[32:33]
  s_barrier
  ds_read2_b32 v[80:81], v47 offset0:0 offset1:1
  ds_read_b32 v82, v41 offset:4096
  s_waitcnt lgkmcnt(0)
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_lds_reads_and_writes_every_form(opts):
    v, c, _ = _both(LDS, opts, slice(50, 84))
    assert c["lds_read_bytes"] > 0 and c["lds_write_bytes"] > 0 and c["lds_bank_conflicts"] > 0
    # wave 0 read wave 1's ds_write_b128 (thread t + 64); wave 3 (threads 192..) lanes past the LDS read 0
    t = 64 + np.arange(64)
    np.testing.assert_array_equal(v[0][0], _inputs()[t] ^ t)
    tid = 192 + np.arange(64)
    assert not v[3][29][4 * tid + 0xfc18 + 4 > 65536].any() and v[3][29][4 * tid + 0xfc18 + 4 <= 65536].any()
    assert not v[3][33][4 * tid + 0xfc80 + 4 > 65536].any()       # outside only through the offset
    assert not v[1][5][:21].any() and v[1][5][21:].all()            # partial EXEC: old (0) outside
    assert not np.array_equal(v[0], v[4])                           # the workgroups' LDS differ


# ds_read_b64_tr_b16/b8/b4 (transposing LDS reads) of another wave's bytes after a barrier; lanes of wave 3
# outside the LDS (they read 0) and partial EXEC run wave by wave
LDS_TR = """
  v_lshlrev_b32 v20, 4, v0
  v_xor_b32 v24, v2, v0
  v_add_u32 v24, s2, v24
  v_xor_b32 v25, v3, v0
  v_mul_u32_u24 v26, 3, v4
  v_add_u32 v26, v26, v0
  v_xor_b32 v27, v5, v24
  ds_write_b128 v20, v[24:27]
  ds_write_b128 v20, v[24:27] offset:61440
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_add_u32 v40, 64, v0
  v_and_b32 v40, 0xff, v40
  v_lshlrev_b32 v41, 3, v40
  v_lshlrev_b32 v43, 3, v0
  v_add_u32 v43, 0xfa00, v43
  ds_read_b64_tr_b16 v[50:51], v41
  ds_read_b64_tr_b8 v[52:53], v41 offset:2048
  ds_read_b64_tr_b4 v[54:55], v41 offset:1032
  ds_read_b64_tr_b16 v[56:57], v43
  s_waitcnt lgkmcnt(0)
  v_and_b32 v22, 0x3f, v0
  v_cmp_lt_u32 s[30:31], 20, v22
  s_and_saveexec_b64 s[32:33], s[30:31]
  ds_read_b64_tr_b16 v[58:59], v41 offset:512
  s_waitcnt lgkmcnt(0)
  s_mov_b64 exec, s[32:33]
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_lds_transposing_reads(opts):
    v, c, _ = _both(LDS_TR, opts, slice(50, 60))
    assert c["lds_read_bytes"] > 0
    assert v[0][0].any() and not np.array_equal(v[0], v[1])         # the waves read different bytes
    assert not v[3][6].any() and v[2][6].any()                      # wave 3's lanes past the LDS read 0
    assert not v[1][8][:21].any() and v[1][8][21:].any()            # partial EXEC: old (0) outside


# every wave of a workgroup writes the same LDS bytes (a race: the race detector stays off): the last writer
# wins, the same one both ways (without interleaving both ways run the waves in slot order)
LDS_OVERLAP = """
  v_and_b32 v20, 0x3f, v0
  v_lshlrev_b32 v21, 2, v20
  v_lshlrev_b32 v22, 10, v0
  v_add_u32 v22, s2, v22
  ds_write_b32 v21, v22
  ds_write2_b32 v21, v0, v22 offset0:64 offset1:128
  ds_write_b8 v20, v22 offset:1025
  s_waitcnt lgkmcnt(0)
  s_barrier
  ds_read_b32 v30, v21
  ds_read_u8 v31, v20 offset:1025
  ds_read2_b32 v[32:33], v21 offset0:64 offset1:128
  s_waitcnt lgkmcnt(0)
"""


@pytest.mark.parametrize("opts", [dict(), dict(sanitize={"waits", "hazards"})], ids=IDS[:2])
def test_overlapping_lds_writes_last_wave_wins(opts):
    v, _, _ = _both(LDS_OVERLAP, opts, slice(30, 34))
    last = (192 + np.arange(64)) * 1024 + 1                 # wave 3 of workgroup 1
    np.testing.assert_array_equal(v[4][0], last)
    np.testing.assert_array_equal(v[4][1], last & 0xff)
    np.testing.assert_array_equal(v[4][2], 192 + np.arange(64))
    np.testing.assert_array_equal(v[4][3], last)


# s_waitcnt's group form (sanitizer._waitcnt_handler): group loads' shares (sanitizer.GroupLoad) delivered in
# one store per load. Loads split across two waitcnts, two loads into one register (the newer wins, also when
# the group's first wave completed the older one alone: wave 0), a partial-EXEC load (closures: wave 2
# partly, wave 3 not at all) and a d16 load (a closure merging into a share's register) completing with the
# shares, wave 1 regrouped between its loads and its waits (waits of its own), LDS reads with a scalar load in
# flight (lgkmcnt(1) completes only the older LDS reads) and a load waited for across a barrier
WAITS = BUFFER + """
  v_readfirstlane_b32 s40, v0
  v_lshlrev_b32 v50, 2, v0
  ds_write_b32 v50, v2
  ds_write_b32 v50, v3 offset:1024
  ds_write_b32 v50, v4 offset:2048
  buffer_load_dword v30, v21, s[24:27], 0 offen
  buffer_load_dwordx2 v[32:33], v21, s[24:27], 0 offen offset:8
  buffer_load_dword v30, v21, s[24:27], 0 offen offset:4
  v_cmp_gt_u32 vcc, 0x96, v0
  s_and_saveexec_b64 s[34:35], vcc
  buffer_load_dword v32, v21, s[24:27], 0 offen offset:40
  s_mov_b64 exec, s[34:35]
  buffer_load_short_d16_hi v33, v21, s[24:27], 0 offen offset:2
  buffer_load_dword v34, v21, s[24:27], 0 offen offset:12
  s_cmp_eq_u32 s40, 0
  s_cbranch_scc1 .Lfirst
  s_cmp_eq_u32 s40, 64
  s_cbranch_scc1 .Lapart
  s_branch .Ljoin
.Lfirst:
  s_waitcnt vmcnt(5)
  s_branch .Ljoin
.Lapart:
  s_waitcnt vmcnt(4)
  s_nop 0
  s_waitcnt vmcnt(1)
  s_waitcnt vmcnt(0)
.Ljoin:
  s_barrier
  s_waitcnt vmcnt(2)
  v_mov_b32 v40, v30
  v_mov_b32 v41, v32
  s_waitcnt vmcnt(0)
  buffer_load_dwordx4 v[36:39], v21, s[24:27], 0 offen offset:20
  s_waitcnt lgkmcnt(0)
  s_barrier
  s_waitcnt vmcnt(0)
  ds_read_b32 v60, v50 offset:4
  s_load_dword s50, s[20:21], 0x10
  ds_read2_b32 v[62:63], v50 offset0:1 offset1:200
  ds_read_b32 v60, v50 offset:2048
  s_waitcnt lgkmcnt(1)
  v_mov_b32 v66, v62
  v_mov_b32 v67, v63
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v68, s50
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_group_waitcnt_delivers_each_waves_loads(opts, monkeypatch):
    stores = []
    orig = GroupLoad.store

    def spy(ld, ks=None):
        stores.append(ks is not None and len(ks) < len(ld.slots))
        orig(ld, ks)
    monkeypatch.setattr(GroupLoad, "store", spy)
    v, _, _ = _both(WAITS, opts, slice(30, 69))
    x = _inputs()
    for w in (0, 1, 2, 3):
        tid = 64 * w + np.arange(64)
        off = 12 * tid
        load = lambda o: np.where(off + o + 4 <= 3000, x[np.minimum(off + o, 4092) // 4], 0)  # noqa: E731
        np.testing.assert_array_equal(v[w][0], load(4))                 # v30: the newer load
        np.testing.assert_array_equal(v[w][10], load(4))                # v40 copied after its waits
        np.testing.assert_array_equal(v[w][2], np.where(tid < 150, load(40), load(8)))   # v32: EXEC < 150
        np.testing.assert_array_equal(v[w][11], v[w][2])
        hi = (np.where(off + 4 <= 3000, x[np.minimum(off, 4092) // 4], 0) >> 16) << 16
        np.testing.assert_array_equal(v[w][3], (load(12) & 0xFFFF) | hi)    # v33: d16 high half over it
        np.testing.assert_array_equal(v[w][30], x[128 + tid])           # v60: the newer LDS read
        np.testing.assert_array_equal(v[w][32], np.where(tid < 255, x[(tid + 1) % 256], x[64]))    # v62
        np.testing.assert_array_equal(v[w][36:38], v[w][32:34])
    assert v[0][38].any() and (v[5][38] == v[0][38]).all()              # s50 from the kernarg input
    if opts.get("sanitize") and not opts.get("interleave_seed"):
        assert any(stores)      # some load's shares were stored for part of its waves (0 and 1 wait apart)


def _same_report(body, grid, sanitize):
    """The report `body` stops with, the same text alone and in lockstep (no interleaving)."""
    msgs = []
    for lockstep in (False, True):
        with pytest.raises(engine.SanitizerReport) as err:
            run(body, inputs=_inputs(), block=256, grid=grid, options=dict(sanitize=sanitize, lockstep=lockstep))
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]
    return msgs[0]


def test_missing_wait_in_a_regrouped_wave_sees_stale_data(monkeypatch):
    """Wave 1 leaves its load group before the others' covering s_waitcnt and reads the register early:
    reported with the same text both ways, and the register still holds its old value (its share of the
    group load was not delivered with the other waves')."""
    body = BUFFER + """
      v_readfirstlane_b32 s40, v0
      v_mov_b32 v30, 7
      buffer_load_dword v30, v21, s[24:27], 0 offen
      s_cmp_eq_u32 s40, 64
      s_cbranch_scc1 .Learly
      s_waitcnt vmcnt(0)
      v_mov_b32 v31, v30
      s_branch .Ldone
    .Learly:
      s_nop 0
      v_mov_b32 v31, v30
      s_waitcnt vmcnt(0)
    .Ldone:
    """
    seen = []
    orig = WaveSan.missing_wait

    def spy(s, i):
        seen.append(s.wave.v[30].copy())
        return orig(s, i)
    monkeypatch.setattr(WaveSan, "missing_wait", spy)
    msg = _same_report(body, 2, {"waits", "hazards"})
    assert "missing-wait" in msg and "wave 1" in msg
    assert len(seen) == 2 and all((s == 7).all() for s in seen)


def test_group_load_over_an_outstanding_lds_read_names_its_wave():
    """A buffer load (the group form: one queue entry the waves share) into a register with an LDS read
    outstanding in wave 1 only: the clash is reported naming wave 1, with the same text, both ways."""
    body = BUFFER + """
      v_readfirstlane_b32 s40, v0
      v_lshlrev_b32 v50, 2, v0
      s_cmp_eq_u32 s40, 64
      s_cbranch_scc0 .Lskip
      ds_read_b32 v30, v50
    .Lskip:
      buffer_load_dword v30, v21, s[24:27], 0 offen
      s_waitcnt vmcnt(0) lgkmcnt(0)
    """
    msg = _same_report(body, 1, {"waits"})
    assert "missing-wait" in msg and "overwrites v30" in msg and "wave 1" in msg, msg


def test_waitcnt_keeps_a_register_pending_while_a_newer_load_into_it_is_outstanding():
    """Two loads into v30 outstanding (legal), vmcnt(1) completes the older: reading v30 is still a missing
    wait naming the newer load (WaveSan.pend keeps the bits another outstanding entry holds), both ways; and
    with a disjoint third load the read after vmcnt(1) is clean."""
    body = BUFFER + """
      buffer_load_dword v30, v21, s[24:27], 0 offen
      buffer_load_dword v30, v21, s[24:27], 0 offen offset:4
      s_waitcnt vmcnt(1)
      v_mov_b32 v31, v30
      s_waitcnt vmcnt(0)
    """
    msg = _same_report(body, 1, {"waits"})
    assert "missing-wait" in msg and "offset:4" in msg, msg
    clean = body.replace("v30, v21, s[24:27], 0 offen offset:4", "v32, v21, s[24:27], 0 offen offset:4")
    _both(clean, {"sanitize": {"waits"}}, slice(30, 33))


def test_lds_race_found_at_a_group_waitcnt_names_its_wave():
    """Every wave writes the same LDS bytes; the writes complete (and are recorded) at one s_waitcnt the
    group runs together: the report names the same wave (the second in slot order), with the same text,
    both ways (without interleaving: with it, the two ways run different legal orders)."""
    body = """
      v_and_b32 v20, 0x3f, v0
      v_lshlrev_b32 v21, 2, v20
      ds_write_b32 v21, v2
      s_waitcnt lgkmcnt(0)
    """
    msg = _same_report(body, 1, {"waits", "races"})
    assert "lds-race" in msg and "wave 1 pc" in msg


@pytest.mark.parametrize("write", ["ds_write_b128 v22, v[24:27]", "ds_write2_b64 v22, v[24:25], v[26:27] offset1:1",
                                   "ds_write2st64_b64 v22, v[24:25], v[26:27] offset1:1"])
def test_lds_race_on_a_later_dword_of_a_wide_access(write):
    """Lane l of wave w writes 16 bytes (or a b64 pair) from byte 16 l + 12 w: a wave's writes meet the last
    wave's only past their first dword. The group form's race records hold every dword of every lane, as
    alone (same report both ways)."""
    body = f"""
      v_and_b32 v20, 0x3f, v0
      v_lshlrev_b32 v22, 4, v20
      v_lshrrev_b32 v23, 6, v0
      v_mul_u32_u24 v23, 12, v23
      v_add_u32 v22, v22, v23
      {write}
      s_waitcnt lgkmcnt(0)
    """
    msg = _same_report(body, 1, {"waits", "races"})
    assert "lds-race" in msg and "written by wave 0" in msg, msg


def test_lds_race_reports_before_a_later_error_of_its_epoch():
    """After the racing write, the second wave goes on to a missing wait (a register read with its load
    outstanding) in the same epoch: the race, found when that error stops the launch, is still the report,
    both ways, naming the wave and the s_waitcnt at which its write completed."""
    body = BUFFER + """
      v_readfirstlane_b32 s40, v0
      v_and_b32 v20, 0x3f, v0
      v_lshlrev_b32 v22, 2, v20
      ds_write_b32 v22, v2
      s_waitcnt lgkmcnt(0)
      s_cmp_eq_u32 s40, 64
      s_cbranch_scc0 .Ldone
      buffer_load_dword v30, v21, s[24:27], 0 offen
      v_add_u32 v31, 1, v30
      s_waitcnt vmcnt(0)
    .Ldone:
    """
    msg = _same_report(body, 1, {"waits", "races"})
    assert "lds-race" in msg and "wave 1 pc" in msg and "(s_waitcnt lgkmcnt(0))" in msg, msg
    without_race = body.replace("ds_write_b32 v22, v2", "s_nop 0")
    assert "missing-wait" in _same_report(without_race, 1, {"waits", "races"})


def test_lds_race_in_the_last_epoch_is_reported_at_the_end():
    """No barrier follows the racing writes (after one that separates clean ones): the workgroup's end
    checks the epoch, both ways."""
    body = """
      v_and_b32 v20, 0x3f, v0
      v_lshlrev_b32 v21, 2, v20
      v_lshlrev_b32 v22, 2, v0
      ds_write_b32 v22, v2
      s_waitcnt lgkmcnt(0)
      s_barrier
      ds_write_b32 v21, v2
      s_waitcnt lgkmcnt(0)
    """
    msg = _same_report(body, 2, {"waits", "races"})
    assert "lds-race" in msg and "writes LDS byte" in msg and "written by wave 0" in msg, msg


# ds_bpermute_b32 (the group form) and ds_permute_b32 (wave by wave) of per-thread data, with an offset and
# under partial EXEC (wave by wave; a lane reading an inactive lane gets 0)
LANE_SHUFFLE = """
  s_mov_b32 s40, 0x9e3779b1
  v_mul_lo_u32 v24, s40, v0
  v_mul_u32_u24 v20, 7, v0
  v_lshlrev_b32 v20, 2, v20
  ds_bpermute_b32 v50, v20, v24
  ds_bpermute_b32 v51, v20, v24 offset:8
  ds_permute_b32 v52, v20, v24
  s_waitcnt lgkmcnt(0)
  v_and_b32 v22, 0x3f, v0
  v_cmp_lt_u32 s[30:31], 20, v22
  s_and_saveexec_b64 s[32:33], s[30:31]
  v_mov_b32 v53, 0
  ds_bpermute_b32 v53, v20, v24
  s_waitcnt lgkmcnt(0)
  s_mov_b64 exec, s[32:33]
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_lane_permutes(opts):
    v, _, _ = _both(LANE_SHUFFLE, opts, slice(50, 54))
    lanes = np.arange(64)
    for k in (0, 5):                                      # wave 1 of workgroup 0, wave 2 of workgroup 1
        t = 64 * (k % 4) + lanes
        data = (t * 0x9e3779b1 % (1 << 32)).astype(np.uint32)
        np.testing.assert_array_equal(v[k][0], data[(7 * t) & 63])
        np.testing.assert_array_equal(v[k][1], data[(7 * t + 2) & 63])
        src = (7 * t) & 63
        np.testing.assert_array_equal(v[k][3], np.where((lanes >= 21) & (src >= 21), data[src], 0))


# DPP forms (table rows with src0 seen through a lane permutation): whole EXEC, then an EXEC that differs by
# wave (thread ids below 100: wave 0 whole, wave 1 lanes 0-35, waves 2-3 none), so the source-lane check of
# the inactive lanes, bound_ctrl and row/bank masks run over waves whose masks differ
DPP = """
  s_mov_b32 s40, 0x9e3779b1
  v_mul_lo_u32 v24, s40, v0
  v_cvt_f32_u32 v25, v24
  v_mov_b32_dpp v50, v24 quad_perm:[3,2,1,0] row_mask:0xf bank_mask:0xf
  v_max_i32_dpp v51, v24, v24 row_shr:1 row_mask:0xf bank_mask:0xf
  v_add_u32_dpp v52, v24, v0 row_bcast:15 row_mask:0xa bank_mask:0xf
  s_movk_i32 s41, 0x64
  v_cmp_gt_u32 s[30:31], s41, v0
  s_and_saveexec_b64 s[32:33], s[30:31]
  v_mov_b32 v53, 0
  v_mov_b32 v54, 0
  v_mov_b32 v55, 0
  v_max_i32_dpp v53, v24, v24 row_shr:3 row_mask:0xf bank_mask:0xf
  v_max_i32_dpp v54, v24, v24 row_shl:2 row_mask:0xf bank_mask:0x5 bound_ctrl:1
  v_add_f32_dpp v55, v25, v25 row_ror:5 row_mask:0xf bank_mask:0xf bound_ctrl:1
  s_mov_b64 exec, s[32:33]
"""


@pytest.mark.parametrize("opts", SANITIZE, ids=IDS)
def test_dpp_forms_under_per_wave_exec(opts):
    v, _, _ = _both(DPP, opts, slice(50, 56))
    assert not np.array_equal(v[0][3], v[1][3]) and not v[2][3].any()       # the EXEC differ by wave
    dpp = [b for m, b in _batched(DPP).items() if m.endswith("_dpp")]
    assert len(dpp) == 4 and all(b is not None for b in dpp)                  # run batched (4 mnemonics)
