"""MXFP8-activation x MXFP4-weight MoE: five FlyDSL launches (six in the split variant), built per shape
(h, IP, E, top-k, activation).

1. quant    grid M, 1 wave/row: x bf16 [M, h] -> xq E4M3 [M, HP] + E8M0 scales [M, KG1*16] in the A-scale
            layout (byte (4j + q)*4 + b of a row = K-block 4(4j + b) + q: one dword per lane per 4 K-steps).
2. sort     1 wave: counting sort of the M*k (token, slot) pairs by expert, stable in pair order: per 64-pair
            chunk, lanes with the same expert find each other with 7 ballots (rank = mbcnt), a per-expert
            counter in LDS advances by the group's popcount. Pass 1 counts, a DPP scan pads each expert to
            16 rows and places it, pass 2 writes sorted_pairs[row] = pair (-1 in padding rows) and
            tile_expert[tile]. Ids outside [0, E) (graph-padding garbage) are dropped. Same input, same output.
3. stage 1  grid (max_tiles, IP/32): 16 sorted rows x 32 intermediate columns (gate 32 + up 32 weight
            rows) of one expert; the K-steps are split over up to 4 waves in contiguous runs of 4 (so each
            B-scale dword is read once) and summed through LDS in wave order (fixed). Then + bias, the
            activation, MXFP8 quantization per row over the 32 columns (a 16-lane DPP max) -> inter
            (real rows only).
   split    (variant "moe.split", small M): grid (max_tiles, IP/32, S); workgroup s covers K-steps
            [s KPS, (s+1) KPS) and stores its fp32 16 x 64 partial (real rows); a reduce launch
            (max_tiles, IP/32) sums the S partials in order s = 0, 1, ... and runs the same epilogue.
4. stage 2  grid (max_tiles, h/64): one wave x 4 groups of 16 output columns (the A tile loaded once, real
            rows only), K = IP, + bias -> y fp32 [M*k, h] at row pair = token*k + slot (each element has one
            writer; padding rows load and store nothing).
5. combine  grid M: out[m] = sum over j = 0..k-1 of w[m, j] * y[m*k + j] in that order (fp32), -> bf16.
Tiles past the sorted count exit at once (max_tiles is a host bound; the real count is read on device).
No atomics anywhere (LDS counters are updated by one lane per expert per chunk, in program order).
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

from types import SimpleNamespace

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl._mlir import ir
from flydsl._mlir.dialects import math as mmath
from flydsl.expr import gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from amd_kernels.common import bf16, buffer, mfma, mxfp8, wave

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


def _fp8x2(a, b, inv_scale):
    """Two fp32 -> two E4M3 bytes (clamped to +-448 first, RNE) in the low 16 bits of an i32."""
    f32 = ir.F32Type.get()
    lo, hi = _f32(-mxfp8.E4M3_MAX), _f32(mxfp8.E4M3_MAX)
    ca = rocdl.fmed3(f32, _f32(a * inv_scale), lo, hi)
    cb = rocdl.fmed3(f32, _f32(b * inv_scale), lo, hi)
    return fx.Int32(rocdl.cvt_pk_fp8_f32(ir.IntegerType.get_signless(32), ca, cb, fx.Int32(0), False))


def _activation(kind, gate, up):
    if kind == "gptoss":
        g = fx.min(gate, fx.Float32(LIMIT))
        u = fx.max(fx.min(up, fx.Float32(LIMIT)), fx.Float32(-LIMIT))
        sig = 1.0 / (1.0 + _exp2(g * (-ALPHA * LOG2E)))
        return (u + 1.0) * g * sig
    return gate / (1.0 + _exp2(gate * (-LOG2E))) * up


def _scale_pos(kblock: int) -> int:
    """Byte of K-block `kblock` in a row of the A-scale layout."""
    ks, q = kblock // 4, kblock % 4
    return ((ks // 4) * 4 + q) * 4 + ks % 4


def build(hidden: int, ip: int, experts: int, top_k: int, activation: str, name: str, splits: int = 1):
    """The pipeline for one shape. splits > 1 adds a second variant for small token counts whose gate-up
    splits K over that many workgroups (fp32 partials summed in split order by a reduce launch)."""
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
    def epilogue(tot, e, tile, nblk, lane, m, sorted_pairs, w13_bias, inter_q, inter_s):
        """tot[g][reg] = the 16 x 64 gate/up sums of (tile, nblk) in the MFMA C layout: + bias, activation,
        MXFP8 per row over the block's 32 columns -> inter (real rows only: stage 2 never reads padding)."""
        r, q = lane % 16, lane // 16
        rows_b = _rows_bound(m, top_k, experts)
        sp_rsrc = buffer.tensor_resource(sorted_pairs, rows_b * 4)
        bias_rsrc = buffer.tensor_resource(w13_bias, experts * 2 * ip * 4)
        bias = [_dword(bias_rsrc, (e * (2 * ip) + nblk * 64 + g * 16 + r) * 4).bitcast(fx.Float32)
                for g in range_constexpr(4)]
        iq_rsrc = buffer.tensor_resource(inter_q, rows_b * ip)
        is_rsrc = buffer.tensor_resource(inter_s, rows_b * (kg2 * 16))
        for reg in range_constexpr(4):
            real = _dword(sp_rsrc, (tile * ROWS + q * 4 + reg) * 4) >= 0
            a0 = _activation(activation, tot[0][reg] + bias[0], tot[2][reg] + bias[2])
            a1 = _activation(activation, tot[1][reg] + bias[1], tot[3][reg] + bias[3])
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

    def part_offset(s_idx, tile, nblk, g, reg, lane, m):
        """Byte offset of a split-K partial: fp32 [S, rows, 2 IP], row = tile*16 + 4q + reg."""
        rows_b = _rows_bound(m, top_k, experts)
        row = tile * ROWS + (lane // 16) * 4 + reg
        return ((fx.Int32(s_idx) * rows_b.to(fx.Int32) + row) * (2 * ip) + nblk * 64 + g * 16 + lane % 16) * 4

    @fx.struct
    class S1Lds:
        part: fx.Array[fx.Float32, 4 * 4 * 4 * 64, 16]

    def make_stage1(splits: int, kname: str):
        kps = round_up(-(-ks1 // splits), 4)  # K-steps per workgroup (whole scale dwords)
        ksw = 4
        while -(-kps // ksw) > 4:
            ksw += 4
        waves = -(-kps // ksw)

        @flyc.kernel(name=kname, known_block_size=[waves * 64, 1, 1])
        def k_stage1(xq: fx.Tensor, xs: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                     meta: fx.Tensor, w13: fx.Tensor, w13_scale: fx.Tensor, w13_bias: fx.Tensor,
                     inter_q: fx.Tensor, inter_s: fx.Tensor, partial: fx.Tensor, m: fx.Int32):
            lds = fx.SharedAllocator().allocate(S1Lds).peek()
            part = lds.part.view(fx.make_layout(4 * 4 * 4 * 64, 1))
            lane, wv = wave.lane_and_wave(fx.thread_idx.x, waves)
            r, q = lane % 16, lane // 16
            tile = fx.block_idx.x
            nblk = fx.block_idx.y
            split = fx.block_idx.z
            meta_rsrc = buffer.tensor_resource(meta, 16)
            num_tiles = wave.uniform_i32(_dword(meta_rsrc, 0))
            if tile < num_tiles:
                rows_b = _rows_bound(m, top_k, experts)
                sp_rsrc = buffer.tensor_resource(sorted_pairs, rows_b * 4)
                e = wave.uniform_i32(_dword(buffer.tensor_resource(tile_expert, rows_b // ROWS * 4), tile * 4))
                pair = _dword(sp_rsrc, (tile * ROWS + r) * 4)
                token = pair // top_k
                a_rsrc = buffer.tensor_resource(xq, fx.Int64(m) * hp)
                as_rsrc = buffer.tensor_resource(xs, fx.Int64(m) * (kg1 * 16))
                a_row = (pair >= 0).select(token * hp + q * 16, buffer.never_in_range())
                as_row = (pair >= 0).select(token * (kg1 * 16) + q * 4, buffer.never_in_range())
                g0 = e * ng1 + nblk * 4
                b_rsrc = _sub_resource(w13, fx.Int64(g0) * (ks1 * 1024), 4 * ks1 * 1024)
                bs_rsrc = _sub_resource(w13_scale, fx.Int64(g0) * (kg1 * 256), 4 * kg1 * 256)
                accs = [mfma.zeros() for _ in range_constexpr(4)]
                ks0 = split * kps + wv * ksw
                for s4 in range_constexpr(ksw // 4):
                    j = ks0 // 4 + s4
                    sa = _dword(as_rsrc, as_row + j * 16)
                    sbs = [_dword(bs_rsrc, (g * kg1 + j) * 256 + lane * 4) for g in range_constexpr(4)]
                    for b in range_constexpr(4):
                        ks = ks0 + s4 * 4 + b
                        live = (ks < ks1) & (ks < (split + 1) * kps)
                        a_off = live.select(a_row + ks * KSTEP, buffer.never_in_range())
                        a_lo = buffer.load_x4(a_rsrc, a_off)
                        a_hi = buffer.load_x4(a_rsrc, a_off + 64)
                        a = a_lo.shuffle(a_hi, list(range(8)))
                        for g in range_constexpr(4):
                            b_off = live.select((g * ks1 + ks) * 1024 + lane * 16, buffer.never_in_range())
                            bv = buffer.load_x4(b_rsrc, b_off)
                            accs[g] = mfma.scale_fp8_fp4(a, bv, accs[g], sa, b, sbs[g], b)
                if waves > 1:
                    for g in range_constexpr(4):
                        for reg in range_constexpr(4):
                            fx.memref_store(accs[g][reg], part, ((wv * 4 + g) * 4 + reg) * 64 + lane)
                    gpu.barrier()
                if wv == 0:
                    # Sum the waves' partials in wave order (fixed).
                    tot = [[accs[g][reg] for reg in range_constexpr(4)] for g in range_constexpr(4)]
                    for w in range_constexpr(1, waves):
                        for g in range_constexpr(4):
                            for reg in range_constexpr(4):
                                tot[g][reg] = tot[g][reg] + fx.memref_load(part, ((w * 4 + g) * 4 + reg) * 64 + lane)
                    if splits == 1:
                        epilogue(tot, e, tile, nblk, lane, m, sorted_pairs, w13_bias, inter_q, inter_s)
                    else:
                        p_rsrc = buffer.tensor_resource(partial, rows_b * (splits * 2 * ip * 4))
                        for reg in range_constexpr(4):
                            real = _dword(sp_rsrc, (tile * ROWS + q * 4 + reg) * 4) >= 0
                            for g in range_constexpr(4):
                                off = real.select(part_offset(split, tile, nblk, g, reg, lane, m),
                                                  buffer.never_in_range())
                                buffer.store(tot[g][reg].bitcast(fx.Int32), p_rsrc, off)

        return k_stage1, waves

    k_stage1, w1 = make_stage1(1, f"{name}_gate_up")
    if splits > 1:
        k_stage1_split, w1_split = make_stage1(splits, f"{name}_gate_up_split{splits}")

        # ---- 3b. split-K reduce (fixed order s = 0, 1, ...) + the stage-1 epilogue ----
        @flyc.kernel(name=f"{name}_gate_up_reduce", known_block_size=[64, 1, 1])
        def k_reduce(sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor, w13_bias: fx.Tensor,
                     partial: fx.Tensor, inter_q: fx.Tensor, inter_s: fx.Tensor, m: fx.Int32):
            lane = fx.thread_idx.x % 64
            q = lane // 16
            tile = fx.block_idx.x
            nblk = fx.block_idx.y
            num_tiles = wave.uniform_i32(_dword(buffer.tensor_resource(meta, 16), 0))
            if tile < num_tiles:
                rows_b = _rows_bound(m, top_k, experts)
                sp_rsrc = buffer.tensor_resource(sorted_pairs, rows_b * 4)
                e = wave.uniform_i32(_dword(buffer.tensor_resource(tile_expert, rows_b // ROWS * 4), tile * 4))
                p_rsrc = buffer.tensor_resource(partial, rows_b * (splits * 2 * ip * 4))
                tot = [[None] * 4 for _ in range_constexpr(4)]
                for reg in range_constexpr(4):
                    real = _dword(sp_rsrc, (tile * ROWS + q * 4 + reg) * 4) >= 0
                    for g in range_constexpr(4):
                        for s_idx in range_constexpr(splits):
                            off = real.select(part_offset(s_idx, tile, nblk, g, reg, lane, m),
                                              buffer.never_in_range())
                            v = _dword(p_rsrc, off).bitcast(fx.Float32)
                            tot[g][reg] = v if s_idx == 0 else tot[g][reg] + v
                epilogue(tot, e, tile, nblk, lane, m, sorted_pairs, w13_bias, inter_q, inter_s)

    # ---- 4. stage 2: down + bias -> y[pair] ----
    # One wave per workgroup, 4 column groups of 16: the A tile is loaded once per workgroup, and only
    # its real rows (padding rows read nothing and are never stored).
    @flyc.kernel(name=f"{name}_down", known_block_size=[64, 1, 1])
    def k_stage2(inter_q: fx.Tensor, inter_s: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                 meta: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, y: fx.Tensor,
                 m: fx.Int32):
        lane = fx.thread_idx.x % 64
        r, q = lane % 16, lane // 16
        tile = fx.block_idx.x
        nblk = fx.block_idx.y
        num_tiles = wave.uniform_i32(_dword(buffer.tensor_resource(meta, 16), 0))
        if tile < num_tiles:
            rows_b = _rows_bound(m, top_k, experts)
            sp_rsrc = buffer.tensor_resource(sorted_pairs, rows_b * 4)
            e = wave.uniform_i32(_dword(buffer.tensor_resource(tile_expert, rows_b // ROWS * 4), tile * 4))
            a_rsrc = buffer.tensor_resource(inter_q, rows_b * ip)
            as_rsrc = buffer.tensor_resource(inter_s, rows_b * (kg2 * 16))
            real_a = _dword(sp_rsrc, (tile * ROWS + r) * 4) >= 0
            a_row = real_a.select((tile * ROWS + r) * ip + q * 16, buffer.never_in_range())
            as_row = real_a.select((tile * ROWS + r) * (kg2 * 16) + q * 4, buffer.never_in_range())
            g0 = e * ng2 + nblk * 4
            b_rsrc = _sub_resource(w2, fx.Int64(g0) * (ks2 * 1024), 4 * ks2 * 1024)
            bs_rsrc = _sub_resource(w2_scale, fx.Int64(g0) * (kg2 * 256), 4 * kg2 * 256)
            accs = [mfma.zeros() for _ in range_constexpr(4)]
            for j in range_constexpr(kg2):
                sa = _dword(as_rsrc, as_row + j * 16)
                sbs = [_dword(bs_rsrc, (g * kg2 + j) * 256 + lane * 4) for g in range_constexpr(4)]
                for b in range_constexpr(min(4, ks2 - 4 * j)):
                    ks = 4 * j + b
                    a = buffer.load_x4(a_rsrc, a_row + ks * KSTEP).shuffle(
                        buffer.load_x4(a_rsrc, a_row + ks * KSTEP + 64), list(range(8)))
                    for g in range_constexpr(4):
                        bv = buffer.load_x4(b_rsrc, (g * ks2 + ks) * 1024 + lane * 16)
                        accs[g] = mfma.scale_fp8_fp4(a, bv, accs[g], sa, b, sbs[g], b)
            bias_rsrc = buffer.tensor_resource(w2_bias, experts * hidden * 4)
            bias = [_dword(bias_rsrc, (e * hidden + nblk * 64 + g * 16 + r) * 4).bitcast(fx.Float32)
                    for g in range_constexpr(4)]
            y_rsrc = buffer.tensor_resource(y, fx.Int64(m) * (top_k * hidden * 4))
            for reg in range_constexpr(4):
                pair = _dword(sp_rsrc, (tile * ROWS + q * 4 + reg) * 4)
                base = (pair >= 0).select(pair * (hidden * 4) + nblk * 256 + r * 4, buffer.never_in_range())
                for g in range_constexpr(4):
                    buffer.store((accs[g][reg] + bias[g]).bitcast(fx.Int32), y_rsrc, base + g * 64)

    # ---- 5. fixed-order combine ----
    slots_c = -(-hidden // 512)

    @flyc.kernel(name=f"{name}_combine", known_block_size=[64, 1, 1])
    def k_combine(y: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor, out: fx.Tensor, m: fx.Int32):
        lane = fx.thread_idx.x % 64
        row = fx.block_idx.x
        w_rsrc = buffer.row_resource(topk_weights, row, top_k, 4)
        i_rsrc = buffer.row_resource(topk_ids, row, top_k, 4)
        o_rsrc = buffer.row_resource(out, row, hidden, 2)
        sums = [fx.Vector.filled(8, 0.0, fx.Float32) for _ in range_constexpr(slots_c)]
        for j in range_constexpr(top_k):
            wj = _dword(w_rsrc, j * 4).bitcast(fx.Float32)
            ej = _dword(i_rsrc, j * 4)
            ok = (ej >= 0) & (ej < experts)
            wj = ok.select(wj, fx.Float32(0.0))
            y_rsrc = buffer.row_resource(y, row * top_k + j, hidden, 4)
            for s in range_constexpr(slots_c):
                off = ok.select(lane * 32 + s * 2048, buffer.never_in_range())
                lo = buffer.load_x4(y_rsrc, off).bitcast(fx.Float32)
                hi = buffer.load_x4(y_rsrc, off + 16).bitcast(fx.Float32)
                sums[s] = sums[s] + lo.shuffle(hi, list(range(8))) * wj
        for s in range_constexpr(slots_c):
            buffer.store(bf16.pack(sums[s]), o_rsrc, lane * 16 + s * 1024)

    def launch_all(use_split, x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, xq, xs,
                   sorted_pairs, tile_expert, meta, inter_q, inter_s, partial, y, out, m, tiles, stream):
        k_quant(x, xq, xs, m).launch(grid=(m, 1, 1), block=(64, 1, 1), stream=stream)
        k_sort(topk_ids, sorted_pairs, tile_expert, meta, m).launch(grid=(1, 1, 1), block=(64, 1, 1), stream=stream)
        if use_split:
            k_stage1_split(xq, xs, sorted_pairs, tile_expert, meta, w13, w13_scale, w13_bias, inter_q, inter_s,
                           partial, m).launch(grid=(tiles, nb1, splits), block=(w1_split * 64, 1, 1), stream=stream)
            k_reduce(sorted_pairs, tile_expert, meta, w13_bias, partial, inter_q, inter_s, m).launch(
                grid=(tiles, nb1, 1), block=(64, 1, 1), stream=stream)
        else:
            k_stage1(xq, xs, sorted_pairs, tile_expert, meta, w13, w13_scale, w13_bias, inter_q, inter_s, partial,
                     m).launch(grid=(tiles, nb1, 1), block=(w1 * 64, 1, 1), stream=stream)
        k_stage2(inter_q, inter_s, sorted_pairs, tile_expert, meta, w2, w2_scale, w2_bias, y, m).launch(
            grid=(tiles, nb2, 1), block=(64, 1, 1), stream=stream)
        k_combine(y, topk_weights, topk_ids, out, m).launch(grid=(m, 1, 1), block=(64, 1, 1), stream=stream)

    @flyc.jit
    def moe(x: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor, w13: fx.Tensor, w13_scale: fx.Tensor,
            w13_bias: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, xq: fx.Tensor,
            xs: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor, inter_q: fx.Tensor,
            inter_s: fx.Tensor, partial: fx.Tensor, y: fx.Tensor, out: fx.Tensor, m: fx.Int32, tiles: fx.Int32,
            stream: fx.Stream = fx.Stream(None)):
        launch_all(False, x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, xq, xs,
                   sorted_pairs, tile_expert, meta, inter_q, inter_s, partial, y, out, m, tiles, stream)

    if splits > 1:
        @flyc.jit
        def moe_split(x: fx.Tensor, topk_weights: fx.Tensor, topk_ids: fx.Tensor, w13: fx.Tensor,
                      w13_scale: fx.Tensor, w13_bias: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor,
                      w2_bias: fx.Tensor, xq: fx.Tensor, xs: fx.Tensor, sorted_pairs: fx.Tensor,
                      tile_expert: fx.Tensor, meta: fx.Tensor, inter_q: fx.Tensor, inter_s: fx.Tensor,
                      partial: fx.Tensor, y: fx.Tensor, out: fx.Tensor, m: fx.Int32, tiles: fx.Int32,
                      stream: fx.Stream = fx.Stream(None)):
            launch_all(True, x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, xq, xs,
                       sorted_pairs, tile_expert, meta, inter_q, inter_s, partial, y, out, m, tiles, stream)

    launchers = {"moe.full": moe}
    if splits > 1:
        launchers["moe.split"] = moe_split

    layout = dict(hp=hp, ks1=ks1, ks2=ks2, kg1=kg1, kg2=kg2, ng1=ng1, ng2=ng2, nb1=nb1, nb2=nb2, w1=w1,
                  splits=splits)

    def variant_for(m: int) -> str:
        """The split-K variant while the plain gate-up would launch fewer than 256 workgroups."""
        return "moe.split" if splits > 1 and max_tiles(m * top_k, experts) * nb1 < 256 else "moe.full"

    def workspace(m: int, key: str, device="cpu"):
        pairs = m * top_k
        tiles = max(1, max_tiles(pairs, experts))
        rows = tiles * ROWS
        u8 = dict(dtype=torch.uint8, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        part = splits * rows * 2 * ip if key == "moe.split" else 1
        return dict(xq=torch.empty(m, hp, **u8), xs=torch.empty(m, kg1 * 16, **u8),
                    sorted_pairs=torch.empty(rows, **i32), tile_expert=torch.empty(tiles, **i32),
                    meta=torch.zeros(4, **i32), inter_q=torch.empty(rows, ip, **u8),
                    inter_s=torch.empty(rows, kg2 * 16, **u8),
                    partial=torch.empty(part, dtype=torch.float32, device=device),
                    y=torch.empty(max(pairs, 1), hidden, dtype=torch.float32, device=device)), tiles

    def weight_shapes():
        return dict(w13=(experts, ng1, ks1, 64, 16), w13_scale=(experts, ng1, kg1, 64, 4),
                    w13_bias=(experts, 2 * ip), w2=(experts, ng2, ks2, 64, 16),
                    w2_scale=(experts, ng2, kg2, 64, 4), w2_bias=(experts, hidden))

    def launch_args(key, x, topk_weights, topk_ids, w, out, device="cpu"):
        """The launcher's positional arguments (without the stream) for variant `key`."""
        m = x.shape[0]
        ws, tiles = workspace(m, key, device)
        return (x, topk_weights, topk_ids, w["w13"], w["w13_scale"], w["w13_bias"], w["w2"], w["w2_scale"],
                w["w2_bias"], ws["xq"], ws["xs"], ws["sorted_pairs"], ws["tile_expert"], ws["meta"], ws["inter_q"],
                ws["inter_s"], ws["partial"], ws["y"], out, m, tiles)

    def example_args_of(key):
        def example_args(m: int = 1):
            shapes = weight_shapes()
            w = {k: torch.zeros(s, dtype=torch.float32 if k.endswith("bias") else torch.uint8)
                 for k, s in shapes.items()}
            return launch_args(key, torch.zeros(m, hidden, dtype=torch.bfloat16), torch.zeros(m, top_k),
                               torch.zeros(m, top_k, dtype=torch.int32), w, torch.zeros(m, hidden, dtype=torch.bfloat16))
        return example_args

    # Tensor positions of (sorted_pairs, meta) among each tile launch's arguments.
    tile_launches = {f"{name}_gate_up": (2, 4), f"{name}_gate_up_split{splits}": (2, 4),
                     f"{name}_gate_up_reduce": (0, 2), f"{name}_down": (2, 4)}

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
                           variant_for=variant_for, launch_args=launch_args, weight_shapes=weight_shapes,
                           layout=layout, emulator_workgroups=emulator_workgroups)
