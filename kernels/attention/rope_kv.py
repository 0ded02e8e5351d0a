"""RoPE (NeoX, YaRN cos/sin table) on q and k, and the paged KV-cache write, in one launch.

Shared by the packages attention/rope_kv_q<Hq>_kv<Hkv>_d64; the contract is references/attention.py
(rope_kv_write): qkv bf16 [T, (Hq + 2 Hkv) * 64] -> q bf16 [T, Hq, 64] rotated, k rotated and v copied into
key_cache / value_cache [num_blocks, 64, Hkv, 64] at slot_mapping[t] (-1: no write).

Design (one workgroup per token, grid = T, so one compiled variant serves every token count):
- Lane g of the workgroup owns head g // 4 (q heads, then k heads, then v heads of the qkv row) and the
  quarter j = g % 4 of it: the two 16-byte vectors holding elements 8j..8j+7 and 32+8j..32+8j+7, exactly the
  pair NeoX rotation mixes, so the rotation needs no cross-lane traffic. Each lane loads 2 x 16 B of qkv
  (`buffer_load_dwordx4`; the four lanes of a head read its 128 B as two 64 B runs) and stores 2 x 16 B.
  Lanes past the last head (TP8: 40 live lanes of 64) get offsets past the row: loads read 0, stores drop.
- The token's position, slot and the 256-byte cos/sin row are wave-uniform: scalar buffer loads
  (`s_buffer_load`), once per wave, no per-lane duplicates. A lane picks its quarter's 8 cos and 8 sin
  values with `v_cndmask` on j.
- fp32 math, products and sums unfused in the order of the reference (o1 = a c - b s, o2 = b c + a s),
  one bf16 rounding (RNE) per element; v is stored bit for bit.
- Stores go through descriptors bounded to one row (q row t, cache row `slot`): each lane issues the q, k
  and v store with an out-of-range offset unless the store is its own, so there is no divergent branch.
  A slot of -1 (graph padding) skips the cache stores with a wave-uniform branch.
- fp8 tier (float8_e4m3fn cache, per-tensor k_scale / v_scale): the bf16-rounded k and the bf16 v are
  divided by the scale (IEEE fp32 division), clamped to +-448 (NaN passes) and converted to E4M3 (RNE),
  8 bytes per lane per vector.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import rocdl

from amd_kernels.common import bf16, buffer, mxfp8

HEAD_DIM = 64
BLOCK_SIZE = 64
LANES_PER_HEAD = 4  # each lane: 2 x 8 bf16 of one head
HEAD_BYTES = HEAD_DIM * 2
HALF_BYTES = HEAD_BYTES // 2  # offset of element 32 (the rotation partner of element 0)
FP8_MAX = 448.0


def _scalar_ptr(t, num_bytes):
    return rocdl.make_buffer_ptr(fx.get_iter(t), num_records_bytes=fx.Int64(num_bytes))


def _pick(j, vs):
    """vs[j] for a per-lane j in 0..3 (v_cndmask on each dword)."""
    return (j == 0).select(vs[0], (j == 1).select(vs[1], (j == 2).select(vs[2], vs[3])))


def _fp8x8(v_f32x8, scale):
    """8 fp32 -> 8 E4M3 bytes (Vector 2 x i32) of v / scale (IEEE division), clamped to +-448, RNE."""
    return mxfp8.e4m3x8(v_f32x8 / scale, fx.Float32(1.0))


def build(hq: int, hkv: int, fp8: bool = False):
    """(launcher, example args) of the rope + KV write for Hq query / Hkv KV heads of 64."""
    heads = hq + 2 * hkv
    row_elems = heads * HEAD_DIM
    threads = -(-heads * LANES_PER_HEAD // 64) * 64
    kv_row_elems = hkv * HEAD_DIM
    cache_elem = 1 if fp8 else 2
    name = f"rope_kv_q{hq}_kv{hkv}_d64" + ("_fp8" if fp8 else "")

    @flyc.kernel(name=name, known_block_size=[threads, 1, 1])
    def k_rope(qkv: fx.Tensor, positions: fx.Tensor, cos_sin: fx.Tensor, slots: fx.Tensor,
               key_cache: fx.Tensor, value_cache: fx.Tensor, k_scale: fx.Tensor, v_scale: fx.Tensor, q: fx.Tensor,
               m: fx.Int32, max_pos: fx.Int32):
        t = fx.block_idx.x
        g = fx.thread_idx.x
        h = g // LANES_PER_HEAD
        j = g % LANES_PER_HEAD
        # Wave-uniform: low dwords of the int64 position and slot (both < 2^31; slot -1 stays -1).
        pos = rocdl.s_buffer_load(_scalar_ptr(positions, fx.Int64(m) * 8), t * 2)
        slot = rocdl.s_buffer_load(_scalar_ptr(slots, fx.Int64(m) * 8), t * 2)
        cs_ptr = _scalar_ptr(cos_sin, fx.Int64(max_pos) * (HEAD_DIM * 4))
        row = [rocdl.s_buffer_load(cs_ptr, pos * HEAD_DIM + 4 * i, count=4) for i in range(16)]

        src = buffer.row_resource(qkv, t, row_elems, 2)
        off = h * HEAD_BYTES + j * 16
        a = buffer.load_x4(src, off)
        b = buffer.load_x4(src, off + HALF_BYTES)
        # this lane's cos / sin: floats 8j..8j+7 = dword vectors 2j, 2j+1 (cos), 8 + 2j, 9 + 2j (sin)
        c_lo, c_hi = _pick(j, row[0:8:2]), _pick(j, row[1:8:2])
        s_lo, s_hi = _pick(j, row[8:16:2]), _pick(j, row[9:16:2])
        c = c_lo.shuffle(c_hi, list(range(8))).bitcast(fx.Float32)
        s = s_lo.shuffle(s_hi, list(range(8))).bitcast(fx.Float32)
        xa, xb = bf16.unpack(a), bf16.unpack(b)
        ra = bf16.pack(xa * c - xb * s)
        rb = bf16.pack(xb * c + xa * s)

        never = buffer.never_in_range()
        q_dst = buffer.row_resource(q, t, hq * HEAD_DIM, 2)
        q_off = (h < hq).select(off, never)
        buffer.store(ra, q_dst, q_off)
        buffer.store(rb, q_dst, q_off + HALF_BYTES)
        if slot >= 0:
            k_dst = buffer.row_resource(key_cache, slot, kv_row_elems, cache_elem)
            v_dst = buffer.row_resource(value_cache, slot, kv_row_elems, cache_elem)
            is_k = (h >= hq) & (h < hq + hkv)
            is_v = (h >= hq + hkv) & (h < heads)
            kv_off = (h - hq) * HEAD_BYTES + j * 16
            if fp8:
                ks = rocdl.s_buffer_load(_scalar_ptr(k_scale, 4), 0).bitcast(fx.Float32)
                vs = rocdl.s_buffer_load(_scalar_ptr(v_scale, 4), 0).bitcast(fx.Float32)
                k_off = is_k.select(kv_off // 2, never)
                v_off = is_v.select((kv_off - hkv * HEAD_BYTES) // 2, never)
                ka, kb = bf16.unpack(bf16.opaque(ra)), bf16.unpack(bf16.opaque(rb))
                buffer.store(_fp8x8(ka, ks), k_dst, k_off)
                buffer.store(_fp8x8(kb, ks), k_dst, k_off + HALF_BYTES // 2)
                buffer.store(_fp8x8(xa, vs), v_dst, v_off)
                buffer.store(_fp8x8(xb, vs), v_dst, v_off + HALF_BYTES // 2)
            else:
                k_off = is_k.select(kv_off, never)
                v_off = is_v.select(kv_off - hkv * HEAD_BYTES, never)
                buffer.store(ra, k_dst, k_off)
                buffer.store(rb, k_dst, k_off + HALF_BYTES)
                buffer.store(a, v_dst, v_off)
                buffer.store(b, v_dst, v_off + HALF_BYTES)

    @flyc.jit
    def launch(qkv: fx.Tensor, positions: fx.Tensor, cos_sin: fx.Tensor, slots: fx.Tensor,
               key_cache: fx.Tensor, value_cache: fx.Tensor, k_scale: fx.Tensor, v_scale: fx.Tensor, q: fx.Tensor,
               m: fx.Int32, max_pos: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        k_rope(qkv, positions, cos_sin, slots, key_cache, value_cache, k_scale, v_scale, q, m, max_pos).launch(
            grid=(m, 1, 1), block=(threads, 1, 1), stream=stream)

    def example(m: int = 1):
        cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        return (torch.zeros(m, row_elems, dtype=torch.bfloat16), torch.zeros(m, dtype=torch.int64),
                torch.zeros(4, HEAD_DIM, dtype=torch.float32), torch.zeros(m, dtype=torch.int64),
                torch.zeros(1, BLOCK_SIZE, hkv, HEAD_DIM, dtype=cache_dtype),
                torch.zeros(1, BLOCK_SIZE, hkv, HEAD_DIM, dtype=cache_dtype),
                torch.ones(1, dtype=torch.float32), torch.ones(1, dtype=torch.float32),
                torch.zeros(m, hq, HEAD_DIM, dtype=torch.bfloat16),
                m, 4, fx.Stream(None))

    return launch, example


def variants(hq: int, hkv: int) -> dict:
    return {"rope_kv_write": build(hq, hkv), "rope_kv_write_fp8": build(hq, hkv, fp8=True)}
