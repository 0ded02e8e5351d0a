"""MXFP8-activation x MXFP4-weight MoE: five FlyDSL launches, built per shape (h, IP, E, top-k, activation).

1. quant    grid M, 1 wave/row: x bf16 [M, h] -> xq E4M3 [M, HP] + E8M0 scales [M, KG1*16] in the A-scale
            layout (byte (4j + q)*4 + b of a row = K-block 4(4j + b) + q: one dword per lane per 4 K-steps).
2. sort     1 wave: counting sort of the M*k (token, slot) pairs by expert, stable in pair order: per 64-pair
            chunk, lanes with the same expert find each other with 7 ballots (rank = mbcnt), a per-expert
            counter in LDS advances by the group's popcount. Pass 1 counts, a DPP scan pads each expert to
            16 rows and places it, pass 2 writes sorted_pairs[row] = pair (-1 in padding rows) and
            tile_expert[tile]. Ids outside [0, E) (graph-padding garbage) are dropped. Same input, same output.
3. stage 1  grid (max_tiles, IP/32): 16 sorted rows x 32 intermediate columns (gate 32 + up 32 weight
            rows) of one expert; the K-steps are split over the workgroup's waves in contiguous runs of a
            multiple of 4 (so each B-scale dword is read once) and summed through LDS by wave 0. Up to 4
            waves; the small-M variant ("moe.small_m", while the grid is < 256 workgroups) uses up to 8.
            Every variant sums K in one fixed grouping (batch invariance: a row's bits never depend on the
            tier its batch size picks): chunks of `chunk` K-steps, each one MFMA chain from zero; `group`
            chunks summed left to right; the group sums left to right. Then + bias, the activation (NaN
            kept), MXFP8 quantization per row over the 32 columns (a 16-lane DPP max) -> inter (real rows
            only).
4. stage 2  grid (max_tiles, h/64): one wave x 4 groups of 16 output columns (the A tile loaded once, real
            rows only), K = IP, + bias, times the pair's routing weight -> y bf16 [M*k, h] at row
            pair = token*k + slot (each element has one writer; padding rows load and store nothing).
5. combine  grid M: out[m] = sum over j = 0..k-1 of y[m*k + j] in that order (fp32), -> bf16.
            Why a y round trip (2 M k h bytes): a token's k pairs sit in k different expert tiles, and
            without atomics their sum needs either these rows or one owner per output column walking every
            tile in turn (a serial chain of weight loads per workgroup: latency-bound on an MI355X).
M is at most `max_tokens` (the entry refuses more): every buffer then ends below the masked-store offset
buffer.never_in_range() and 32-bit offsets cannot wrap.
Tiles past the sorted count exit at once (max_tiles is a host bound; the real count is read on device).
No atomics anywhere (LDS counters are updated by one lane per expert per chunk, in program order).

Bytes that carry nothing are not read: `shard` (from prepare_weights) gives the live intermediate columns
[live_lo, live_hi) of the prepared span, and whether the w2 bias is added (rank 0); weight rows of dead
columns, dead 32-column K-blocks of w2, the K tail past h in the last
gate-up K-step and zero biases load out of range (0, no memory traffic). The swiglu activation has no
biases at all.
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import math
from types import SimpleNamespace

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl._mlir import ir
from flydsl._mlir.dialects import math as mmath
from flydsl.expr import gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from amd_kernels.common import bf16, buffer, mfma, mxfp8, wave
from amd_kernels.moe import prepare

KSTEP = 128
ROWS = 16  # sorted rows per tile
LOG2E = 1.4426950408889634
ALPHA = 1.702
LIMIT = 7.0


def round_up(x, m):
    return -(-x // m) * m


def max_tiles(pairs: int, experts: int) -> int:
    return pairs // ROWS + min(experts, pairs)


def _rows_bound(m, top_k, experts):
    """Sorted rows the host allocates for m tokens (max_tiles * ROWS), as an i64 device value."""
    pairs = m * top_k
    return fx.Int64(pairs // ROWS + fx.min(pairs, fx.Int32(experts))) * ROWS


def _dword(rsrc, off):
    return fx.Int32(rocdl.raw_ptr_buffer_load(T.i32, rsrc, buffer._ir(off), buffer._ir(0)))


def _sub_resource(t, elem_offset, nbytes):
    ptr = fx.add_offset(fx.get_iter(t), fx.Int64(elem_offset))
    return rocdl.get_buffer_rsrc(rocdl.make_buffer_ptr(ptr, num_records_bytes=fx.Int64(nbytes)))


def _bf16_bits(v):
    """fp32 -> bf16 (RNE) as an i16, for a 2-byte store."""
    return fx.Float32(v).to(fx.BFloat16).bitcast(fx.Int16)


def _f32(v):
    return fx.as_ir_value(fx.Float32(v))


def _exp2(v):
    return fx.Float32(rocdl.exp2(T.f32, _f32(v)))


def _row16_max_i32(v):
    for ctrl in (wave.QUAD_SWAP_1, wave.QUAD_SWAP_2, wave.ROW_HALF_MIRROR, wave.ROW_MIRROR):
        v = fx.max(v, wave.dpp(v, ctrl))
    return v


def _wave_inclusive_scan(v):
    for n in (1, 2, 4, 8):
        v = v + wave.dpp(v, 0x110 + n)  # row_shr:n, lanes without a source add 0
    v = v + wave.dpp(v, wave.ROW_BCAST_15, row_mask=0xA)
    v = v + wave.dpp(v, wave.ROW_BCAST_31, row_mask=0xC)
    return v


def _ballot(pred):
    return fx.Int64(rocdl.ballot(T.i64, fx.as_ir_value(pred)))


def _popc64(m):
    return fx.Int64(mmath.ctpop(fx.as_ir_value(m))).to(fx.Int32)


def _mbcnt(m):
    lo = fx.Int32(m.to(fx.Int32))
    hi = fx.Int32((m >> 32).to(fx.Int32))
    i32 = ir.IntegerType.get_signless(32)
    c = rocdl.mbcnt_lo(i32, fx.as_ir_value(lo), fx.as_ir_value(fx.Int32(0)))
    return fx.Int32(rocdl.mbcnt_hi(i32, fx.as_ir_value(hi), c))


def _is_nan(v):
    return (fx.Float32(v).bitcast(fx.Int32) & 0x7FFFFFFF) > 0x7F800000


def _fp8x2(a, b, inv_scale):
    """Two fp32 -> two E4M3 bytes (clamped to +-448 first, RNE) in the low 16 bits of an i32; NaN stays NaN
    (the clamp would turn it into a finite value)."""
    f32 = ir.F32Type.get()
    lo, hi = _f32(-mxfp8.E4M3_MAX), _f32(mxfp8.E4M3_MAX)
    sa, sb = fx.Float32(a * inv_scale), fx.Float32(b * inv_scale)
    ca = _is_nan(sa).select(sa, fx.Float32(rocdl.fmed3(f32, _f32(sa), lo, hi)))
    cb = _is_nan(sb).select(sb, fx.Float32(rocdl.fmed3(f32, _f32(sb), lo, hi)))
    return fx.Int32(rocdl.cvt_pk_fp8_f32(ir.IntegerType.get_signless(32), _f32(ca), _f32(cb), fx.Int32(0), False))


def _activation(kind, gate, up):
    if kind == "gptoss":
        # Clamps that keep NaN (as torch.clamp does; a min/max instruction would drop it): x > 7 is false for NaN.
        g = (gate > LIMIT).select(fx.Float32(LIMIT), gate)
        u = (up > LIMIT).select(fx.Float32(LIMIT), (up < -LIMIT).select(fx.Float32(-LIMIT), up))
        sig = 1.0 / (1.0 + _exp2(g * (-ALPHA * LOG2E)))
        return (u + 1.0) * g * sig
    return gate / (1.0 + _exp2(gate * (-LOG2E))) * up


def _scale_pos(kblock: int) -> int:
    """Byte of K-block `kblock` in a row of the A-scale layout."""
    ks, q = kblock // 4, kblock % 4
    return ((ks // 4) * 4 + q) * 4 + ks % 4


def _tile_rows(sorted_pairs, tile_expert, tile, m, top_k, experts):
    """A tile launch's view of the sort: (rows bound, sorted_pairs descriptor, the tile's expert)."""
    rows_b = _rows_bound(m, top_k, experts)
    sp_rsrc = buffer.tensor_resource(sorted_pairs, rows_b * 4)
    e = wave.uniform_i32(_dword(buffer.tensor_resource(tile_expert, rows_b // ROWS * 4), tile * 4))
    return rows_b, sp_rsrc, e


def _live_span(shard):
    """(shard descriptor, live_lo, live_hi): the live prepared intermediate columns (prepare.py)."""
    sh_rsrc = buffer.tensor_resource(shard, 16)
    return sh_rsrc, _dword(sh_rsrc, 0), _dword(sh_rsrc, 4)


def _num_tiles(meta):
    return wave.uniform_i32(_dword(buffer.tensor_resource(meta, 16), 0))


def build(hidden: int, ip: int, experts: int, top_k: int, activation: str, name: str, small_m_waves: int = 0):
    """The pipeline for one shape. small_m_waves > 0 adds a variant for small token counts whose gate-up
    splits K over up to that many waves per workgroup (summed through LDS in wave order)."""
    biases = activation == "gptoss"
    hp = round_up(hidden, KSTEP)
    ks1, ks2 = hp // KSTEP, ip // KSTEP
    kg1, kg2 = -(-ks1 // 4), -(-ks2 // 4)
    ng1, ng2 = 2 * ip // 16, hidden // 16
    nb1, nb2 = ip // 32, hidden // 64
    if hidden % 64 or ip % KSTEP or experts > 128 or experts % 2:
        raise ValueError(f"unsupported MoE shape: hidden {hidden} (multiple of 64), IP {ip} (of 128), "
                         f"experts {experts} (even, <= 128)")

    # ---- 1. activation quantization ----
    slots_q = -(-hp // 512)

    @flyc.kernel(name=f"{name}_quant", known_block_size=[64, 1, 1])
    def k_quant(x: fx.Tensor, xq: fx.Tensor, xs: fx.Tensor, m: fx.Int32):
        lane = fx.thread_idx.x % 64
        row = fx.block_idx.x
        x_rsrc = buffer.row_resource(x, row, hidden, 2)
        q_rsrc = buffer.row_resource(xq, row, hp, 1)
        s_rsrc = buffer.row_resource(xs, row, kg1 * 16, 1)
        vals = [buffer.load_x4(x_rsrc, lane * 16 + j * 1024) for j in range_constexpr(slots_q)]
        buffer.keep_issued_above()
        for j in range_constexpr(slots_q):
            y = bf16.unpack(vals[j])
            byte, inv = mxfp8.block_scale(y)
            buffer.store(mxfp8.e4m3x8(y, inv), q_rsrc, lane * 8 + j * 512)
            kblock = j * 16 + lane // 4
            ks = kblock // 4
            pos = (((ks // 4) * 4 + kblock % 4) * 4 + ks % 4)
            # K-blocks past HP (absent K-steps of the last scale dword) get byte 0: stage 1 loads whole dwords.
            ok = ((lane % 4) == 0) & (kblock < kg1 * 16)
            buffer.store_byte(byte, s_rsrc, ok.select(pos, buffer.never_in_range()))

    # ---- 2. sort ----
    @fx.struct
    class SortLds:
        count: fx.Array[fx.Int32, experts, 16]
        offs: fx.Array[fx.Int32, experts, 16]

    @flyc.kernel(name=f"{name}_sort", known_block_size=[64, 1, 1])
    def k_sort(ids: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor, m: fx.Int32):
        lds = fx.SharedAllocator().allocate(SortLds).peek()
        cnt = lds.count.view(fx.make_layout(experts, 1))
        offs = lds.offs.view(fx.make_layout(experts, 1))
        lane = fx.thread_idx.x % 64
        pairs = m * top_k
        ids_rsrc = buffer.tensor_resource(ids, fx.Int64(pairs) * 4)
        tiles_bound = pairs // ROWS + fx.min(pairs, fx.Int32(experts))
        sp_rsrc = buffer.tensor_resource(sorted_pairs, fx.Int64(tiles_bound) * (ROWS * 4))
        te_rsrc = buffer.tensor_resource(tile_expert, fx.Int64(tiles_bound) * 4)
        for i in range_constexpr(experts // 64):
            fx.memref_store(fx.Int32(0), cnt, lane + 64 * i)
        chunks = (pairs + 63) // 64

        def chunk_info(c):
            p = c * 64 + lane
            e = _dword(ids_rsrc, p * 4)
            valid = (p < pairs) & (e >= 0) & (e < experts)
            match = _ballot(valid)
            for bit in range_constexpr(7):
                bb = _ballot(((e >> bit) & 1) != 0)
                match = match & (((e >> bit) & 1) != 0).select(bb, ~bb)
            return p, e, valid, match

        for c in range(chunks):
            p, e, valid, match = chunk_info(c)
            if valid & (_mbcnt(match) == 0):
                fx.memref_store(fx.memref_load(cnt, e) + _popc64(match), cnt, e)

        c0 = fx.memref_load(cnt, 2 * lane)
        c1 = fx.memref_load(cnt, 2 * lane + 1)
        pad0 = (c0 + (ROWS - 1)) & (-ROWS)
        pad1 = (c1 + (ROWS - 1)) & (-ROWS)
        s = pad0 + pad1
        incl = _wave_inclusive_scan(s)
        start0 = incl - s
        start1 = start0 + pad0
        total = wave.readlane(incl, 63)
        if lane == 0:
            buffer.store(total // ROWS, buffer.tensor_resource(meta, 16), fx.Int32(0))
        fx.memref_store(start0, offs, 2 * lane)
        fx.memref_store(start1, offs, 2 * lane + 1)
        for i in range(pad0 // ROWS):
            buffer.store(2 * lane, te_rsrc, (start0 // ROWS + i) * 4)
        for i in range(pad1 // ROWS):
            buffer.store(2 * lane + 1, te_rsrc, (start1 // ROWS + i) * 4)
        for i in range(c0, pad0):
            buffer.store(fx.Int32(-1), sp_rsrc, (start0 + i) * 4)
        for i in range(c1, pad1):
            buffer.store(fx.Int32(-1), sp_rsrc, (start1 + i) * 4)

        for c in range(chunks):
            p, e, valid, match = chunk_info(c)
            if valid:
                base = fx.memref_load(offs, e)
                buffer.store(p, sp_rsrc, (base + _mbcnt(match)) * 4)
                if _mbcnt(match) == 0:
                    fx.memref_store(base + _popc64(match), offs, e)

    # ---- 3. stage 1: gate-up + activation + MXFP8 ----
    def epilogue(tot, e, tile, nblk, lane, rows_b, sp_rsrc, col_live, w13_bias, inter_q, inter_s):
        """tot[g][reg] = the 16 x 64 gate/up sums of (tile, nblk) in the MFMA C layout: + bias, activation,
        MXFP8 per row over the block's 32 columns -> inter (real rows only: stage 2 never reads padding)."""
        r, q = lane % 16, lane // 16
        bias = None
        if biases:
            bias_rsrc = buffer.tensor_resource(w13_bias, experts * 2 * ip * 4)
            bias = [_dword(bias_rsrc, col_live[g % 2].select((e * (2 * ip) + nblk * 64 + g * 16 + r) * 4,
                                                           buffer.never_in_range())).bitcast(fx.Float32)
                    for g in range_constexpr(4)]
        iq_rsrc = buffer.tensor_resource(inter_q, rows_b * ip)
        is_rsrc = buffer.tensor_resource(inter_s, rows_b * (kg2 * 16))
        for reg in range_constexpr(4):
            real = _dword(sp_rsrc, (tile * ROWS + q * 4 + reg) * 4) >= 0
            v = [tot[g][reg] + bias[g] if biases else tot[g][reg] for g in range_constexpr(4)]
            a0 = _activation(activation, v[0], v[2])
            a1 = _activation(activation, v[1], v[3])
            amax = fx.max(a0.bitcast(fx.Int32) & 0x7FFFFFFF, a1.bitcast(fx.Int32) & 0x7FFFFFFF)
            byte, inv = mxfp8.scale_from_amax_bits(_row16_max_i32(amax))
            pk = _fp8x2(a0, a1, inv)
            row = tile * ROWS + q * 4 + reg
            q_off = real.select(row * ip + nblk * 32 + r, buffer.never_in_range())
            buffer.store_byte(pk, iq_rsrc, q_off)
            buffer.store_byte(pk >> 8, iq_rsrc, q_off + 16)
            ks = nblk // 4
            pos = ((ks // 4) * 4 + nblk % 4) * 4 + ks % 4
            buffer.store_byte(byte, is_rsrc, (real & (r == 0)).select(row * (kg2 * 16) + pos,
                                                                      buffer.never_in_range()))
            # Bytes of absent K-steps (KS2 .. 4 KG2 - 1) in the last scale dword: zero, written by the
            # workgroups of the first K-step of that dword (stage 2 loads whole dwords).
            for ks_x in range_constexpr(ks2, 4 * kg2):
                pos_x = ((ks_x // 4) * 4 + nblk % 4) * 4 + ks_x % 4
                first = real & (r == 0) & (nblk // 4 == 4 * (kg2 - 1))
                buffer.store_byte(fx.Int32(0), is_rsrc, first.select(row * (kg2 * 16) + pos_x,
                                                                     buffer.never_in_range()))

    def k_steps_per_wave(max_waves: int) -> int:
        ksw = 4  # a multiple of 4, so each lane's B-scale dword is read by one wave
        while -(-ks1 // ksw) > max_waves:
            ksw += 4
        return ksw

    # Batch invariance: every gate-up tier sums K in the same fixed grouping, so a row's bits never depend on
    # which tier its batch size picks. K-steps run in chunks of `chunk` (one MFMA chain each, from zero);
    # `group` consecutive chunks are summed left to right, then the group sums left to right. A full-tier
    # wave holds one group; a small-M wave holds fewer chunks, and wave 0 rebuilds the groups from LDS.
    ksw_tiers = [k_steps_per_wave(4)] + ([k_steps_per_wave(small_m_waves)] if small_m_waves else [])
    chunk = math.gcd(*ksw_tiers)
    group = ksw_tiers[0] // chunk
    assert len({-(-ks1 // k) * k // chunk for k in ksw_tiers}) == 1, "tiers must sum the same chunks"

    def gate_up_chain(ks0, a_rsrc, as_rsrc, a_row, as_row, b_rsrc, bs_rsrc, col_live, lane, q):
        """The 4 x 4 accumulators of `chunk` K-steps from ks0 (one MFMA chain from zero)."""
        accs = [mfma.zeros() for _ in range_constexpr(4)]
        for s4 in range_constexpr(chunk // 4):
            j = ks0 // 4 + s4
            sa = _dword(as_rsrc, as_row + j * 16)
            sbs = [_dword(bs_rsrc, col_live[g % 2].select((g * kg1 + j) * 256 + lane * 4, buffer.never_in_range()))
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

    def wave_values(first_ks, cpw, per_group, chain):
        """This wave's cpw chunks from K-step first_ks; with whole groups, each group summed (left to right)."""
        mine = []
        for i in range_constexpr(cpw):
            c = chain(first_ks + i * chunk)
            if per_group and i % group:
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

    def wave0_total(mine, slots, per_group, part, lane):
        """Wave 0: the gate-up sums in the fixed grouping, from its own values and the other waves' slots."""
        if per_group:  # a slot per group: wave 0's groups, then the others' in order
            tot = elements(mine[0])
            for i in range_constexpr(1, len(mine)):
                tot = add(tot, elements(mine[i]))
            for s in range_constexpr(len(mine), slots):
                tot = plus_slot(tot, s, part, lane)
            return tot
        tot = None  # a slot per chunk: each group summed left to right, then added to the total
        for g0 in range_constexpr(0, slots, group):
            grp = None
            for c in range_constexpr(g0, g0 + group):
                if c < len(mine):
                    grp = elements(mine[c]) if grp is None else add(grp, elements(mine[c]))
                elif grp is None:
                    grp = [[fx.memref_load(part, ((c * 4 + g) * 4 + reg) * 64 + lane) for reg in range_constexpr(4)]
                           for g in range_constexpr(4)]
                else:
                    grp = plus_slot(grp, c, part, lane)
            tot = grp if tot is None else add(tot, grp)
        return tot

    def make_stage1(max_waves: int, kname: str):
        ksw = k_steps_per_wave(max_waves)
        waves = -(-ks1 // ksw)
        cpw = ksw // chunk  # chunks per wave
        # Whole groups per wave: a slot per group; otherwise a slot per chunk (wave 0 forms the groups).
        per_group = cpw % group == 0
        per_wave = cpw // group if per_group else cpw  # slots a wave fills
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
            if tile < _num_tiles(meta):
                rows_b, sp_rsrc, e = _tile_rows(sorted_pairs, tile_expert, tile, m, top_k, experts)
                sh_rsrc, live_lo, live_hi = _live_span(shard)
                # Lane r's weight row in groups g = 0, 2 (gate, up) is column 32 nblk + r; in g = 1, 3, + 16.
                col_live = [(nblk * 32 + 16 * h + r >= live_lo) & (nblk * 32 + 16 * h + r < live_hi)
                            for h in (0, 1)]
                pair = _dword(sp_rsrc, (tile * ROWS + r) * 4)
                token = pair // top_k
                a_rsrc = buffer.tensor_resource(xq, fx.Int64(m) * hp)
                as_rsrc = buffer.tensor_resource(xs, fx.Int64(m) * (kg1 * 16))
                a_row = (pair >= 0).select(token * hp + q * 16, buffer.never_in_range())
                as_row = (pair >= 0).select(token * (kg1 * 16) + q * 4, buffer.never_in_range())
                g0 = e * ng1 + nblk * 4
                b_rsrc = _sub_resource(w13, fx.Int64(g0) * (ks1 * 1024), 4 * ks1 * 1024)
                bs_rsrc = _sub_resource(w13_scale, fx.Int64(g0) * (kg1 * 256), 4 * kg1 * 256)
                mine = wave_values(wv * ksw, cpw, per_group,
                                   lambda ks0: gate_up_chain(ks0, a_rsrc, as_rsrc, a_row, as_row, b_rsrc, bs_rsrc,
                                                             col_live, lane, q))
                if waves > 1:
                    lds_store(mine, wv * per_wave, part, lane)
                    gpu.barrier()
                if wv == 0:
                    tot = wave0_total(mine, slots, per_group, part, lane)
                    epilogue(tot, e, tile, nblk, lane, rows_b, sp_rsrc, col_live, w13_bias, inter_q, inter_s)

        return k_stage1, waves

    k_stage1, w1 = make_stage1(4, f"{name}_gate_up")
    if small_m_waves:
        k_stage1_small, w1_small = make_stage1(small_m_waves, f"{name}_gate_up_small_m")

    # ---- 4. stage 2: down + bias, x routing weight -> y[pair] (bf16) ----
    @flyc.kernel(name=f"{name}_down", known_block_size=[64, 1, 1])
    def k_stage2(inter_q: fx.Tensor, inter_s: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                 meta: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, shard: fx.Tensor,
                 topk_weights: fx.Tensor, y: fx.Tensor, m: fx.Int32):
        lane = fx.thread_idx.x % 64
        r, q = lane % 16, lane // 16
        tile = fx.block_idx.x
        nblk = fx.block_idx.y
        if tile < _num_tiles(meta):
            rows_b, sp_rsrc, e = _tile_rows(sorted_pairs, tile_expert, tile, m, top_k, experts)
            sh_rsrc, live_lo, live_hi = _live_span(shard)
            a_rsrc = buffer.tensor_resource(inter_q, rows_b * ip)
            as_rsrc = buffer.tensor_resource(inter_s, rows_b * (kg2 * 16))
            real_a = _dword(sp_rsrc, (tile * ROWS + r) * 4) >= 0
            a_row = real_a.select((tile * ROWS + r) * ip + q * 16, buffer.never_in_range())
            as_row = real_a.select((tile * ROWS + r) * (kg2 * 16) + q * 4, buffer.never_in_range())
            b_rsrc = _sub_resource(w2, fx.Int64(e * ng2 + nblk * 4) * (ks2 * 1024), 4 * ks2 * 1024)
            bs_rsrc = _sub_resource(w2_scale, fx.Int64(e * ng2 + nblk * 4) * (kg2 * 256), 4 * kg2 * 256)
            accs = [mfma.zeros() for _ in range_constexpr(4)]
            for j in range_constexpr(kg2):
                sa = _dword(as_rsrc, as_row + j * 16)
                sbs = [_dword(bs_rsrc, (g * kg2 + j) * 256 + lane * 4) for g in range_constexpr(4)]
                for b in range_constexpr(min(4, ks2 - 4 * j)):
                    ks = 4 * j + b
                    a = buffer.load_x4(a_rsrc, a_row + ks * KSTEP).shuffle(
                        buffer.load_x4(a_rsrc, a_row + ks * KSTEP + 64), list(range(8)))
                    # Lane q's B vector is the 32-column K-block 4 ks + q: a padded block is zero, not loaded.
                    k0 = ks * KSTEP + q * 32
                    k_live = (k0 + 32 > live_lo) & (k0 < live_hi)
                    for g in range_constexpr(4):
                        bv = buffer.load_x4(b_rsrc, k_live.select((g * ks2 + ks) * 1024 + lane * 16,
                                                                  buffer.never_in_range()))
                        accs[g] = mfma.scale_fp8_fp4(a, bv, accs[g], sa, b, sbs[g], ks % 4)
            bias = None
            if biases:
                bias_rsrc = buffer.tensor_resource(w2_bias, experts * hidden * 4)
                bias_on = _dword(sh_rsrc, 8) != 0  # zero bias (TP ranks > 0): not read
                bias = [_dword(bias_rsrc, bias_on.select((e * hidden + nblk * 64 + g * 16 + r) * 4,
                                                         buffer.never_in_range())).bitcast(fx.Float32)
                        for g in range_constexpr(4)]
            tw_rsrc = buffer.tensor_resource(topk_weights, fx.Int64(m) * (top_k * 4))
            y_rsrc = buffer.tensor_resource(y, fx.Int64(m) * (top_k * hidden * 2))
            for reg in range_constexpr(4):
                pair = _dword(sp_rsrc, (tile * ROWS + q * 4 + reg) * 4)
                real = pair >= 0
                w = _dword(tw_rsrc, real.select(pair * 4, buffer.never_in_range())).bitcast(fx.Float32)
                base = real.select(pair * (hidden * 2) + nblk * 128 + r * 2, buffer.never_in_range())
                for g in range_constexpr(4):
                    v = accs[g][reg] + bias[g] if biases else accs[g][reg]
                    buffer.store(_bf16_bits(v * w), y_rsrc, base + g * 32)

    # ---- 5. fixed-order combine ----
    slots_c = -(-hidden // 512)

    @flyc.kernel(name=f"{name}_combine", known_block_size=[64, 1, 1])
    def k_combine(y: fx.Tensor, topk_ids: fx.Tensor, out: fx.Tensor, m: fx.Int32):
        lane = fx.thread_idx.x % 64
        row = fx.block_idx.x
        i_rsrc = buffer.row_resource(topk_ids, row, top_k, 4)
        o_rsrc = buffer.row_resource(out, row, hidden, 2)
        sums = [fx.Vector.filled(8, 0.0, fx.Float32) for _ in range_constexpr(slots_c)]
        for j in range_constexpr(top_k):
            ej = _dword(i_rsrc, j * 4)
            ok = (ej >= 0) & (ej < experts)  # a dropped pair (garbage id) has no y row: not read
            y_rsrc = buffer.row_resource(y, row * top_k + j, hidden, 2)
            for s in range_constexpr(slots_c):
                sums[s] = sums[s] + bf16.unpack(
                    buffer.load_x4(y_rsrc, ok.select(lane * 16 + s * 1024, buffer.never_in_range())))
        for s in range_constexpr(slots_c):
            buffer.store(bf16.pack(sums[s]), o_rsrc, lane * 16 + s * 1024)

    def launch_all(small_m, x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard,
                   xq, xs, sorted_pairs, tile_expert, meta, inter_q, inter_s, y, out, m, tiles, stream):
        k_quant(x, xq, xs, m).launch(grid=(m, 1, 1), block=(64, 1, 1), stream=stream)
        k_sort(topk_ids, sorted_pairs, tile_expert, meta, m).launch(grid=(1, 1, 1), block=(64, 1, 1), stream=stream)
        s1, waves = (k_stage1_small, w1_small) if small_m else (k_stage1, w1)
        s1(xq, xs, sorted_pairs, tile_expert, meta, w13, w13_scale, w13_bias, shard, inter_q, inter_s, m).launch(
            grid=(tiles, nb1, 1), block=(waves * 64, 1, 1), stream=stream)
        k_stage2(inter_q, inter_s, sorted_pairs, tile_expert, meta, w2, w2_scale, w2_bias, shard, topk_weights, y,
                 m).launch(grid=(tiles, nb2, 1), block=(64, 1, 1), stream=stream)
        k_combine(y, topk_ids, out, m).launch(grid=(m, 1, 1), block=(64, 1, 1), stream=stream)

    def make_launcher(small_m):
        @flyc.jit
        def moe(x: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor, w13: fx.Tensor, w13_scale: fx.Tensor,
                w13_bias: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, shard: fx.Tensor,
                xq: fx.Tensor, xs: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor,
                inter_q: fx.Tensor, inter_s: fx.Tensor, y: fx.Tensor, out: fx.Tensor, m: fx.Int32,
                tiles: fx.Int32, stream: fx.Stream = fx.Stream(None)):
            launch_all(small_m, x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard,
                       xq, xs, sorted_pairs, tile_expert, meta, inter_q, inter_s, y, out, m, tiles, stream)
        return moe

    launchers = {"moe.full": make_launcher(False)}
    if small_m_waves:
        launchers["moe.small_m"] = make_launcher(True)

    def variant_for(m: int) -> str:
        """The many-wave gate-up while the plain one would launch fewer than 256 workgroups."""
        return "moe.small_m" if small_m_waves and max_tiles(m * top_k, experts) * nb1 < 256 else "moe.full"

    def largest_buffer(m: int) -> int:
        """Bytes of the largest buffer a launch at m tokens indexes (workspace, x, out)."""
        pairs = m * top_k
        rows = max(1, max_tiles(pairs, experts)) * ROWS
        return max(pairs * hidden * 2, rows * ip, rows * kg2 * 16, m * hp, m * hidden * 2)

    # Token bound: masked stores aim at buffer.never_in_range() (just below 2 GiB) and offsets are 32-bit, so
    # every buffer must end below it; the bound is the largest power of two that keeps them there.
    max_tokens = 1
    while largest_buffer(2 * max_tokens) < 0x7FFFFFF0:
        max_tokens *= 2

    def workspace(m: int, device="cpu"):
        pairs = m * top_k
        tiles = max(1, max_tiles(pairs, experts))
        rows = tiles * ROWS
        u8 = dict(dtype=torch.uint8, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        return dict(xq=torch.empty(m, hp, **u8), xs=torch.empty(m, kg1 * 16, **u8),
                    sorted_pairs=torch.empty(rows, **i32), tile_expert=torch.empty(tiles, **i32),
                    meta=torch.zeros(4, **i32), inter_q=torch.empty(rows, ip, **u8),
                    inter_s=torch.empty(rows, kg2 * 16, **u8),
                    y=torch.empty(max(pairs, 1), hidden, dtype=torch.bfloat16, device=device)), tiles

    def weight_shapes():
        return dict(w13=(experts, ng1, ks1, 64, 16), w13_scale=(experts, ng1, kg1, 64, 4),
                    w13_bias=(experts, 2 * ip), w2=(experts, ng2, ks2, 64, 16),
                    w2_scale=(experts, ng2, kg2, 64, 4),
                    w2_bias=(experts, hidden), shard=(4,))

    def launch_args(key, x, topk_weights, topk_ids, w, out, device="cpu"):
        """The launcher's positional arguments (without the stream) for variant `key`."""
        m = x.shape[0]
        ws, tiles = workspace(m, device)
        return (x, topk_weights, topk_ids, w["w13"], w["w13_scale"], w["w13_bias"], w["w2"], w["w2_scale"],
                w["w2_bias"], w["shard"], ws["xq"], ws["xs"], ws["sorted_pairs"], ws["tile_expert"], ws["meta"],
                ws["inter_q"], ws["inter_s"], ws["y"], out, m, tiles)

    def example_args_of(key):
        def example_args(m: int = 1):
            w = {k: torch.zeros(s, dtype=prepare.WEIGHT_DTYPES[k]) for k, s in weight_shapes().items()}
            x = torch.zeros(m, hidden, dtype=torch.bfloat16)
            return launch_args(key, x, torch.zeros(m, top_k), torch.zeros(m, top_k, dtype=torch.int32), w,
                               torch.zeros_like(x))
        return example_args

    # Tensor positions of (sorted_pairs, meta) among each tile launch's arguments.
    tile_launches = {f"{name}_gate_up": (2, 4), f"{name}_gate_up_small_m": (2, 4), f"{name}_down": (2, 4)}

    def emulator_workgroups(tokens, kernel, grid, pointers, read):
        """For the emulator's sampled runs: the workgroups `tokens`' output rows need (None: all of them).
        quant and sort run whole; gate-up and down run the tiles holding a pair of one of the tokens (read
        from the sort's result); combine runs the tokens' rows."""
        if kernel == f"{name}_combine":
            return {(t, 0, 0) for t in tokens}
        if kernel not in tile_launches:
            return None
        sp, mt = (pointers[i] for i in tile_launches[kernel])
        n_tiles = min(int.from_bytes(read(mt, 4), "little"), grid[0])
        pairs = torch.frombuffer(bytearray(read(sp, n_tiles * ROWS * 4)), dtype=torch.int32).reshape(-1, ROWS)
        wanted = torch.tensor(sorted(tokens), dtype=torch.int32)
        hit = ((pairs >= 0) & torch.isin(pairs // top_k, wanted)).any(dim=1)
        return {(int(t), y, z) for t in hit.nonzero().flatten() for y in range(grid[1]) for z in range(grid[2])}

    return SimpleNamespace(variants={k: (v, example_args_of(k)) for k, v in launchers.items()},
                           variant_for=variant_for, max_tokens=max_tokens, launch_args=launch_args,
                           weight_shapes=weight_shapes,
                           weight_dtypes=prepare.WEIGHT_DTYPES, emulator_workgroups=emulator_workgroups)
