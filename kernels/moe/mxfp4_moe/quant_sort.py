"""Launch 1 of 4: the activation quantization and the sort, independent of each other, in one launch
(one fewer launch gap at decode): workgroups 0 .. M-1 quantize a row each, workgroup M sorts.

quant (one wave per row): x bf16 [M, h] -> xq E4M3 [M, HP] + E8M0 scales [M, KG1*16] in the A-scale layout.
sort (one wave): counting sort of the M*k (token, slot) pairs by expert into 16-row tiles, stable in pair
order: per 64-pair chunk, lanes with the same expert find each other with 7 ballots (rank = mbcnt), a
per-expert counter in LDS advances by the group's popcount. Pass 1 counts, a DPP scan pads each expert to
16 rows and places it, pass 2 writes sorted_pairs[row] = pair (-1 in padding rows) and tile_expert[tile],
and meta[0] = the tile count. Ids outside [0, E) (graph-padding garbage) are dropped."""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr import range_constexpr

from amd_kernels.common import bf16, buffer, mxfp8, wave
from amd_kernels.moe.mxfp4_moe.common import ballot, dword, mbcnt, popc64, scale_pos, wave_inclusive_scan
from amd_kernels.moe.mxfp4_moe.geometry import ROWS, prefill_suffix, super_pack


def sort_lds(geo):
    """The sort's LDS struct: a counter and an offset per expert."""
    experts = geo.experts

    @fx.struct
    class SortLds:
        count: fx.Array[fx.Int32, experts, 16]
        offs: fx.Array[fx.Int32, experts, 16]

    return SortLds


def make(geo, supers: int = 0):
    """grid M + 1. supers > 0 (the prefill tier's sort, prefill.py): also the super-tile table in meta."""
    SortLds = sort_lds(geo)

    @flyc.kernel(name=f"{geo.name}_quant_sort" + (prefill_suffix(supers) if supers else ""),
                 known_block_size=[64, 1, 1])
    def k_quant_sort(x: fx.Tensor, xq: fx.Tensor, xs: fx.Tensor, ids: fx.Tensor, sorted_pairs: fx.Tensor,
                     tile_expert: fx.Tensor, meta: fx.Tensor, m: fx.Int32):
        lds = fx.SharedAllocator().allocate(SortLds).peek()
        lane = fx.thread_idx.x % 64
        row = fx.block_idx.x
        if row < m:
            quant_row(geo, lane, row, x, xq, xs)
        if row == m:
            sort(geo, lane, lds, ids, sorted_pairs, tile_expert, meta, m, supers)

    return k_quant_sort


def quant_row(geo, lane, row, x, xq, xs):
    """One wave: x row `row` bf16 -> xq E4M3 + its E8M0 scales in the A-scale layout (straight-line code:
    called inside the kernels' `if`)."""
    hidden, hp, kg1 = geo.hidden, geo.hp, geo.kg1
    slots_q = -(-hp // 512)
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
        pos = scale_pos(kblock // 4, kblock)
        # K-blocks past HP (absent K-steps of the last scale dword) get byte 0: gate-up loads whole dwords.
        ok = ((lane % 4) == 0) & (kblock < kg1 * 16)
        buffer.store_byte(byte, s_rsrc, ok.select(pos, buffer.never_in_range()))


def sort(geo, lane, lds, ids, sorted_pairs, tile_expert, meta, m, supers: int = 0):
    """One wave: the counting sort of the m*k pairs of `ids` (above); `lds` a sort_lds(geo) view."""
    experts, top_k = geo.experts, geo.top_k
    cnt = lds.count.view(fx.make_layout(experts, 1))
    offs = lds.offs.view(fx.make_layout(experts, 1))
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
        e = dword(ids_rsrc, p * 4)
        valid = (p < pairs) & (e >= 0) & (e < experts)
        match = ballot(valid)
        for bit in range_constexpr(7):
            bb = ballot(((e >> bit) & 1) != 0)
            match = match & (((e >> bit) & 1) != 0).select(bb, ~bb)
        return p, e, valid, match

    for c in range(chunks):
        p, e, valid, match = chunk_info(c)
        if valid & (mbcnt(match) == 0):
            fx.memref_store(fx.memref_load(cnt, e) + popc64(match), cnt, e)

    c0 = fx.memref_load(cnt, 2 * lane)
    c1 = fx.memref_load(cnt, 2 * lane + 1)
    pad0 = (c0 + (ROWS - 1)) & (-ROWS)
    pad1 = (c1 + (ROWS - 1)) & (-ROWS)
    s = pad0 + pad1
    incl = wave_inclusive_scan(s)
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
    if supers:
        # The prefill tier's super-tiles (up to `supers` consecutive tiles of one expert, experts in
        # order): meta[1] = their count, meta[4 + s] = first tile * pack + tiles of super-tile s.
        pack = super_pack(supers)
        n0, n1 = pad0 // ROWS, pad1 // ROWS
        u0, u1 = (n0 + (supers - 1)) // supers, (n1 + (supers - 1)) // supers
        s_incl = wave_inclusive_scan(u0 + u1)
        s0 = s_incl - (u0 + u1)
        sup_rsrc = buffer.tensor_resource(  # bound: prefill.max_supers
            meta, fx.Int64(pairs // (ROWS * supers) + fx.min(pairs, fx.Int32(experts)) + 4) * 4)
        # Read lane 63 here, with every lane active: inside the lane-0 branch LLVM may sink the scan's last
        # add into the branch (it did under lsr-drop-solution=false), leaving lane 63 a partial sum.
        n_supers = wave.readlane(s_incl, 63)
        if lane == 0:
            buffer.store(n_supers, sup_rsrc, fx.Int32(4))
        for i in range(u0):
            buffer.store((start0 // ROWS + i * supers) * pack + fx.min(n0 - i * supers, fx.Int32(supers)),
                         sup_rsrc, (s0 + i + 4) * 4)
        for i in range(u1):
            buffer.store((start1 // ROWS + i * supers) * pack + fx.min(n1 - i * supers, fx.Int32(supers)),
                         sup_rsrc, (s0 + u0 + i + 4) * 4)
    for i in range(c0, pad0):
        buffer.store(fx.Int32(-1), sp_rsrc, (start0 + i) * 4)
    for i in range(c1, pad1):
        buffer.store(fx.Int32(-1), sp_rsrc, (start1 + i) * 4)

    for c in range(chunks):
        p, e, valid, match = chunk_info(c)
        if valid:
            base = fx.memref_load(offs, e)
            buffer.store(p, sp_rsrc, (base + mbcnt(match)) * 4)
            if mbcnt(match) == 0:
                fx.memref_store(base + popc64(match), offs, e)


# A helper's dynamic `if` and `for` need FlyDSL's AST rewrite, which @flyc.kernel applies only to the kernel body.
sort = ASTRewriter.transform(sort)
