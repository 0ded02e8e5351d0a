"""Launch 3 of 4: down + bias, times the pair's routing weight -> y bf16 [M*k, h] at row pair = token*k + slot.

grid (max_tiles, h/64): one wave x 4 groups of 16 output columns, K = IP; the A tile is loaded once and only
for real rows; each y element has one writer, and padding rows load and store nothing. Lane q's B vector is
the 32-column K-block 4 ks + q: a padded block (a rank's dead columns) is zero and not loaded.

`make(geo, combine=True)` gives the same tile with launch 4 folded in (the routed entry's pipeline): after its
y stores, lane l of a workgroup takes a ticket (one integer atomic add, acquire-release, agent scope) for
quarter l % 4 of the 64 columns of the token of tile row l // 4; the lane that draws the token's last ticket
(its valid slots - 1) sums that token's k y rows over those 16 columns in slot order j = 0..k-1 in fp32,
exactly as combine.py does, and stores out. Which workgroup arrives last decides who sums, never the order
of the sum: the bits are combine.py's."""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr
from flydsl.expr.llvm import atomic_add

from amd_kernels.common import bf16, buffer, mfma
from amd_kernels.moe.mxfp4_moe.common import bf16_bits, dword, num_tiles, sub_resource, tile_prologue
from amd_kernels.moe.mxfp4_moe.geometry import KSTEP, ROWS


