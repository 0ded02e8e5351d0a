"""Each sanitizer detector catches a small deliberately broken kernel, and passes its corrected twin.

The broken FlyDSL kernels use inline assembly where the compiler would otherwise repair the bug (LLVM
inserts every s_waitcnt it can see a need for); the LDS race, out-of-bounds, poison and order-dependent
kernels are plain FlyDSL bugs. The MFMA hazard uses an assembled program (asmkernel).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness import emulator

emulator.install()

import flydsl.compiler as flyc  # noqa: E402  (after install: FlyDSL's runtime must bind to the shim)
import flydsl.expr as fx  # noqa: E402
from flydsl._mlir import ir  # noqa: E402
from flydsl._mlir.dialects import llvm as _llvm  # noqa: E402
from flydsl.expr import rocdl  # noqa: E402

from harness.emulator.tests import asmkernel  # noqa: E402

SAN = dict(sanitize=True)


def _i32(v):
    return fx.Int32(v).ir_value() if isinstance(v, int) else fx.as_ir_value(v)


def _rsrc(t, nbytes=None):
    """Raw buffer descriptor over tensor `t` (num_records `nbytes`; None = 4 GiB)."""
    n = fx.Int64(nbytes) if nbytes is not None else None
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=n))


def _asm(text, constraints, operands):
    return _llvm.inline_asm(ir.IntegerType.get_signless(32), [fx.as_ir_value(o) if not isinstance(o, ir.Value)
                                                               else o for o in operands],
                            text, constraints, has_side_effects=True)


def _store(value, rsrc, byte_off):
    rocdl.raw_ptr_buffer_store(value if isinstance(value, ir.Value) else _i32(value), rsrc, _i32(byte_off), _i32(0))


def _load(rsrc, byte_off):
    return rocdl.raw_ptr_buffer_load(ir.IntegerType.get_signless(32), rsrc, _i32(byte_off), _i32(0))


# ---- 1. missing s_waitcnt ---------------------------------------------------------------------------------

def _load_then_use(wait: bool):
    text = "buffer_load_dword $0, $1, $2, 0 offen\n" + ("s_waitcnt vmcnt(0)\n" if wait else "") + \
        "v_add_u32 $0, 1, $0"

    @flyc.kernel
    def k_load_use(src: fx.Tensor, dst: fx.Tensor):
        off = fx.thread_idx.x * 4
        v = _asm(text, "=&v,v,s", [_i32(off), _rsrc(src, 256)])
        _store(v, _rsrc(dst, 256), off)

    @flyc.jit
    def run(src: fx.Tensor, dst: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        k_load_use(src, dst).launch(grid=(1, 1, 1), block=(64, 1, 1), stream=stream)
    return run


def test_missing_wait_is_reported():
    src, dst = torch.arange(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    with emulator.options(**SAN), pytest.raises(emulator.SanitizerReport) as err:
        _load_then_use(wait=False)(src, dst)
    assert err.value.kind == "missing-wait"
    assert "k_load_use" in str(err.value) and "wave 0" in str(err.value) and "pc 0x" in str(err.value)
    assert "buffer_load_dword" in str(err.value)


def test_waited_load_passes_and_without_sanitizer_the_bug_is_invisible():
    src = torch.arange(64, dtype=torch.int32)
    dst = torch.zeros(64, dtype=torch.int32)
    with emulator.options(**SAN):
        _load_then_use(wait=True)(src, dst)
    assert torch.equal(dst, src + 1)
    dst.zero_()
    _load_then_use(wait=False)(src, dst)          # functional emulator: loads complete at once
    assert torch.equal(dst, src + 1)


def test_lgkmcnt_smem_out_of_order_rule():
    """lgkmcnt(1) with two scalar loads outstanding guarantees neither (SMEM returns out of order)."""
    body = """
  s_load_dword s30, s[20:21], 0x0
  s_load_dword s31, s[20:21], 0x4
  s_waitcnt lgkmcnt(1)
  s_mov_b32 s32, s30
