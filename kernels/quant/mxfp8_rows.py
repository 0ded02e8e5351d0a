"""bf16 [M, K] -> MXFP8 (q float8_e4m3fn [M, K], scales uint8 [M, K/32] row-major), one wave per row.

Shared by the packages quant/mxfp8_k<K>; the contract is references/gemm.py (mxfp8_quant), the rule
references/mx.py (the same E8M0 rule as the RMSNorm-quant kernels, via amd_kernels.common.mxfp8).

A row is K/8 16-byte vectors; lane l loads vectors l, l + 64, ... (`buffer_load_dwordx4`, the wave reading
1 KiB contiguous per slot). A 32-element block is 4 consecutive lanes (an aligned DPP quad): amax over the
lane's 8 values, two quad-permute steps, then each lane converts its 8 values and stores 8 bytes of q; the
quad's first lane stores the E8M0 byte. Descriptors are bounded to the row, so lanes past the row's end
read zeros and store nothing. Tiers: "decode" (1-wave workgroups, grid = M) and "prefill" (4 waves, one row
each, grid = ceil(M/4)).
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import range_constexpr

from amd_kernels.common import bf16, buffer, mxfp8, wave

TIER_WAVES = {"decode": 1, "prefill": 4}


def build(K: int, tier: str):
    assert K % (8 * mxfp8.LANES_PER_BLOCK) == 0
    waves = TIER_WAVES[tier]
    threads = waves * wave.WAVE
    vecs = K // 8
    slots = -(-vecs // wave.WAVE)
    KB = K // mxfp8.BLOCK

    @flyc.kernel(name=f"mxfp8_quant_k{K}_{tier}", known_block_size=[threads, 1, 1])
    def k_quant(x: fx.Tensor, q: fx.Tensor, s: fx.Tensor, m: fx.Int32):
        lane, w = wave.lane_and_wave(fx.thread_idx.x, waves)
        row = fx.block_idx.x * waves + w
        if row < m:
            x_rsrc = buffer.row_resource(x, row, K, 2)
            q_rsrc = buffer.row_resource(q, row, K, 1)
            s_rsrc = buffer.row_resource(s, row, KB, 1)
            xs = [buffer.load_x4(x_rsrc, (lane + j * wave.WAVE) * 16) for j in range_constexpr(slots)]
            leader = (lane % mxfp8.LANES_PER_BLOCK) == 0
            for j in range_constexpr(slots):
                y = bf16.unpack(xs[j])
                byte, inv_scale = mxfp8.block_scale(y)
                buffer.store(mxfp8.e4m3x8(y, inv_scale, nan=True), q_rsrc, (lane + j * wave.WAVE) * 8)
                s_off = leader.select(j * (wave.WAVE // mxfp8.LANES_PER_BLOCK) + lane // mxfp8.LANES_PER_BLOCK,
                                      buffer.never_in_range())
                buffer.store_byte(byte, s_rsrc, s_off)

    @flyc.jit
    def quant(x: fx.Tensor, q: fx.Tensor, scales: fx.Tensor, m: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        k_quant(x, q, scales, m).launch(grid=((m + (waves - 1)) // waves, 1, 1), block=(threads, 1, 1),
                                        stream=stream)

    def example(m: int = 1):
        return (torch.zeros(m, K, dtype=torch.bfloat16), torch.zeros(m, K, dtype=torch.float8_e4m3fn),
                torch.zeros(m, KB, dtype=torch.uint8), m, fx.Stream(None))

    return quant, example


def variants(K: int) -> dict:
    return {tier: build(K, tier) for tier in TIER_WAVES}
