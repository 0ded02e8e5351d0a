"""Cross-lane reductions for a 64-lane gfx9 wave, built on DPP so no LDS and no `ds_swizzle` is involved.

gfx9 DPP moves a value between lanes as an operand modifier of the consuming VALU op (or one `v_mov_b32_dpp`):
quad permutes act inside each aligned group of 4 lanes, mirrors inside each 16-lane row, and the row
broadcasts (`row_bcast:15`, `row_bcast:31`) carry a row's last lane into the following row(s). A full-wave sum
is therefore 4 in-row steps, 2 broadcast steps and one `v_readlane_b32` of lane 63, which also makes the
result wave-uniform (an SGPR).
"""

from __future__ import annotations

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import rocdl

# DPP control words (gfx9 encoding).
QUAD_SWAP_1 = 0xB1  # quad_perm [1,0,3,2]: lane i reads lane i^1
QUAD_SWAP_2 = 0x4E  # quad_perm [2,3,0,1]: lane i reads lane i^2
ROW_MIRROR = 0x140  # lane i of a 16-lane row reads lane 15-i
ROW_HALF_MIRROR = 0x141  # lane i of an 8-lane half row reads lane 7-i
ROW_BCAST_15 = 0x142  # lane 15 of row r feeds every lane of row r+1
ROW_BCAST_31 = 0x143  # lane 31 feeds every lane of rows 2 and 3

WAVE = 64


def dpp(value, ctrl: int, *, row_mask: int = 0xF, bank_mask: int = 0xF, old=None):
    """`value` as seen through DPP control `ctrl`; disabled rows / invalid source lanes give `old` (default 0)."""
    ty = type(value)
    raw = fx.as_ir_value(value)
    old_raw = fx.as_ir_value(ty(0) if old is None else old)
    return ty(rocdl.update_dpp(raw.type, old_raw, raw, ctrl, row_mask, bank_mask, False))


def readlane(value, lane: int):
    """`v_readlane_b32`: lane `lane`'s value, as a wave-uniform scalar."""
    ty = type(value)
    raw = fx.as_ir_value(value)
    return ty(rocdl.readlane(raw.type, raw, fx.Int32(lane).ir_value()))


def row_sum(v):
    """Sum over each 16-lane row; every lane of the row gets its row's sum (f32)."""
    v = v + dpp(v, QUAD_SWAP_1)
    v = v + dpp(v, QUAD_SWAP_2)
    v = v + dpp(v, ROW_HALF_MIRROR)
    v = v + dpp(v, ROW_MIRROR)
    return v


def wave_sum(v):
    """Sum of an f32 over all 64 lanes, returned wave-uniform (lane 63's total via `v_readlane`)."""
    v = row_sum(v)
    v = v + dpp(v, ROW_BCAST_15, row_mask=0xA)  # rows 1, 3 += rows 0, 2
    v = v + dpp(v, ROW_BCAST_31, row_mask=0xC)  # rows 2, 3 += rows 0 + 1
    return readlane(v, WAVE - 1)


def quad_max_i32(v):
    """Max of a non-negative i32 over each aligned group of 4 lanes (every lane of the quad gets it)."""
    v = fx.max(v, dpp(v, QUAD_SWAP_1))
    v = fx.max(v, dpp(v, QUAD_SWAP_2))
    return v


def uniform_i32(v):
    """`v_readfirstlane_b32`: assert an i32 is equal in all lanes so the compiler keeps it in an SGPR."""
    return fx.Int32(rocdl.readfirstlane(ir.IntegerType.get_signless(32), fx.as_ir_value(v)))


def lane_and_wave(tid, waves_per_block: int):
    """(lane, wave) of thread `tid`; the wave index is made wave-uniform (SGPR) with `readfirstlane`."""
    lane = tid % WAVE
    if waves_per_block == 1:
        return lane, fx.Int32(0)
    return lane, uniform_i32(tid // WAVE)
