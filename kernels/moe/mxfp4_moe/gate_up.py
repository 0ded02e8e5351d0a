"""Launch 2 of 4: gate-up + bias + activation + MXFP8 -> inter (the intermediate, real rows only).

grid (max_tiles, IP/32): 16 sorted rows x 32 intermediate columns (gate 32 + up 32 weight rows) of one
expert. K is split over the workgroup's waves in contiguous runs of a multiple of 4 K-steps (so each
B-scale dword is read by one wave) and summed by wave 0 through LDS, in the fixed grouping of geometry.py
(chunks of `chunk` K-steps, `group` chunks left to right, then the groups left to right) in every tier."""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, range_constexpr

from amd_kernels.common import buffer, mfma, mxfp8, wave
from amd_kernels.moe.mxfp4_moe.common import (activation, dword, fp8x2, num_tiles, row16_max_i32, scale_pos,
                                              sub_resource, tile_prologue)
from amd_kernels.moe.mxfp4_moe.geometry import KSTEP, ROWS


def epilogue(geo, tot, e, tile, nblk, lane, rows_b, sp_rsrc, col_live, w13_bias, inter_q, inter_s):
    """tot[g][reg] = the 16 x 64 gate/up sums of (tile, nblk) in the MFMA C layout: + bias, activation,
    MXFP8 per row over the block's 32 columns -> inter (real rows only: the down launch never reads padding)."""
    biases, experts, ip, kg2, ks2 = geo.biases, geo.experts, geo.ip, geo.kg2, geo.ks2
    r, q = lane % 16, lane // 16
    bias = None
    if biases:
        bias_rsrc = buffer.tensor_resource(w13_bias, experts * 2 * ip * 4)
        bias = [dword(bias_rsrc, col_live[g % 2].select((e * (2 * ip) + nblk * 64 + g * 16 + r) * 4,
                                                        buffer.never_in_range())).bitcast(fx.Float32)
                for g in range_constexpr(4)]
    iq_rsrc = buffer.tensor_resource(inter_q, rows_b * ip)
    is_rsrc = buffer.tensor_resource(inter_s, rows_b * (kg2 * 16))
    for reg in range_constexpr(4):
        real = dword(sp_rsrc, (tile * ROWS + q * 4 + reg) * 4) >= 0
        v = [tot[g][reg] + bias[g] if biases else tot[g][reg] for g in range_constexpr(4)]
        a0 = activation(geo.activation, v[0], v[2])
        a1 = activation(geo.activation, v[1], v[3])
        amax = fx.max(a0.bitcast(fx.Int32) & 0x7FFFFFFF, a1.bitcast(fx.Int32) & 0x7FFFFFFF)
        byte, inv = mxfp8.scale_from_amax_bits(row16_max_i32(amax))
        pk = fp8x2(a0, a1, inv)
        row = tile * ROWS + q * 4 + reg
        q_off = real.select(row * ip + nblk * 32 + r, buffer.never_in_range())
        buffer.store_byte(pk, iq_rsrc, q_off)
        buffer.store_byte(pk >> 8, iq_rsrc, q_off + 16)
        pos = scale_pos(nblk // 4, nblk)
        buffer.store_byte(byte, is_rsrc, (real & (r == 0)).select(row * (kg2 * 16) + pos, buffer.never_in_range()))
        # Bytes of absent K-steps (KS2 .. 4 KG2 - 1) in the last scale dword: zero, written by the
        # workgroups of the first K-step of that dword (the down launch loads whole dwords).
        for ks_x in range_constexpr(ks2, 4 * kg2):
            pos_x = scale_pos(ks_x, nblk)
            first = real & (r == 0) & (nblk // 4 == 4 * (kg2 - 1))
            buffer.store_byte(fx.Int32(0), is_rsrc, first.select(row * (kg2 * 16) + pos_x,
                                                                 buffer.never_in_range()))


def chain(geo, ks0, a_rsrc, as_rsrc, a_row, as_row, b_rsrc, bs_rsrc, col_live, lane, q):
    """The 4 x 4 accumulators of `chunk` K-steps from ks0 (one MFMA chain from zero)."""
    ks1, kg1, hidden = geo.ks1, geo.kg1, geo.hidden
    accs = [mfma.zeros() for _ in range_constexpr(4)]
    for s4 in range_constexpr(geo.chunk // 4):
        j = ks0 // 4 + s4
        sa = dword(as_rsrc, as_row + j * 16)
        sbs = [dword(bs_rsrc, col_live[g % 2].select((g * kg1 + j) * 256 + lane * 4, buffer.never_in_range()))
               for g in range_constexpr(4)]
        for b in range_constexpr(4):
            ks = ks0 + s4 * 4 + b
            # K past h (the last K-step's tail): A's second half (K 64 + 16q ..) and B's lanes q with
            # 32q >= the tail's length carry zeros; they are not loaded.
            a_off = (ks < ks1).select(a_row + ks * KSTEP, buffer.never_in_range())
            a_lo = buffer.load_x4(a_rsrc, a_off)
            a_hi = buffer.load_x4(a_rsrc, (ks * KSTEP + 64 + q * 16 < hidden).select(
                a_off + 64, buffer.never_in_range()))
            a = a_lo.shuffle(a_hi, list(range(8)))
            k_live = ks * KSTEP + q * 32 < hidden
            for g in range_constexpr(4):
                b_off = (k_live & col_live[g % 2]).select((g * ks1 + ks) * 1024 + lane * 16,
                                                          buffer.never_in_range())
                bv = buffer.load_x4(b_rsrc, b_off)
                accs[g] = mfma.scale_fp8_fp4(a, bv, accs[g], sa, b, sbs[g], b)
    return accs


def wave_values(geo, first_ks, cpw, per_group, chain_at):
    """This wave's cpw chunks from K-step first_ks; with whole groups, each group summed (left to right)."""
    mine = []
    for i in range_constexpr(cpw):
        c = chain_at(first_ks + i * geo.chunk)
        if per_group and i % geo.group:
            prev = mine.pop()
            c = [prev[g] + c[g] for g in range_constexpr(4)]
        mine.append(c)
    return mine


def lds_store(values, first_slot, part, lane):
    for i in range_constexpr(len(values)):
        for g in range_constexpr(4):
            for reg in range_constexpr(4):
                fx.memref_store(values[i][g][reg], part, (((first_slot + i) * 4 + g) * 4 + reg) * 64 + lane)


def plus_slot(tot, slot, part, lane):
    for g in range_constexpr(4):
        for reg in range_constexpr(4):
            tot[g][reg] = tot[g][reg] + fx.memref_load(part, ((slot * 4 + g) * 4 + reg) * 64 + lane)
    return tot


def elements(v):
    return [[v[g][reg] for reg in range_constexpr(4)] for g in range_constexpr(4)]


def add(x, y):
    return [[x[g][reg] + y[g][reg] for reg in range_constexpr(4)] for g in range_constexpr(4)]


def wave0_total(geo, mine, slots, per_group, part, lane):
    """Wave 0: the gate-up sums in the fixed grouping, from its own values and the other waves' slots."""
    if per_group:  # a slot per group: wave 0's groups, then the others' in order
        tot = elements(mine[0])
        for i in range_constexpr(1, len(mine)):
            tot = add(tot, elements(mine[i]))
        for s in range_constexpr(len(mine), slots):
            tot = plus_slot(tot, s, part, lane)
        return tot
    tot = None  # a slot per chunk: each group summed left to right, then added to the total
    for g0 in range_constexpr(0, slots, geo.group):
        grp = None
        for c in range_constexpr(g0, g0 + geo.group):
            if c < len(mine):
                grp = elements(mine[c]) if grp is None else add(grp, elements(mine[c]))
            elif grp is None:
                grp = [[fx.memref_load(part, ((c * 4 + g) * 4 + reg) * 64 + lane) for reg in range_constexpr(4)]
                       for g in range_constexpr(4)]
            else:
                grp = plus_slot(grp, c, part, lane)
        tot = grp if tot is None else add(tot, grp)
    return tot


def make(geo, max_waves: int, kname: str):
    """-> (kernel, waves per workgroup) for a tier of at most max_waves waves."""
    ks1, kg1, hp, ng1, top_k = geo.ks1, geo.kg1, geo.hp, geo.ng1, geo.top_k
    ksw = geo.k_steps_per_wave(max_waves)
    waves = -(-ks1 // ksw)
    cpw = ksw // geo.chunk  # chunks per wave
    # Whole groups per wave: a slot per group; otherwise a slot per chunk (wave 0 forms the groups).
    per_group = cpw % geo.group == 0
    per_wave = cpw // geo.group if per_group else cpw  # slots a wave fills
    slots = waves * per_wave
    # The last wave's scale dwords (A and B) must stay inside the row's KG1 dwords.
    assert (waves - 1) * ksw // 4 + ksw // 4 <= kg1, (ks1, ksw)

    @fx.struct
    class S1Lds:
        part: fx.Array[fx.Float32, max(slots, 2) * 4 * 4 * 64, 16]

    @flyc.kernel(name=kname, known_block_size=[waves * 64, 1, 1])
    def k_stage1(xq: fx.Tensor, xs: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                 meta: fx.Tensor, w13: fx.Tensor, w13_scale: fx.Tensor, w13_bias: fx.Tensor,
                 shard: fx.Tensor, inter_q: fx.Tensor, inter_s: fx.Tensor, m: fx.Int32):
        lds = fx.SharedAllocator().allocate(S1Lds).peek()
        part = lds.part.view(fx.make_layout(max(slots, 2) * 4 * 4 * 64, 1))
        lane, wv = wave.lane_and_wave(fx.thread_idx.x, waves)
        r, q = lane % 16, lane // 16
        tile = fx.block_idx.x
        nblk = fx.block_idx.y
        if tile < num_tiles(meta):
            t = tile_prologue(geo, sorted_pairs, tile_expert, shard, tile, m)
            # Lane r's weight row in groups g = 0, 2 (gate, up) is column 32 nblk + r; in g = 1, 3, + 16.
            col_live = [(nblk * 32 + 16 * h + r >= t.live_lo) & (nblk * 32 + 16 * h + r < t.live_hi)
                        for h in (0, 1)]
            pair = dword(t.sp_rsrc, (tile * ROWS + r) * 4)
            token = pair // top_k
            a_rsrc = buffer.tensor_resource(xq, fx.Int64(m) * hp)
            as_rsrc = buffer.tensor_resource(xs, fx.Int64(m) * (kg1 * 16))
            a_row = (pair >= 0).select(token * hp + q * 16, buffer.never_in_range())
            as_row = (pair >= 0).select(token * (kg1 * 16) + q * 4, buffer.never_in_range())
            g0 = t.e * ng1 + nblk * 4
            b_rsrc = sub_resource(w13, fx.Int64(g0) * (ks1 * 1024), 4 * ks1 * 1024)
            bs_rsrc = sub_resource(w13_scale, fx.Int64(g0) * (kg1 * 256), 4 * kg1 * 256)
            mine = wave_values(geo, wv * ksw, cpw, per_group,
                               lambda ks0: chain(geo, ks0, a_rsrc, as_rsrc, a_row, as_row, b_rsrc, bs_rsrc,
                                                 col_live, lane, q))
            if waves > 1:
                lds_store(mine, wv * per_wave, part, lane)
                gpu.barrier()
            if wv == 0:
                tot = wave0_total(geo, mine, slots, per_group, part, lane)
                epilogue(geo, tot, t.e, tile, nblk, lane, t.rows_b, t.sp_rsrc, col_live, w13_bias, inter_q, inter_s)

    return k_stage1, waves
