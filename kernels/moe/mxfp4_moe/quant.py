"""Stage 1 of 5: x bf16 [M, h] -> xq E4M3 [M, HP] + E8M0 scales [M, KG1*16] in the A-scale layout."""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr

from amd_kernels.common import bf16, buffer, mxfp8
from amd_kernels.moe.mxfp4_moe.common import scale_pos


def make(geo):
    """grid M, one wave per row."""
    hidden, hp, kg1 = geo.hidden, geo.hp, geo.kg1
    slots_q = -(-hp // 512)

    @flyc.kernel(name=f"{geo.name}_quant", known_block_size=[64, 1, 1])
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
            pos = scale_pos(kblock // 4, kblock)
            # K-blocks past HP (absent K-steps of the last scale dword) get byte 0: stage 1 loads whole dwords.
            ok = ((lane % 4) == 0) & (kblock < kg1 * 16)
            buffer.store_byte(byte, s_rsrc, ok.select(pos, buffer.never_in_range()))

    return k_quant
