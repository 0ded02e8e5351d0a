"""Launch 1 of the routed entry's launches (fused.py: 3 at decode sizes, 4 in the prefill tier): the router,
the activation quantization and the sort in one launch, 64 threads (one wave) per workgroup, grid
ceil(M/16) * E/16 + M. The prefill tier's copy (make(geo, supers)) also writes the super-tile table, as that
tier's own sort launch does (quant_sort.sort with supers).

- Router workgroups 0 .. ceil(M/16) * E/16 - 1: workgroup (tile t, expert block b) computes the logits of
  tokens 16t .. 16t+15 for experts 16b .. 16b+15, the whole K = hidden in one v_mfma_f32_16x16x32_bf16 chain
  in K order: the very chain of route.py's kernel for those experts (the router splits over experts, never
  over K), so every logit, key, id and weight has route.py's bits. It stores the 16x16 keys (route.py's
  sortable image: bf16 logit with bias, then 255 - expert) to the workspace `keys` [16 ceil(M/16), E], then
  takes the tile's ticket. The workgroup drawing the tile's last ticket (E/16 - 1) reads the tile's keys and
  does route.py's top-k and softmax (route.topk_softmax), stores topk_weights / topk_ids of the tile's real
  rows, then takes the global ticket; the one drawing the last of those (ceil(M/16) - 1) runs the counting
  sort of all M*k pairs (quant_sort.sort). Which workgroup arrives last decides who does the work, never
  what it computes: every value is formed in one fixed order.
- Workgroups ceil(M/16) * E/16 + r (r < M) quantize x row r (quant_sort.quant_row), independent of routing.

The split is E/16 workgroups per 16-token tile for every M (batch invariance: a row's bits never depend on M).
Memory order: the tickets are integer atomic adds, acquire-release at agent scope (down.py's combine does the
same): the release makes the wave's key (or top-k) stores visible before its ticket, the acquire makes every
earlier writer's visible to the last one's loads. Tickets are the only atomics; `tickets` [ceil(M/16) + 1]
must be zero at the launch (fused.py zeroes it with the sort's meta and down's tickets, one memset).
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr.llvm import atomic_add

from amd_kernels.common import buffer, mfma, wave
from amd_kernels.moe import route
from amd_kernels.moe.mxfp4_moe import quant_sort
from amd_kernels.moe.mxfp4_moe.common import dword
from amd_kernels.moe.mxfp4_moe.geometry import prefill_suffix

TILE_M = route.TILE_M  # token rows per router tile
EBLK = 16  # experts per router workgroup: one 16x16 MFMA tile
K_GROUP = 10  # K-steps whose loads are issued together (double-buffered)


def router_workgroups(m, experts: int):
    """Router workgroups at m tokens (device or host int): E/16 per 16-token tile."""
    return (m + (TILE_M - 1)) // TILE_M * (experts // EBLK)


def _ticket(tickets, index):
    """Lane 0 draws the ticket at tickets[index] (acquire-release, agent scope); every lane gets its number."""
    drawn = fx.Int32(-1)
    if fx.thread_idx.x == 0:
        slot = fx.add_offset(fx.get_iter(tickets), fx.Int64(index))
        drawn = atomic_add(slot, fx.Int32(1), syncscope="agent", ordering=fx.AtomicOrdering.AcqRel)
    return wave.readlane(drawn, 0)


# A helper's dynamic `if` needs FlyDSL's AST rewrite, which @flyc.kernel applies only to the kernel body.
_ticket = ASTRewriter.transform(_ticket)


def routable(geo) -> bool:
    """Can this launch route the shape: K in 32-column MFMA steps, whole 16-expert blocks, top_k <= 8?"""
    return geo.hidden % 32 == 0 and geo.experts % EBLK == 0 and geo.top_k <= 8


def make(geo, supers: int = 0):
    """supers > 0 (the routed entry's prefill tier, fused.py): the sort also writes the super-tile table."""
    hidden, experts, top_k = geo.hidden, geo.experts, geo.top_k
    if not routable(geo):
        raise ValueError(f"router: hidden {hidden} (multiple of 32), experts {experts} (of 16), top_k {top_k} "
                         f"(<= 8)")
    nblk = experts // EBLK
    ksteps = hidden // 32
    row_bytes = hidden * 2
    per_lane = experts // 16  # keys per lane in the top-k phase (one token per 16-lane row)
    SortLds = quant_sort.sort_lds(geo)

    @flyc.kernel(name=f"{geo.name}_route_quant_sort" + (prefill_suffix(supers) if supers else ""),
                 known_block_size=[64, 1, 1])
    def k_route_quant_sort(x: fx.Tensor, w: fx.Tensor, b: fx.Tensor, topk_weights: fx.Tensor,
                           topk_ids: fx.Tensor, keys: fx.Tensor, tickets: fx.Tensor, xq: fx.Tensor,
                           xs: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor, meta: fx.Tensor,
                           m: fx.Int32):
        lds = fx.SharedAllocator().allocate(SortLds).peek()
        lane = fx.thread_idx.x % 64
        wg = fx.block_idx.x
        tiles = (m + (TILE_M - 1)) // TILE_M
        routers = tiles * nblk
        if wg < routers:
            r, q = lane % 16, lane // 16
            tile, eb = wg // nblk, wg % nblk
            x_rsrc = buffer.tensor_resource(x, fx.Int64(m) * row_bytes)  # rows past M read zeros
            w_rsrc = buffer.tensor_resource(w, experts * row_bytes)
            a_off = (tile * TILE_M + r) * row_bytes + q * 16
            b_off = (eb * EBLK + r) * row_bytes + q * 16
            acc = mfma.zeros()

            def load_group(g):
                loads = []
                for s in range_constexpr(min(K_GROUP, ksteps - g * K_GROUP)):
                    kb = (g * K_GROUP + s) * 64
                    loads.append((buffer.load_x4(x_rsrc, a_off + kb), buffer.load_x4(w_rsrc, b_off + kb)))
                return loads

            groups = (ksteps + K_GROUP - 1) // K_GROUP
            pending = load_group(0)
            for g in range_constexpr(groups):
                nxt = load_group(g + 1) if g + 1 < groups else None
                buffer.keep_issued_above()
                for a, bv in pending:
                    acc = mfma.bf16_16x16x32(a, bv, acc)
                pending = nxt

            e = eb * EBLK + r
            bias = route.load_bias(buffer.tensor_resource(b, experts * 2), e)
            k_rsrc = buffer.tensor_resource(keys, fx.Int64(tiles) * (TILE_M * experts * 4))
            for reg in range_constexpr(4):
                buffer.store(route.logit_key(acc[reg], bias, e), k_rsrc,
                             ((tile * TILE_M + q * 4 + reg) * experts + e) * 4)
            if _ticket(tickets, tile) == nblk - 1:
                # The tile's last router workgroup: top-k and softmax of its 16 tokens, 4 per pass (route.py's).
                out_bytes = fx.Int64(m) * (top_k * 4)
                ow = buffer.tensor_resource(topk_weights, out_bytes)
                oi = buffer.tensor_resource(topk_ids, out_bytes)
                for p in range_constexpr(TILE_M // 4):
                    if tile * TILE_M + p * 4 < m:  # passes of padding rows only are skipped (the tail's path)
                        token = tile * TILE_M + p * 4 + q
                        kv = [dword(k_rsrc, (token * experts + r * per_lane + i) * 4)
                              for i in range_constexpr(per_lane)]
                        best, exps, inv = route.topk_softmax(kv, top_k)
                        base = (r == 0).select(token * (top_k * 4), buffer.never_in_range())  # rows >= M: not stored
                        for j in range_constexpr(top_k):
                            buffer.store((exps[j] * inv).bitcast(fx.Int32), ow, base + j * 4)
                            buffer.store(255 - (best[j] & 0xFF), oi, base + j * 4)
                if _ticket(tickets, tiles) == tiles - 1:
                    quant_sort.sort(geo, lane, lds, topk_ids, sorted_pairs, tile_expert, meta, m, supers)
        else:
            quant_sort.quant_row(geo, lane, wg - routers, x, xq, xs)

    return k_route_quant_sort
