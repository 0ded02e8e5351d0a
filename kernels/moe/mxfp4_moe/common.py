"""Device helpers shared by the MoE stages: loads, lane tricks, the MXFP8 conversion of the gate-up output,
the activations, the A-scale byte position, and the tile prologue of the two tile launches."""

from collections import namedtuple

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import math as mmath
from flydsl.expr import rocdl
from flydsl.expr.typing import T

from amd_kernels.common import buffer, mxfp8, wave
from amd_kernels.moe.mxfp4_moe.geometry import ROWS

LOG2E = 1.4426950408889634
ALPHA = 1.702
LIMIT = 7.0


def dword(rsrc, off):
    return fx.Int32(rocdl.raw_ptr_buffer_load(T.i32, rsrc, buffer._ir(off), buffer._ir(0)))


def sub_resource(t, elem_offset, nbytes):
    ptr = fx.add_offset(fx.get_iter(t), fx.Int64(elem_offset))
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(ptr, num_records_bytes=fx.Int64(nbytes)))


def bf16_bits(v):
    """fp32 -> bf16 (RNE) as an i16, for a 2-byte store."""
    return fx.Float32(v).to(fx.BFloat16).bitcast(fx.Int16)


def f32(v):
    return fx.as_ir_value(fx.Float32(v))


def exp2(v):
    return fx.Float32(rocdl.exp2(T.f32, f32(v)))


def row16_max_i32(v):
    for ctrl in (wave.QUAD_SWAP_1, wave.QUAD_SWAP_2, wave.ROW_HALF_MIRROR, wave.ROW_MIRROR):
        v = fx.max(v, wave.dpp(v, ctrl))
    return v


def wave_inclusive_scan(v):
    for n in (1, 2, 4, 8):
        v = v + wave.dpp(v, 0x110 + n)  # row_shr:n, lanes without a source add 0
    v = v + wave.dpp(v, wave.ROW_BCAST_15, row_mask=0xA)
    v = v + wave.dpp(v, wave.ROW_BCAST_31, row_mask=0xC)
    return v


def ballot(pred):
    return fx.Int64(rocdl.ballot(T.i64, fx.as_ir_value(pred)))


def popc64(m):
    return fx.Int64(mmath.ctpop(fx.as_ir_value(m))).to(fx.Int32)


def mbcnt(m):
    lo = fx.Int32(m.to(fx.Int32))
    hi = fx.Int32((m >> 32).to(fx.Int32))
    i32 = ir.IntegerType.get_signless(32)
    c = rocdl.mbcnt_lo(i32, fx.as_ir_value(lo), fx.as_ir_value(fx.Int32(0)))
    return fx.Int32(rocdl.mbcnt_hi(i32, fx.as_ir_value(hi), c))


def is_nan(v):
    return (fx.Float32(v).bitcast(fx.Int32) & 0x7FFFFFFF) > 0x7F800000


def fp8x2(a, b, inv_scale):
    """Two fp32 -> two E4M3 bytes (clamped to +-448 first, RNE) in the low 16 bits of an i32; NaN stays NaN
    (the clamp would turn it into a finite value)."""
    t = ir.F32Type.get()
    lo, hi = f32(-mxfp8.E4M3_MAX), f32(mxfp8.E4M3_MAX)
    sa, sb = fx.Float32(a * inv_scale), fx.Float32(b * inv_scale)
    ca = is_nan(sa).select(sa, fx.Float32(rocdl.fmed3(t, f32(sa), lo, hi)))
    cb = is_nan(sb).select(sb, fx.Float32(rocdl.fmed3(t, f32(sb), lo, hi)))
    return fx.Int32(rocdl.cvt_pk_fp8_f32(ir.IntegerType.get_signless(32), f32(ca), f32(cb), fx.Int32(0), False))


def activation(kind, gate, up):
    if kind == "gptoss":
        # Clamps that keep NaN (as torch.clamp does; a min/max instruction would drop it): x > 7 is false for NaN.
        g = (gate > LIMIT).select(fx.Float32(LIMIT), gate)
        u = (up > LIMIT).select(fx.Float32(LIMIT), (up < -LIMIT).select(fx.Float32(-LIMIT), up))
        sig = 1.0 / (1.0 + exp2(g * (-ALPHA * LOG2E)))
        return (u + 1.0) * g * sig
    return gate / (1.0 + exp2(gate * (-LOG2E))) * up


def scale_pos(ks, kblock):
    """Byte of the A-scale layout's row for K-step ks's K-block `kblock` (only kblock % 4, the block within
    the K-step, is read): dword (ks // 4) * 4 + kblock % 4 holds 4 K-steps, byte ks % 4 of it."""
    return ((ks // 4) * 4 + kblock % 4) * 4 + ks % 4


def rows_bound(m, top_k, experts):
    """Sorted rows the host allocates for m tokens (max_tiles * ROWS), as an i64 device value."""
    pairs = m * top_k
    return fx.Int64(pairs // ROWS + fx.min(pairs, fx.Int32(experts))) * ROWS


def num_tiles(meta):
    """The sort's tile count (tiles past it exit at once: the grid is the host's bound)."""
    return wave.uniform_i32(dword(buffer.tensor_resource(meta, 16), 0))


Tile = namedtuple("Tile", "rows_b sp_rsrc e sh_rsrc live_lo live_hi")


def tile_prologue(geo, sorted_pairs, tile_expert, shard, tile, m):
    """A tile launch's view of the sort and the shard: the rows bound, the sorted_pairs descriptor, the
    tile's expert, and the live prepared intermediate columns [live_lo, live_hi) (prepare.py)."""
    rows_b = rows_bound(m, geo.top_k, geo.experts)
    sp_rsrc = buffer.tensor_resource(sorted_pairs, rows_b * 4)
    e = wave.uniform_i32(dword(buffer.tensor_resource(tile_expert, rows_b // ROWS * 4), tile * 4))
    sh_rsrc = buffer.tensor_resource(shard, 16)
    return Tile(rows_b, sp_rsrc, e, sh_rsrc, dword(sh_rsrc, 0), dword(sh_rsrc, 4))
