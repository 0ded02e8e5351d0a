"""Router for MoE: logits = bf16(x @ W^T + b), top-k (ties: lower expert id), softmax over the k. The device
code of the moe/route_h<H>_e<E>_top<k> packages (host code: route_entries.py).

One workgroup (4 waves) owns 16 token rows; grid = ceil(M / 16), M a runtime i32.
- Logits: wave w computes experts [32w, 32w + 32) for the 16 tokens with v_mfma_f32_16x16x32_bf16 (two
  16x16 tiles), K = hidden in steps of 32. Lane l loads 16 bytes of token row l%16 and of expert row l%16
  at the same K offset (A and B share their K order, so the layout question of GFX950.md does not arise).
  Token rows past M read zeros (the descriptor over x ends at M rows); they are never stored.
- Each logit gets the bias in fp32, is rounded to bf16 (RNE), and becomes a sortable key
  (order-preserving 16-bit image of the bf16 << 8 | 255 - expert): the max key is the largest logit and,
  among equal logits, the lowest id. A NaN logit gets image 0, below -inf: it ranks last (lowest id first
  among NaNs), and a row of NaN logits (garbage padding rows) still gives ids in [0, E), weights NaN.
- Keys go to LDS [16][E]; wave w then picks top-k for tokens 4w..4w+3, one 16-lane DPP row per token,
  lane r holding experts 8r..8r+7: k rounds of (max of 8, row max by DPP, knock the winner out).
- Softmax over the k logits in fp32 (v_exp_f32 on (l - max) * log2(e)); lane 0 of each row stores.
No atomics, no scratch; every output element has one writer, so results are bitwise deterministic.
The MoE's routed entry computes the same logits split over expert blocks (mxfp4_moe/route_quant_sort.py: one
wave per 16 experts, each logit this kernel's MFMA chain) and shares load_bias, logit_key and topk_softmax.
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from amd_kernels.common import buffer, mfma, wave

TILE_M = 16
WAVES = 4
LOG2E = 1.4426950408889634
K_GROUP = 6  # K-steps whose loads are issued together (double-buffered)


def _ord16(bits):
    """bf16 bits (i32, 0..0xffff) -> 16-bit unsigned image with the float order; NaN (either sign) -> 0,
    below -inf (0x007F), so a NaN logit ranks last, as in the reference."""
    neg = (bits & 0x8000) != 0
    nan = (bits & 0x7FFF) > 0x7F80
    return nan.select(fx.Int32(0), neg.select(bits ^ 0xFFFF, bits | 0x8000))


def _bf16_of_ord16(o):
    pos = (o & 0x8000) != 0
    return pos.select(o & 0x7FFF, o ^ 0xFFFF)


def _round_bf16_bits(v):
    """fp32 -> bf16 bits (RNE) as i32 in 0..0xffff."""
    b = fx.Float32(v).bitcast(fx.Int32)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return r & 0xFFFF


def _row_max_i32(v):
    for ctrl in (wave.QUAD_SWAP_1, wave.QUAD_SWAP_2, wave.ROW_HALF_MIRROR, wave.ROW_MIRROR):
        v = fx.max(v, wave.dpp(v, ctrl))
    return v


def load_bias(b_rsrc, e):
    """Expert e's router bias (bf16 [E]) as fp32."""
    word = _load_dword(b_rsrc, (e // 2) * 4)
    return ((e & 1) != 0).select(word & fx.Int32(-65536), word << 16).bitcast(fx.Float32)


def logit_key(acc, bias, e):
    """Expert e's sortable key from its fp32 dot product: bf16(acc + bias) in the order image, then 255 - e."""
    return (_ord16(_round_bf16_bits(acc + bias)) << 8) | (255 - e)


def topk_softmax(keys, top_k):
    """One token per 16-lane DPP row, its keys spread over the row's lanes (`keys`: this lane's list): the k
    largest keys in order (every lane of the row holds them), and their softmax as exps and 1 / their sum
    (weight j = exps[j] * inv, fp32; formed at the store, where route's kernel always formed it)."""
    per_lane = len(keys)
    best = []
    for j in range_constexpr(top_k):
        v = keys[0]
        for i in range_constexpr(1, per_lane):
            v = fx.max(v, keys[i])
        v = _row_max_i32(v)
        best.append(v)
        keys = [(keys[i] == v).select(fx.Int32(-1), keys[i]) for i in range_constexpr(per_lane)]
    logits = [(_bf16_of_ord16(k >> 8) << 16).bitcast(fx.Float32) for k in best]
    exps = [fx.Float32(1.0)]
    for j in range_constexpr(1, top_k):
        d = (logits[j] - logits[0]) * LOG2E
        exps.append(fx.Float32(rocdl.exp2(T.f32, fx.as_ir_value(d))))
    total = exps[0]
    for j in range_constexpr(1, top_k):
        total = total + exps[j]
    inv = 1.0 / total
    return best, exps, inv


def build(hidden: int, experts: int, top_k: int, name: str):
    assert hidden % 32 == 0 and experts == WAVES * 32 and top_k <= 8
    ksteps = hidden // 32
    row_bytes = hidden * 2
    per_lane = experts // 16  # keys per lane in the top-k phase

    @fx.struct
    class Lds:
        keys: fx.Array[fx.Int32, TILE_M * experts, 16]

    @flyc.kernel(name=name, known_block_size=[WAVES * 64, 1, 1])
    def k_route(x: fx.Tensor, w: fx.Tensor, b: fx.Tensor, out_w: fx.Tensor, out_ids: fx.Tensor, m: fx.Int32):
        lds = fx.SharedAllocator().allocate(Lds).peek()
        keys_lds = lds.keys.view(fx.make_layout(TILE_M * experts, 1))
        lane, wv = wave.lane_and_wave(fx.thread_idx.x, WAVES)
        r = lane % 16
        q = lane // 16
        tile_row0 = fx.block_idx.x * TILE_M
        x_rsrc = buffer.tensor_resource(x, fx.Int64(m) * row_bytes)
        w_rsrc = buffer.tensor_resource(w, experts * row_bytes)
        a_off = (tile_row0 + r) * row_bytes + q * 16
        b_off = (wv * 32 + r) * row_bytes + q * 16
        accs = [mfma.zeros(), mfma.zeros()]

        def load_group(g):
            loads = []
            for s in range_constexpr(min(K_GROUP, ksteps - g * K_GROUP)):
                kb = (g * K_GROUP + s) * 64
                loads.append((buffer.load_x4(x_rsrc, a_off + kb),
                              buffer.load_x4(w_rsrc, b_off + kb),
                              buffer.load_x4(w_rsrc, b_off + 16 * row_bytes + kb)))
            return loads

        groups = (ksteps + K_GROUP - 1) // K_GROUP
        pending = load_group(0)
        for g in range_constexpr(groups):
            nxt = load_group(g + 1) if g + 1 < groups else None
            buffer.keep_issued_above()
            for a, b0, b1 in pending:
                accs[0] = mfma.bf16_16x16x32(a, b0, accs[0])
                accs[1] = mfma.bf16_16x16x32(a, b1, accs[1])
            pending = nxt

        b_rsrc = buffer.tensor_resource(b, experts * 2)
        for t in range_constexpr(2):
            e = wv * 32 + t * 16 + r
            bias = load_bias(b_rsrc, e)
            for reg in range_constexpr(4):
                fx.memref_store(logit_key(accs[t][reg], bias, e), keys_lds, (q * 4 + reg) * experts + e)
        gpu.barrier()

        row = wv * 4 + q
        keys = [fx.memref_load(keys_lds, row * experts + r * per_lane + i) for i in range_constexpr(per_lane)]
        best, exps, inv = topk_softmax(keys, top_k)
        token = tile_row0 + row
        out_bytes = fx.Int64(m) * (top_k * 4)
        ow = buffer.tensor_resource(out_w, out_bytes)
        oi = buffer.tensor_resource(out_ids, out_bytes)
        base = (r == 0).select(token * (top_k * 4), buffer.never_in_range())
        for j in range_constexpr(top_k):
            buffer.store((exps[j] * inv).bitcast(fx.Int32), ow, base + j * 4)
            buffer.store(255 - (best[j] & 0xFF), oi, base + j * 4)

    @flyc.jit
    def route(x: fx.Tensor, w: fx.Tensor, b: fx.Tensor, out_w: fx.Tensor, out_ids: fx.Tensor, m: fx.Int32,
              stream: fx.Stream = fx.Stream(None)):
        k_route(x, w, b, out_w, out_ids, m).launch(
            grid=((m + (TILE_M - 1)) // TILE_M, 1, 1), block=(WAVES * 64, 1, 1), stream=stream)

    def example_args(m: int = 1):
        return (torch.zeros(m, hidden, dtype=torch.bfloat16), torch.zeros(experts, hidden, dtype=torch.bfloat16),
                torch.zeros(experts, dtype=torch.bfloat16), torch.zeros(m, top_k, dtype=torch.float32),
                torch.zeros(m, top_k, dtype=torch.int32), m)

    return route, example_args



def variants(hidden: int, experts: int, top_k: int) -> dict:
    """VARIANTS: one variant serves every token count (decode and prefill)."""
    return {"route.all": build(hidden, experts, top_k, f"moe_route_h{hidden}_e{experts}_top{top_k}")}


def _load_dword(rsrc, byte_offset):
    raw = rocdl.raw_ptr_buffer_load(T.i32, rsrc, buffer._ir(byte_offset), buffer._ir(0))
    return fx.Int32(raw)