"""
    with pytest.raises(emulator.LaunchError) as err:
        asmkernel.run(body, options=SAN)
    assert "missing-wait" in str(err.value) and "s30" in str(err.value)
    # LDS reads complete in order: lgkmcnt(1) covers the older of two
    body = """
  v_mov_b32 v10, 0
  ds_read_b32 v11, v10
  ds_read_b32 v12, v10 offset:4
  s_waitcnt lgkmcnt(1)
  v_mov_b32 v13, v11
  s_waitcnt lgkmcnt(0)
"""
    asmkernel.run(body, options=SAN)


# ---- 2. memory checking ---------------------------------------------------------------------------------

@flyc.kernel
def k_oob_store(dst: fx.Tensor):
    # descriptor over 4 GiB from dst: the hardware bound does not stop the store 4 KiB past a 256-byte tensor
    _store(7, _rsrc(dst), fx.thread_idx.x * 4 + 4096)


@flyc.jit
def oob_store(dst: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    k_oob_store(dst).launch(grid=(1, 1, 1), block=(64, 1, 1), stream=stream)


def test_out_of_bounds_store_is_reported():
    dst = torch.zeros(64, dtype=torch.int32)
    with emulator.options(**SAN), emulator.guard([dst]), pytest.raises(emulator.SanitizerReport) as err:
        oob_store(dst)
    e = err.value
    assert e.kind == "out-of-bounds" and "k_oob_store" in str(e) and "lane 0" in str(e)
    assert f"{dst.data_ptr() + 4096:#x}" in str(e)


@flyc.kernel
def k_copy(src: fx.Tensor, dst: fx.Tensor):
    off = fx.thread_idx.x * 4
    _store(_load(_rsrc(src, 256), off), _rsrc(dst, 256), off)


@flyc.jit
def copy(src: fx.Tensor, dst: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    k_copy(src, dst).launch(grid=(1, 1, 1), block=(64, 1, 1), stream=stream)


def _entry_with_workspace(dst, init: bool):
    ws = torch.empty(64, dtype=torch.int32)       # a fresh workspace: poisoned
    if init:
        ws.fill_(3)
    copy(ws, dst)
    return dst


def test_read_of_never_written_workspace_is_reported():
    dst = torch.zeros(64, dtype=torch.int32)
    with emulator.options(**SAN), emulator.guard([dst]), pytest.raises(emulator.SanitizerReport) as err:
        _entry_with_workspace(dst, init=False)
    assert err.value.kind == "uninitialized" and "k_copy" in str(err.value) and "aten::empty" in str(err.value)
    with emulator.options(**SAN), emulator.guard([dst]):
        _entry_with_workspace(dst, init=True)
    assert (dst == 3).all()


def test_unknown_input_is_reported_and_stores_are_recorded():
    src, dst = torch.arange(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    with emulator.options(**SAN), emulator.guard([dst]), pytest.raises(emulator.SanitizerReport) as err:
        copy(src, dst)                            # src was not handed to the guard
    assert err.value.kind == "out-of-bounds"
    with emulator.options(**SAN), emulator.guard([src, dst]), emulator.launches() as recs:
        copy(src, dst)
    assert recs[0].stored.tolist() == [[dst.data_ptr(), dst.data_ptr() + 256]]


# ---- 3. LDS races -----------------------------------------------------------------------------------------

def _lds_exchange(barrier: bool):
    """Each lane writes its id to LDS, then reads the slot of the lane 64 away (the other wave)."""
    text = ("ds_write_b32 $1, $2\ns_waitcnt lgkmcnt(0)\n" + ("s_barrier\n" if barrier else "") +
            "v_xor_b32 $0, 0x100, $1\nds_read_b32 $0, $0\ns_waitcnt lgkmcnt(0)")

    @flyc.kernel
    def k_lds_exchange(dst: fx.Tensor):
        tid = fx.thread_idx.x
        v = _asm(text, "=&v,v,v", [_i32(tid * 4), _i32(tid)])
        _store(v, _rsrc(dst, 512), tid * 4)

    @flyc.jit
    def run(dst: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        k_lds_exchange(dst).launch(grid=(1, 1, 1), block=(128, 1, 1), smem=512, stream=stream)
    return run


def test_lds_race_is_reported():
    dst = torch.zeros(128, dtype=torch.int32)
    with emulator.options(**SAN), pytest.raises(emulator.SanitizerReport) as err:
        _lds_exchange(barrier=False)(dst)
    assert err.value.kind == "lds-race" and "k_lds_exchange" in str(err.value)
    assert "no s_barrier" in str(err.value)


def test_lds_exchange_with_barrier_passes_under_any_interleaving():
    for seed in range(4):
        dst = torch.zeros(128, dtype=torch.int32)
        with emulator.options(**SAN, interleave_seed=seed):
            _lds_exchange(barrier=True)(dst)
        assert torch.equal(dst, torch.arange(128, dtype=torch.int32) ^ 64)


# ---- 4. order dependence --------------------------------------------------------------------------------

@flyc.kernel
def k_last_writer(dst: fx.Tensor):
    # every workgroup and wave writes its ids to the same words: the last one wins
    tid = fx.thread_idx.x
    _store(fx.block_idx.x * 16 + tid // 64, _rsrc(dst, 256), (tid % 64) * 4)


@flyc.jit
def last_writer(dst: fx.Tensor, grid: fx.Constexpr[int], stream: fx.Stream = fx.Stream(None)):
    k_last_writer(dst).launch(grid=(grid, 1, 1), block=(128, 1, 1), stream=stream)


def test_order_dependent_result_fails_the_harness_determinism_check():
    from harness import checks

    def entry(dst, grid):
        last_writer(dst, grid)
        return dst

    for grid in (4, 1):                   # across workgroups, and between the two waves of one workgroup
        first, _ = checks._run(entry, {"dst": torch.zeros(64, dtype=torch.int32), "grid": grid},
                               order_seed=None, sample={})
        seeds = [checks.seed_of("order", s) for s in range(4)]
        others = [checks._run(entry, {"dst": torch.zeros(64, dtype=torch.int32), "grid": grid},
                              order_seed=s, sample={})[0] for s in seeds]
        assert any(not torch.equal(first[0], o[0]) for o in others), grid


# ---- MFMA result read too early ----------------------------------------------------------------------------

MFMA = "v_mfma_f32_16x16x32_bf16 v[20:23], v[2:5], v[2:5], 0\n"


def test_mfma_result_read_too_early_is_reported():
    with pytest.raises(emulator.LaunchError) as err:
        asmkernel.run(MFMA + "  s_nop 3\n  v_mov_b32 v30, v21\n", options=SAN)
    assert "mfma-hazard" in str(err.value) and "v21" in str(err.value)
    # 8 passes + 3 = 11 wait states: s_nop 7 + s_nop 2 = 11
    asmkernel.run(MFMA + "  s_nop 7\n  s_nop 2\n  v_mov_b32 v30, v21\n", options=SAN)
    # an MFMA accumulating into the identical SrcC needs none
    asmkernel.run(MFMA + "  v_mfma_f32_16x16x32_bf16 v[20:23], v[2:5], v[2:5], v[20:23]\n  s_nop 7\n  s_nop 3\n",
                  options=SAN)


def test_mfma_hazard_seen_past_instructions_that_skip_the_check():
    """Instructions that touch none of the pending MFMA results skip the hazard check (WaveSan.hz_dst) but
    still count their wait states: the read after them is judged on the elapsed states as before."""
    other = "  v_mov_b32 v31, v2\n  s_nop 3\n  v_add_u32 v32, v3, v4\n"      # 1 + 4 + 1 = 6 states
    with pytest.raises(emulator.LaunchError) as err:
        asmkernel.run(MFMA + other + "  v_mov_b32 v30, v21\n", options=SAN)
    assert "mfma-hazard" in str(err.value) and "6 wait states" in str(err.value)
    asmkernel.run(MFMA + other + "  s_nop 4\n  v_mov_b32 v30, v21\n", options=SAN)         # 6 + 5 = 11
    # 40 MFMAs into other registers, none read (the list drops its expired entries past 32), then one
    # read too early of the last
    chain = "".join("  v_mfma_f32_16x16x32_bf16 v[40:43], v[2:5], v[2:5], 0\n" for _ in range(40))
    with pytest.raises(emulator.LaunchError) as err:
        asmkernel.run(MFMA + chain + "  v_mov_b32 v30, v41\n", options=SAN)
    assert "mfma-hazard" in str(err.value) and "v41" in str(err.value)


# ---- stored intervals: what `workgroups = "tiles"` sampling compares ----------------------------------------

def test_stored_intervals_give_exactly_the_sampled_tiles():
    from harness import checks
    from harness.emulator.tests.test_flydsl_e2e import _inputs, _vadd

    A, B, C = _inputs(64, 256)
    with emulator.launches() as recs, emulator.options(workgroup_sample=3, sample_seed=5, **SAN), \
            emulator.guard([A, B, C]):
        _vadd(A, B, C)
    (rec,) = recs
    done = torch.zeros_like(C, dtype=torch.bool)
    for x, y, _ in rec.workgroups_executed:
        done[8 * x: 8 * x + 8, 64 * y: 64 * y + 64] = True
    assert torch.equal(checks.stored_mask(recs, C), done)
    assert torch.equal(C[done], (A + B)[done])


# ---- readlane of a lane the last write skipped -------------------------------------------------------------

LANE0 = "  v_cmp_eq_u32 vcc, 0, v0\n  s_and_saveexec_b64 s[30:31], vcc\n"    # lane 0 only, as `if lane == 0:`
DONE = "  s_or_b64 exec, exec, s[30:31]\n"


def test_readlane_of_a_lane_the_last_write_skipped_is_reported():
    """The shape of stop 44's quant_sort bug: the scan's last add sunk into the lane-0 branch, then lane 63
    read: it holds the value from before the add."""
    with pytest.raises(emulator.LaunchError) as err:
        asmkernel.run(LANE0 + "  v_add_u32 v6, v2, v3\n  v_readlane_b32 s40, v6, 63\n" + DONE, options=SAN)
    assert "inactive-lane" in str(err.value) and "lane 63 of v6" in str(err.value)
    assert "v_add_u32_e32 v6, v2, v3" in str(err.value) and "0x0000000000000001" in str(err.value)
    # the add before the branch (all lanes written), or a read of the active lane: no report
    asmkernel.run("  v_add_u32 v6, v2, v3\n" + LANE0 + "  v_readlane_b32 s40, v6, 63\n" + DONE, options=SAN)
    asmkernel.run(LANE0 + "  v_add_u32 v6, v2, v3\n  v_readlane_b32 s40, v6, 0\n" + DONE, options=SAN)
    # the lane number from an SGPR, and the write a load under the narrowed EXEC
    with pytest.raises(emulator.LaunchError) as err:
        asmkernel.run(LANE0 + "  global_load_dword v6, v1, s[20:21]\n  s_waitcnt vmcnt(0)\n  s_mov_b32 s41, 5\n"
                      "  v_readlane_b32 s40, v6, s41\n" + DONE, options=SAN)
    assert "lane 5 of v6" in str(err.value)
    # a branch target between the write and the read: another path may reach it, no claim is made (the
    # branch falls through to its own target, so only the target ends the straight-line path)
    asmkernel.run(LANE0 + "  v_add_u32 v6, v2, v3\n  s_cmp_eq_u32 s0, s0\n  s_cbranch_scc0 BB\nBB:\n"
                  "  v_readlane_b32 s40, v6, 63\n" + DONE, options=SAN)
    # a conditional branch that is not taken keeps the path straight: reported
    with pytest.raises(emulator.LaunchError) as err:
        asmkernel.run(LANE0 + "  v_add_u32 v6, v2, v3\n  s_cmp_eq_u32 s0, s0\n  s_cbranch_scc0 BB\n"
                      "  v_readlane_b32 s40, v6, 63\nBB:\n" + DONE, options=SAN)
    assert "lane 63 of v6" in str(err.value)
