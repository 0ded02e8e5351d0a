"""The prefill tiers' gate-up and down launches: super-tiles of up to `waves` 16-row tiles of one expert
(WAVES: 4 in the tier from the package's prefill_from tokens, 8 in the one from its prefill128_from), whose
weight tile is loaded once per workgroup and shared through LDS.

Same sort as the other tiers (16-row tiles, each expert padded to 16 rows, experts in order); the tier's
own sort launch (quant_sort.make(geo, waves)) also writes the super-tile table: up to `waves` consecutive
tiles of one expert each, their count in meta[1]. The grid is (max_supers, column blocks): workgroup s runs
super-tile s (`super_tile` below; workgroups past the count exit after two loads, and the bound is near the
count). Its waves each own one 16-row tile (wave w: the first tile + w, idle when the super-tile has fewer
tiles), so each weight byte is loaded once per super-tile instead of once per 16 rows.

Per 128-K step the workgroup stages the weight rows of its column block (NG groups of 16 rows, 1 KiB each)
and, every 4 K-steps, their scale dwords into LDS: wave w loads groups w, w + waves, ... (same offsets and
the same out-of-range masks as the 16-row tiers), one barrier, every active wave reads them back and runs
its MFMAs. Two LDS buffers alternate (_bufs), so the one barrier after a stage's stores also tells that
every wave has read the buffer those stores overwrite. The 128-row tier's down stages two K-steps per
barrier, and its gate-up too where registers allow (down_steps, gate_up_steps).

Batch invariance: a row's MFMAs are exactly those of the 16-row tiers (same 16x16x128 form, same A and B
values, same scale bytes and op_sel, same K-step order inside a chain) and the partial sums are added in the
same fixed grouping (geometry.py: chains of `chunk` K-steps from zero, `group` chains left to right, then
the groups left to right, over the 4-wave tier's K-step count, zero K-steps past HP included), so a row's
bits are the same whichever tier its batch picks. The epilogues are the 16-row tiers' own (gate_up.epilogue
per 32-column block; down's bias, routing weight and y store)."""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

from types import SimpleNamespace

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from amd_kernels.common import buffer, mfma, wave
from amd_kernels.moe.mxfp4_moe import gate_up
from amd_kernels.moe.mxfp4_moe.common import bf16_bits, dword, sub_resource, tile_prologue
from amd_kernels.moe.mxfp4_moe.geometry import KSTEP, ROWS, prefill_suffix, super_pack

WAVES = (4, 8)  # the tiers' 16-row tiles per super-tile = waves per workgroup (64 and 128 rows)


def down_steps(waves: int) -> int:
    """K-steps down stages per barrier: 2 in the 128-row tier (half its barriers, each holding 8 waves: the cost
    model's latency term is mostly barriers there), 1 in the 64-row one (byte-identical to before the 128-row
    tier)."""
    return 2 if waves == 8 else 1


def gate_up_steps(geo, waves: int) -> int:
    """K-steps gate-up stages per barrier: as down_steps where a wave holds two sets of accumulators (group 1:
    the chain and the total); with a third (group > 1, the group sum) a second step's loads spill (TP8's
    gate-up: 256 VGPRs and scratch), so 1."""
    return down_steps(waves) if geo.group == 1 else 1