def make(geo, combine: bool = False):
    hidden, ip, experts, top_k, biases = geo.hidden, geo.ip, geo.experts, geo.top_k, geo.biases
    ks2, kg2, ng2, nb2 = geo.ks2, geo.kg2, geo.ng2, geo.nb2

    def tile_y(lane, tile, nblk, inter_q, inter_s, sorted_pairs, tile_expert, w2, w2_scale, w2_bias, shard,
               topk_weights, y, m):
        """The tile's y stores (straight-line code: called inside the kernels' `if`). Returns the tile view."""
        r, q = lane % 16, lane // 16
        t = tile_prologue(geo, sorted_pairs, tile_expert, shard, tile, m)
        e = t.e
        a_rsrc = buffer.tensor_resource(inter_q, t.rows_b * ip)
        as_rsrc = buffer.tensor_resource(inter_s, t.rows_b * (kg2 * 16))
        real_a = dword(t.sp_rsrc, (tile * ROWS + r) * 4) >= 0
        a_row = real_a.select((tile * ROWS + r) * ip + q * 16, buffer.never_in_range())
        as_row = real_a.select((tile * ROWS + r) * (kg2 * 16) + q * 4, buffer.never_in_range())
        b_rsrc = sub_resource(w2, fx.Int64(e * ng2 + nblk * 4) * (ks2 * 1024), 4 * ks2 * 1024)
        bs_rsrc = sub_resource(w2_scale, fx.Int64(e * ng2 + nblk * 4) * (kg2 * 256), 4 * kg2 * 256)
        accs = [mfma.zeros() for _ in range_constexpr(4)]
        for j in range_constexpr(kg2):
            sa = dword(as_rsrc, as_row + j * 16)
            sbs = [dword(bs_rsrc, (g * kg2 + j) * 256 + lane * 4) for g in range_constexpr(4)]
            for b in range_constexpr(min(4, ks2 - 4 * j)):
                ks = 4 * j + b
                a = buffer.load_x4(a_rsrc, a_row + ks * KSTEP).shuffle(
                    buffer.load_x4(a_rsrc, a_row + ks * KSTEP + 64), list(range(8)))
                k0 = ks * KSTEP + q * 32
                k_live = (k0 + 32 > t.live_lo) & (k0 < t.live_hi)
                for g in range_constexpr(4):
                    bv = buffer.load_x4(b_rsrc, k_live.select((g * ks2 + ks) * 1024 + lane * 16,
                                                              buffer.never_in_range()))
                    accs[g] = mfma.scale_fp8_fp4(a, bv, accs[g], sa, b, sbs[g], ks % 4)
        bias = None
        if biases:
            bias_rsrc = buffer.tensor_resource(w2_bias, experts * hidden * 4)
            bias_on = dword(t.sh_rsrc, 8) != 0  # zero bias (TP ranks > 0): not read
            bias = [dword(bias_rsrc, bias_on.select((e * hidden + nblk * 64 + g * 16 + r) * 4,
                                                    buffer.never_in_range())).bitcast(fx.Float32)
                    for g in range_constexpr(4)]
        tw_rsrc = buffer.tensor_resource(topk_weights, fx.Int64(m) * (top_k * 4))
        y_rsrc = buffer.tensor_resource(y, fx.Int64(m) * (top_k * hidden * 2))
        for reg in range_constexpr(4):
            pair = dword(t.sp_rsrc, (tile * ROWS + q * 4 + reg) * 4)
            real = pair >= 0
            w = dword(tw_rsrc, real.select(pair * 4, buffer.never_in_range())).bitcast(fx.Float32)
            base = real.select(pair * (hidden * 2) + nblk * 128 + r * 2, buffer.never_in_range())
            for g in range_constexpr(4):
                v = accs[g][reg] + bias[g] if biases else accs[g][reg]
                buffer.store(bf16_bits(v * w), y_rsrc, base + g * 32)
        return t

    if not combine:
        @flyc.kernel(name=f"{geo.name}_down", known_block_size=[64, 1, 1])
        def k_stage2(inter_q: fx.Tensor, inter_s: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                     meta: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, shard: fx.Tensor,
                     topk_weights: fx.Tensor, y: fx.Tensor, m: fx.Int32):
            lane = fx.thread_idx.x % 64
            tile = fx.block_idx.x
            nblk = fx.block_idx.y
            if tile < num_tiles(meta):
                tile_y(lane, tile, nblk, inter_q, inter_s, sorted_pairs, tile_expert, w2, w2_scale, w2_bias, shard,
                       topk_weights, y, m)

        return k_stage2

    @flyc.kernel(name=f"{geo.name}_down_combine", known_block_size=[64, 1, 1])
    def k_down_combine(inter_q: fx.Tensor, inter_s: fx.Tensor, sorted_pairs: fx.Tensor, tile_expert: fx.Tensor,
                       meta: fx.Tensor, w2: fx.Tensor, w2_scale: fx.Tensor, w2_bias: fx.Tensor, shard: fx.Tensor,
                       topk_weights: fx.Tensor, y: fx.Tensor, topk_ids: fx.Tensor, tickets: fx.Tensor,
                       out: fx.Tensor, m: fx.Int32):
        lane = fx.thread_idx.x % 64
        tile = fx.block_idx.x
        nblk = fx.block_idx.y
        if tile < num_tiles(meta):
            t = tile_y(lane, tile, nblk, inter_q, inter_s, sorted_pairs, tile_expert, w2, w2_scale, w2_bias, shard,
                       topk_weights, y, m)
            # lane l: tile row l // 4, columns nblk*64 + (l % 4)*16 .. +16 of its token
            pair = dword(t.sp_rsrc, (tile * ROWS + lane // 4) * 4)
            real = pair >= 0
            token = real.select(pair // top_k, fx.Int32(0))
            ids_rsrc = buffer.tensor_resource(topk_ids, fx.Int64(m) * (top_k * 4))
            valid = []
            for j in range_constexpr(top_k):
                ej = dword(ids_rsrc, real.select((token * top_k + j) * 4, buffer.never_in_range()))
                valid.append((ej >= 0) & (ej < experts))
            n_valid = fx.Int32(0)
            for j in range_constexpr(top_k):
                n_valid = n_valid + valid[j].select(fx.Int32(1), fx.Int32(0))
            last = fx.Int32(-1)
            if real:
                # release: this wave's y stores before the ticket; acquire: the other writers' before the sum
                slot = fx.add_offset(fx.get_iter(tickets), fx.Int64((token * nb2 + nblk) * 4 + lane % 4))
                last = atomic_add(slot, fx.Int32(1), syncscope="agent", ordering=fx.AtomicOrdering.AcqRel)
            if real & (last == n_valid - 1):
                col = nblk * 128 + (lane % 4) * 32
                y_rsrc = buffer.tensor_resource(y, fx.Int64(m) * (top_k * hidden * 2))
                o_rsrc = buffer.row_resource(out, token, hidden, 2)
                sums = [fx.Vector.filled(8, 0.0, fx.Float32) for _ in range_constexpr(2)]
                for j in range_constexpr(top_k):
                    row = (token * top_k + j) * (hidden * 2)
                    for s in range_constexpr(2):
                        off = valid[j].select(row + col + s * 16, buffer.never_in_range())
                        sums[s] = sums[s] + bf16.unpack(buffer.load_x4(y_rsrc, off))
                for s in range_constexpr(2):
                    buffer.store(bf16.pack(sums[s]), o_rsrc, col + s * 16)

    return k_down_combine
