"""Launch 4 of 4: out[m] = sum over j = 0..k-1 of y[m*k + j] in that order (fp32), rounded to bf16 once.

grid M, one wave per token. Why a y round trip (2 M k h bytes): a token's k pairs sit in k different
expert tiles, and without atomics their sum needs either these rows or one owner per output column walking
every tile in turn (a serial chain of weight loads per workgroup: latency-bound on an MI355X)."""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr

from amd_kernels.common import bf16, buffer
from amd_kernels.moe.mxfp4_moe.common import dword


def make(geo):
    hidden, experts, top_k = geo.hidden, geo.experts, geo.top_k
    slots_c = -(-hidden // 512)

    @flyc.kernel(name=f"{geo.name}_combine", known_block_size=[64, 1, 1])
    def k_combine(y: fx.Tensor, topk_ids: fx.Tensor, out: fx.Tensor, m: fx.Int32):
        lane = fx.thread_idx.x % 64
        row = fx.block_idx.x
        i_rsrc = buffer.row_resource(topk_ids, row, top_k, 4)
        o_rsrc = buffer.row_resource(out, row, hidden, 2)
        sums = [fx.Vector.filled(8, 0.0, fx.Float32) for _ in range_constexpr(slots_c)]
        for j in range_constexpr(top_k):
            ej = dword(i_rsrc, j * 4)
            ok = (ej >= 0) & (ej < experts)  # a dropped pair (garbage id) has no y row: not read
            y_rsrc = buffer.row_resource(y, row * top_k + j, hidden, 2)
            for s in range_constexpr(slots_c):
                sums[s] = sums[s] + bf16.unpack(
                    buffer.load_x4(y_rsrc, ok.select(lane * 16 + s * 1024, buffer.never_in_range())))
        for s in range_constexpr(slots_c):
            buffer.store(bf16.pack(sums[s]), o_rsrc, lane * 16 + s * 1024)

    return k_combine