def slots(ng: int, waves: int) -> int:
    """LDS group slots of a step: wave w stages groups w, w + waves, ..., so the last round may run past the
    ng groups; its extra slots take out-of-range loads (zeros, no memory traffic) and are never read."""
    return -(-ng // waves) * waves


def gu_blocks(geo) -> int:
    """Gate-up: 32-column blocks per workgroup (4 weight groups of 16 rows each). A wave holds 2 or 3 sets of
    accumulators (chain, group sum if group > 1, total): 4 blocks fit in registers with 2 sets or the shorter
    K, 3 blocks otherwise (4 would spill)."""
    want = 4 if geo.group <= 2 else 3
    return next(q for q in range(want, 0, -1) if geo.nb1 % q == 0)


def down_blocks(geo) -> int:
    """Down: 64-column blocks per workgroup (4 groups each): the largest of 5, 4, ... dividing h / 64."""
    return next(q for q in (5, 4, 3, 2, 1) if geo.nb2 % q == 0)


def max_supers(pairs: int, experts: int, waves: int) -> int:
    """Upper bound of the super-tiles for `pairs` pairs: expert e has ceil(n_e / (16 waves)) of them, at most
    n_e // (16 waves) + 1 when n_e > 0. The grid of the tier's tile launches (only they can have work)."""
    return pairs // (ROWS * waves) + min(experts, pairs)


def super_tile(geo, meta, m, waves):
    """(super-tiles, first tile, tiles) of this workgroup's super-tile, from the table the tier's sort wrote
    (quant_sort.py: meta[1] the count, meta[4 + s] = first tile * super_pack(waves) + tiles). The two loads are
    independent."""
    pairs = m * geo.top_k
    bound = pairs // (ROWS * waves) + fx.min(pairs, fx.Int32(geo.experts))
    rsrc = buffer.tensor_resource(meta, fx.Int64(bound + 4) * 4)
    n = wave.uniform_i32(dword(rsrc, 4))
    packed = wave.uniform_i32(dword(rsrc, (fx.block_idx.x + 4) * 4))
    pack = super_pack(waves)
    return n, packed >> (pack.bit_length() - 1), packed & (pack - 1)


def _stage(ops, base, vals, wv, lane, per, waves):
    """Write this wave's staged vectors (groups wv, wv + waves, ...) to LDS at `base` (dwords, `per` each)."""
    at = ops + fx.Int64((wv * 64 + lane) * per)  # the lane's pointer; the constant part folds into the offset
    for i in range_constexpr(len(vals)):
        fx.ptr_store(vals[i], at + fx.Int64(base + i * waves * 64 * per))


def _read(ops, base, g, lane, per, ty):
    return fx.ptr_load((ops + fx.Int64(lane * per)) + fx.Int64(base + g * 64 * per), result_type=ty)


def _load(ty, rsrc, voff, soff: int):
    """Buffer load at voff + soff, the constant part in the SGPR offset (per-step VGPR offsets would all be
    computed up front and held: hundreds of VGPRs over an unrolled K loop). voff = never_in_range() stays out
    of range (offsets are unsigned and every descriptor here is far below 2 GiB)."""
    return rocdl.raw_ptr_buffer_load(ty, rsrc, buffer._ir(voff), buffer._ir(soff))


def _gate_up_loads(geo, ks, q, b_rsrc, a_rsrc, a_row, b_base, compute: bool):
    """(staged weight vectors, A operand) of gate-up K-step ks, with the 16-row tiers' masks; past HP
    (ks >= KS1) no staging and a zero A, as the 16-row tiers load there."""
    hidden = geo.hidden
    if ks >= geo.ks1:
        return None, fx.Vector.filled(8, 0, fx.Int32)
    b_off = b_base
    if ks * KSTEP + 3 * 32 >= hidden:  # the K tail: lanes q with 32 q >= its length carry zeros
        b_off = [(ks * KSTEP + q * 32 < hidden).select(o, buffer.never_in_range()) for o in b_base]
    b_in = [fx.Vector(_load(T.i32x4, b_rsrc, o, ks * 1024)) for o in b_off]
    if not compute:
        return b_in, None
    a_lo = fx.Vector(_load(T.i32x4, a_rsrc, a_row, ks * KSTEP))
    a_hi_row = a_row
    if ks * KSTEP + 64 + 3 * 16 >= hidden:
        a_hi_row = (ks * KSTEP + 64 + q * 16 < hidden).select(a_row, buffer.never_in_range())
    a_hi = fx.Vector(_load(T.i32x4, a_rsrc, a_hi_row, ks * KSTEP + 64))
    return b_in, a_lo.shuffle(a_hi, list(range(8)))


def _bufs(b_dw, s_dw, ks, steps):
    """LDS dword offsets of K-step ks's weight rows and scale dwords, `steps` K-steps staged per barrier. Two
    buffers of each, alternating by `steps` K-steps (weights) and by 4 K-steps (scales): the one barrier after
    a stage's stores also tells that every wave has read the buffer they overwrite (read two stages, or two
    scale periods, earlier)."""
    return (ks // steps % 2) * steps * b_dw + (ks % steps) * b_dw, 2 * steps * b_dw + (ks // 4 % 2) * s_dw


def _stage_steps(ops, staged, wv, lane, waves):
    """Stage K-steps (`staged`: per step, its `at` from _bufs, this wave's weight vectors and, every 4 K-steps,
    scale dwords); then the barrier that makes them visible."""
    buffer.keep_issued_above()  # the stage's loads stay in this stage (else hoisted loads raise the VGPR count)
    for at, b_in, sbs_in in staged:
        if b_in is not None:
            _stage(ops, at[0], b_in, wv, lane, 4, waves)
        if sbs_in is not None:
            _stage(ops, at[1], sbs_in, wv, lane, 1, waves)
    gpu.barrier()


def _fold(group, c, chain, grp, tot):
    """The fixed grouping after chain c (geometry.py): `group` chains left to right, then the groups."""
    grp = chain if c % group == 0 else [grp[g] + chain[g] for g in range(len(chain))]
    if c % group == group - 1:
        tot = grp if tot is None else [tot[g] + grp[g] for g in range(len(chain))]
    return grp, tot


def _mfmas(ops, at, accs, a, sa, sel_a, sel_b, lane, zero_b):
    """One K-step of a wave's 16-row tile against the staged groups (zero_b: the step past HP, zeros)."""
    out = []
    for g in range_constexpr(len(accs)):
        bv = fx.Vector.filled(4, 0, fx.Int32) if zero_b else fx.Vector(_read(ops, at[0], g, lane, 4, T.i32x4))
        sb = fx.Int32(_read(ops, at[1], g, lane, 1, T.i32))
        out.append(mfma.scale_fp8_fp4(a, bv, accs[g], sa, sel_a, sb, sel_b))
    return out


def make_gate_up(geo, waves: int):
    """-> (kernel, waves per workgroup). grid (max_supers, IP / (32 gu_blocks))."""
    steps = gate_up_steps(geo, waves)
    ks1, kg1, hp, ng1, top_k = geo.ks1, geo.kg1, geo.hp, geo.ng1, geo.top_k
    nq = gu_blocks(geo)
    ng = 4 * nq
    b_dw, s_dw = slots(ng, waves) * 256, slots(ng, waves) * 64  # LDS dwords: a K-step's weight rows, 4 K-steps'
    # scale dwords (two buffers of each)

    @fx.struct
    class PfLds:
        ops: fx.Array[fx.Int32, 2 * (steps * b_dw + s_dw), 16]

    @flyc.kernel(name=f"{geo.name}_gate_up{prefill_suffix(waves)}", known_block_size=[waves * 64, 1, 1])
    def k_gate_up_prefill(xq: fx.Tensor, xs: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                          meta: fx.Tensor, w13: fx.Tensor, w13_scale: fx.Tensor, w13_bias: fx.Tensor,
                          shard: fx.Tensor, inter_q: fx.Tensor, inter_s: fx.Tensor, m: fx.Int32):
        ops = fx.SharedAllocator().allocate(PfLds).peek().ops.ptr
        lane, wv = wave.lane_and_wave(fx.thread_idx.x, waves)
        r, q = lane % 16, lane // 16
        nbp = fx.block_idx.y
        n_sup, tile, count = super_tile(geo, meta, m, waves)
        if fx.block_idx.x < n_sup:
            t = tile_prologue(geo, sorted_pairs, tile_expert, shard, tile, m)
            sub = tile + wv  # this wave's 16-row tile
            pair = dword(t.sp_rsrc, (sub * ROWS + r) * 4)
            token = pair // top_k
            mine = (wv < count) & (pair >= 0)
            a_row = mine.select(token * hp + q * 16, buffer.never_in_range())
            as_row = mine.select(token * (kg1 * 16) + q * 4, buffer.never_in_range())
            g0 = t.e * ng1 + nbp * ng
            mine_g = _mine(ng, wv, waves)  # the groups this wave stages (wave-uniform)
            # staged group g: column half g % 2 of block g // 4
            live = [_in_slot(ng, i, g, waves, _live(t, (nbp * nq + g // 4) * 32 + 16 * (g % 2) + r))
                    for i, g in enumerate(mine_g)]
            v = SimpleNamespace(
                ops=ops, lane=lane, wv=wv, waves=waves, steps=steps, q=q, sub=sub, nbp=nbp, t=t,
                a_row=a_row, as_row=as_row,
                a_rsrc=buffer.tensor_resource(xq, fx.Int64(m) * hp),
                as_rsrc=buffer.tensor_resource(xs, fx.Int64(m) * (kg1 * 16)),
                b_rsrc=sub_resource(w13, fx.Int64(g0) * (ks1 * 1024), ng * ks1 * 1024),
                bs_rsrc=sub_resource(w13_scale, fx.Int64(g0) * (kg1 * 256), ng * kg1 * 256),
                # this lane's staged vectors: K-step ks at b_base + ks * 1024, scale dword j at s_base + j * 256
                b_base=[lv.select(g * (ks1 * 1024) + lane * 16, buffer.never_in_range())
                        for g, lv in zip(mine_g, live)],
                s_base=[lv.select(g * (kg1 * 256) + lane * 4, buffer.never_in_range())
                        for g, lv in zip(mine_g, live)],
                w13_bias=w13_bias, inter_q=inter_q, inter_s=inter_s)
            # Two copies of the K loop: the waves past the expert's tiles only stage (same loads and
            # barriers), without MFMAs; one branch, no values carried out of it.
            if wv < count:
                _gate_up_body(geo, v, True)
            else:
                _gate_up_body(geo, v, False)

    return k_gate_up_prefill, waves


def _live(t, col):
    return (col >= t.live_lo) & (col < t.live_hi)


def _mine(ng, wv, waves):
    """The groups wave wv stages: wv, wv + waves, ... over slots(ng, waves) (the last round may pass ng)."""
    return [i * waves + wv for i in range(slots(ng, waves) // waves)]


def _in_slot(ng, i, g, waves, cond):
    """`cond` (None: always) and, in a round that passes ng, group g < ng (a spare slot loads nothing)."""
    if (i + 1) * waves <= ng:
        return cond
    return g < ng if cond is None else cond & (g < ng)


def _masked(ok, off):
    return off if ok is None else ok.select(off, buffer.never_in_range())


def _gate_up_body(geo, v, compute: bool):
    """The K loop (staging; with compute, the MFMAs in the fixed grouping and the epilogue)."""
    ks1 = geo.ks1
    nq = gu_blocks(geo)
    ng = 4 * nq
    b_dw, s_dw = slots(ng, v.waves) * 256, slots(ng, v.waves) * 64
    ksw = geo.k_steps_per_wave(4)  # the 4-wave tier's K-step count, zero steps past HP included
    n_chunks = -(-ks1 // ksw) * ksw // geo.chunk
    tot, grp = None, None
    for c in range_constexpr(n_chunks):
        chain = [mfma.zeros() for _ in range_constexpr(ng)]
        for s4 in range_constexpr(geo.chunk // 4):
            j = c * geo.chunk // 4 + s4
            sa = fx.Int32(_load(T.i32, v.as_rsrc, v.as_row, j * 16)) if compute else None
            sbs_in = [fx.Int32(_load(T.i32, v.bs_rsrc, o, j * 256)) for o in v.s_base]
            for b0 in range_constexpr(0, 4, v.steps):
                staged, stage_mfmas = [], []
                for b in range_constexpr(b0, b0 + v.steps):
                    ks = c * geo.chunk + s4 * 4 + b
                    b_in, a = _gate_up_loads(geo, ks, v.q, v.b_rsrc, v.a_rsrc, v.a_row, v.b_base, compute)
                    at = _bufs(b_dw, s_dw, ks, v.steps)
                    staged.append((at, b_in, sbs_in if b == 0 else None))
                    stage_mfmas.append((b, ks, at, a))
                _stage_steps(v.ops, staged, v.wv, v.lane, v.waves)
                if compute:
                    for b, ks, at, a in stage_mfmas:
                        chain = _mfmas(v.ops, at, chain, a, sa, b, b, v.lane, ks >= ks1)
        if compute:
            grp, tot = _fold(geo.group, c, chain, grp, tot)
            buffer.keep_issued_above()  # fold before the next chain starts (two live chains: > 256 VGPRs)
    if compute:
        r = v.lane % 16
        for cb in range_constexpr(nq):
            c0 = (v.nbp * nq + cb) * 32
            gate_up.epilogue(geo, gate_up.elements(tot[4 * cb:4 * cb + 4]), v.t.e, v.sub, v.nbp * nq + cb, v.lane,
                             v.t.rows_b, v.t.sp_rsrc, [_live(v.t, c0 + r), _live(v.t, c0 + 16 + r)], v.w13_bias,
                             v.inter_q, v.inter_s)


def make_down(geo, waves: int):
    """grid (max_supers, h / (64 down_blocks))."""
    ip, ks2, kg2, ng2 = geo.ip, geo.ks2, geo.kg2, geo.ng2
    nq = down_blocks(geo)
    ng = 4 * nq
    b_dw, s_dw = slots(ng, waves) * 256, slots(ng, waves) * 64

    @fx.struct
    class PfLds:
        ops: fx.Array[fx.Int32, 2 * (down_steps(waves) * b_dw + s_dw), 16]

    @flyc.kernel(name=f"{geo.name}_down{prefill_suffix(waves)}", known_block_size=[waves * 64, 1, 1])
    def k_down_prefill(inter_q: fx.Tensor, inter_s: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                       meta: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, shard: fx.Tensor,
                       topk_weights: fx.Tensor, y: fx.Tensor, m: fx.Int32):
        ops = fx.SharedAllocator().allocate(PfLds).peek().ops.ptr
        lane, wv = wave.lane_and_wave(fx.thread_idx.x, waves)
        r, q = lane % 16, lane // 16
        nbp = fx.block_idx.y
        n_sup, tile, count = super_tile(geo, meta, m, waves)
        if fx.block_idx.x < n_sup:
            t = tile_prologue(geo, sorted_pairs, tile_expert, shard, tile, m)
            sub = tile + wv
            real_a = (wv < count) & (dword(t.sp_rsrc, (sub * ROWS + r) * 4) >= 0)
            g0 = t.e * ng2 + nbp * ng
            mine_g = _mine(ng, wv, waves)
            real_g = [_in_slot(ng, i, g, waves, None) for i, g in enumerate(mine_g)]
            v = SimpleNamespace(
                ops=ops, lane=lane, wv=wv, waves=waves, steps=down_steps(waves), q=q, sub=sub, nbp=nbp, t=t,
                m=m,
                a_row=real_a.select((sub * ROWS + r) * ip + q * 16, buffer.never_in_range()),
                as_row=real_a.select((sub * ROWS + r) * (kg2 * 16) + q * 4, buffer.never_in_range()),
                a_rsrc=buffer.tensor_resource(inter_q, t.rows_b * ip),
                as_rsrc=buffer.tensor_resource(inter_s, t.rows_b * (kg2 * 16)),
                b_rsrc=sub_resource(w2, fx.Int64(g0) * (ks2 * 1024), ng * ks2 * 1024),
                bs_rsrc=sub_resource(w2_scale, fx.Int64(g0) * (kg2 * 256), ng * kg2 * 256),
                b_base=[_masked(ok, g * (ks2 * 1024) + lane * 16) for g, ok in zip(mine_g, real_g)],
                s_base=[_masked(ok, g * (kg2 * 256) + lane * 4) for g, ok in zip(mine_g, real_g)],
                w2_bias=w2_bias, topk_weights=topk_weights, y=y)
            if wv < count:
                _down_body(geo, v, True)
            else:
                _down_body(geo, v, False)

    return k_down_prefill


def _down_body(geo, v, compute: bool):
    """The K loop (one chain over K = IP, as the 16-row down) and, with compute, the epilogue."""
    ks2, kg2 = geo.ks2, geo.kg2
    ng = 4 * down_blocks(geo)
    b_dw, s_dw = slots(ng, v.waves) * 256, slots(ng, v.waves) * 64
    accs = [mfma.zeros() for _ in range_constexpr(ng)]
    for j in range_constexpr(kg2):
        sa = fx.Int32(_load(T.i32, v.as_rsrc, v.as_row, j * 16)) if compute else None
        sbs_in = [fx.Int32(_load(T.i32, v.bs_rsrc, o, j * 256)) for o in v.s_base]
        n = min(4, ks2 - 4 * j)
        for b0 in range_constexpr(0, n, v.steps):
            staged, stage_mfmas = [], []
            for b in range_constexpr(b0, min(b0 + v.steps, n)):
                ks = 4 * j + b
                k0 = ks * KSTEP + v.q * 32  # a padded K-block (a rank's dead columns) is zero: not loaded
                k_live = (k0 + 32 > v.t.live_lo) & (k0 < v.t.live_hi)
                b_in = [fx.Vector(_load(T.i32x4, v.b_rsrc, k_live.select(o, buffer.never_in_range()), ks * 1024))
                        for o in v.b_base]
                at = _bufs(b_dw, s_dw, ks, v.steps)
                staged.append((at, b_in, sbs_in if b == 0 else None))
                stage_mfmas.append((b, ks, at))
            _stage_steps(v.ops, staged, v.wv, v.lane, v.waves)
            if compute:
                for b, ks, at in stage_mfmas:
                    a = fx.Vector(_load(T.i32x4, v.a_rsrc, v.a_row, ks * KSTEP)).shuffle(
                        fx.Vector(_load(T.i32x4, v.a_rsrc, v.a_row, ks * KSTEP + 64)), list(range(8)))
                    accs = _mfmas(v.ops, at, accs, a, sa, b, ks % 4, v.lane, False)
    if compute:
        _down_epilogue(geo, accs, v.t, v.sub, v.nbp, v.lane, v.w2_bias, v.topk_weights, v.y, v.m)


def _down_epilogue(geo, accs, t, sub, nbp, lane, w2_bias, topk_weights, y, m):
    """The down tier's epilogue for one 16-row tile and the workgroup's column blocks: + bias, x routing weight."""
    hidden, experts, top_k, biases, e = geo.hidden, geo.experts, geo.top_k, geo.biases, t.e
    nq = down_blocks(geo)
    r, q = lane % 16, lane // 16
    tw_rsrc = buffer.tensor_resource(topk_weights, fx.Int64(m) * (top_k * 4))
    y_rsrc = buffer.tensor_resource(y, fx.Int64(m) * (top_k * hidden * 2))
    bias_rsrc = buffer.tensor_resource(w2_bias, experts * hidden * 4)
    bias_on = dword(t.sh_rsrc, 8) != 0  # zero bias (TP ranks > 0): not read
    # the 4 rows' pairs and routing weights, loaded once for the nq column blocks
    pairs = [dword(t.sp_rsrc, (sub * ROWS + q * 4 + reg) * 4) for reg in range_constexpr(4)]
    ws = [dword(tw_rsrc, (p >= 0).select(p * 4, buffer.never_in_range())).bitcast(fx.Float32) for p in pairs]
    for cb in range_constexpr(nq):
        nblk = nbp * nq + cb
        bias = None
        if biases:
            bias = [dword(bias_rsrc, bias_on.select((e * hidden + nblk * 64 + g * 16 + r) * 4,
                                                    buffer.never_in_range())).bitcast(fx.Float32)
                    for g in range_constexpr(4)]
        for reg in range_constexpr(4):
            pair, w = pairs[reg], ws[reg]
            base = (pair >= 0).select(pair * (hidden * 2) + nblk * 128 + r * 2, buffer.never_in_range())
            for g in range_constexpr(4):
                v = accs[4 * cb + g][reg] + bias[g] if biases else accs[4 * cb + g][reg]
                buffer.store(bf16_bits(v * w), y_rsrc, base + g * 32)
