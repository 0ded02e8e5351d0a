"""Paged decode attention with sinks and an optional sliding window, bf16 or fp8 e4m3 KV cache, head_dim 64,
8 query heads per KV head (gpt-oss at TP1 and TP8). Contract: references/attention.py (paged_attention).

Decode tier: every sequence has q_len 1 (padding sequences q_len 0). Grid (split, KV head, sequence); one
wave per workgroup computes the 8 query heads of its KV head over the keys of its split, so each K/V byte is
read once per sequence.

Split over keys (full-attention layers): a sequence of L keys has nb = ceil(L / 64) cache blocks, taken in
splits of spb = max(MIN_SPLIT_BLOCKS, ceil(nb / MAX_SPLITS)) blocks: a function of L only, never of the
batch (batch invariance). A sequence with one split writes its output; with more, every split writes fp32
partials (unnormalized O, running max, sum) and the merge launch combines them in split order 0, 1, ...
Window layers (W = 128) read only the blocks holding the last W keys, never split, and use one launch.

Per 64-key cache block (MFMA v_mfma_f32_16x16x32_bf16, see amd_kernels.common.mfma):
- S^T[16 keys, 16 heads] = K[16 keys, 64] x Q^T[64, 16 heads]: A = 16 bytes of one key row per lane,
  straight from the cache (buffer loads bounded to the block; a masked key's offset is out of range and
  reads zeros, so cache garbage never enters); B = the query, heads 8..15 zero. Lane l, register r holds
  the score of key 4*(l/16) + r, head l % 16.
- Online softmax per head in fp32 with exp2 (scores scaled by 64**-0.5 * log2 e): the block max is a lane's
  16 values then the 4 lanes of the head (ds_bpermute); the running sum stays per lane until the end.
- O^T[16 dims, 16 heads] += V^T[16 dims, 32 keys] x P^T[32 keys, 16 heads]: P^T is the score accumulators
  of two key tiles rounded to bf16 (keys 4*(l/16) + j and 16 + 4*(l/16) + j: a K order both operands
  share); V goes through LDS (row-major, 128 bytes a key) and comes back transposed by ds_read_b64_tr_b16
  in that same key order.
The sink: split 0 starts its running max at the sink logit and adds exp(sink - m) to the sum once.

fp8 e4m3 KV tier (build(..., fp8=True); contract references/attention.py paged_attention_fp8): the same
kernels on E4M3 codes. Each code is converted to bf16 with v_cvt_scalef32_pk_bf16_fp8 at scale 1.0, which is
exact (every E4M3 value is a bf16 value; the emulator's rule for it is checked in
harness/emulator/tests/test_numerics.py), and the bf16 MFMA path above runs unchanged:
- K: one 16-byte load per lane and key tile (dims 16 g .. 16 g + 15), converted to the two 8-dim operands
  of the two K steps; the query operand is loaded in that same dim order (dims 16 g .., then 16 g + 8 ..).
- V: 16-byte loads (16 dims of a key), converted and stored to LDS as the bf16 tier's row-major tile, so
  the transposed reads (ds_read_b64_tr_b16) and P V are the bf16 tier's.
- k_scale is folded into the score factor (k_scale * 64**-0.5 * log2 e, one fp32 product) and v_scale
  multiplies the fp32 O before the output or the split partial is written.
It deliberately does not use ds_read_b64_tr_b8 / tr_b4 (transposed fp8 reads): their emulator rules are not
yet settled by instruction tests and upstream flash_attn_fp8_gfx950 matching torch (issue 12). The cost:
fp8 bytes are read from HBM, but V goes through LDS as bf16 and the MFMAs are bf16 ones.
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import math

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl._mlir import ir
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr import const_expr, gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from amd_kernels.common import buffer, mfma, wave

HEAD_DIM = 64
BLOCK = 64  # keys per cache block
GROUP = 8  # query heads per KV head
ROW_BYTES = HEAD_DIM * 2
LOG2E = 1.4426950408889634
SCALE_LOG2 = HEAD_DIM ** -0.5 * LOG2E
NEG_INF = float("-inf")
OOB = 0x7FFFFFF0


def splits_of(seq_len: int, max_splits: int, min_split_blocks: int) -> tuple[int, int]:
    """(blocks per split, splits) of a sequence of `seq_len` keys: the host-side twin of the kernel's rule."""
    nb = -(-seq_len // BLOCK)
    spb = max(min_split_blocks, -(-nb // max_splits))
    return spb, -(-nb // spb)


def _i32(v):
    return fx.Int32(v)


def _uniform(v):
    return wave.uniform_i32(v)


def _dword(rsrc, off):
    return fx.Int32(rocdl.raw_ptr_buffer_load(T.i32, rsrc, buffer._ir(off), buffer._ir(0)))


def _exp2(v):
    return fx.Float32(rocdl.exp2(T.f32, fx.as_ir_value(v)))


def _bpermute_f32(v, src_lane):
    i32 = ir.IntegerType.get_signless(32)
    raw = rocdl.ds_bpermute(i32, fx.as_ir_value(_i32(src_lane * 4)), fx.as_ir_value(fx.Float32(v).bitcast(fx.Int32)))
    return fx.Int32(raw).bitcast(fx.Float32)


def _key_range(L, x, window: int, max_splits: int, min_split_blocks: int):
    """(first key, first block, end block, splits) of split x of a sequence of L keys (device values)."""
    nb = (L + (BLOCK - 1)) // BLOCK
    if window:
        first_key = fx.max(L - window, _i32(0))
        return first_key, first_key // BLOCK, nb, _i32(1)
    spb = fx.max(_i32(min_split_blocks), (nb + (max_splits - 1)) // max_splits)
    blk0 = x * spb
    return _i32(0), blk0, fx.min(nb, blk0 + spb), (nb + spb - 1) // spb


def build(kv_heads: int, window: int, max_splits: int, min_split_blocks: int, fp8: bool = False):
    """Launcher `attend(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out, part_o,
    part_ml, batch, max_blocks, num_blocks)` (fp8: `k_scale, v_scale` after `sinks`): the main launch, plus
    the merge launch when `window` is 0."""
    Hkv = kv_heads
    Hq = Hkv * GROUP
    splits = 1 if window else max_splits
    elem = 1 if fp8 else 2  # cache bytes per element
    kv_row = Hkv * HEAD_DIM * elem  # bytes between consecutive slots of a block
    head_bytes = HEAD_DIM * elem
    block_bytes = BLOCK * kv_row
    name = f"paged_decode_q{Hq}_kv{Hkv}_{'w%d' % window if window else 'full'}" + ("_fp8" if fp8 else "")

    @fx.struct
    class Lds:
        v: fx.Array[fx.Int32, BLOCK * ROW_BYTES // 4, 16]

    def attend_body(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, k_scale, v_scale,
                    out, part_o, part_ml, batch, max_blocks, num_blocks):
        lane = fx.thread_idx.x % wave.WAVE
        g = lane // 16
        i = lane % 16  # query head within the group (8..15: padding heads of the MFMA)
        x = fx.block_idx.x  # split
        h = fx.block_idx.y  # KV head
        b = fx.block_idx.z  # sequence
        vbuf = fx.SharedAllocator().allocate(Lds).peek().v.ptr

        meta = buffer.tensor_resource(cu_seqlens_q, (fx.Int64(batch) + 1) * 4)
        q_lo = _uniform(_dword(meta, b * 4))
        q_hi = _uniform(_dword(meta, b * 4 + 4))
        L = _uniform(_dword(buffer.tensor_resource(seq_lens, fx.Int64(batch) * 4), b * 4))
        first_key, blk0, blk1, ns = _key_range(L, x, window, max_splits, min_split_blocks)
        # decode tier: q_len 1; padding sequences (q_len 0, seq_len 0) and splits past the last do nothing
        active = (q_hi - q_lo == 1) & (L > 0) & (x < ns)
        if active:
            row = q_lo
            # Q^T operand: lane l holds Q[head i][dims 8*g .. 8*g + 7] (+32 for the second K step)
            q_rsrc = buffer.tensor_resource(q, (fx.Int64(row) + 1) * (Hq * ROW_BYTES))
            if const_expr(fp8):
                # the K step order of the fp8 K operand: dims 16 g .. 16 g + 7, then 16 g + 8 .. 16 g + 15
                q_off = (i < GROUP).select((row * Hq + h * GROUP + i) * ROW_BYTES + g * 32, _i32(OOB))
                qop0 = buffer.load_x4(q_rsrc, q_off)
                qop1 = buffer.load_x4(q_rsrc, q_off + 16)
                k_fac = _dword(buffer.tensor_resource(k_scale, 4), _i32(0)).bitcast(fx.Float32) * SCALE_LOG2
                v_fac = _dword(buffer.tensor_resource(v_scale, 4), _i32(0)).bitcast(fx.Float32)
            else:
                q_off = (i < GROUP).select((row * Hq + h * GROUP + i) * ROW_BYTES + g * 16, _i32(OOB))
                qop0 = buffer.load_x4(q_rsrc, q_off)
                qop1 = buffer.load_x4(q_rsrc, q_off + 64)
            sink_rsrc = buffer.tensor_resource(sinks, Hq * 4)
            sink2 = _dword(sink_rsrc, (i < GROUP).select((h * GROUP + i) * 4, _i32(OOB))).bitcast(fx.Float32) * LOG2E
            bt_rsrc = buffer.tensor_resource(block_table, (fx.Int64(b) + 1) * fx.Int64(max_blocks) * 4)

            m_run = (x == 0).select(sink2, fx.Float32(NEG_INF))
            l_run = fx.Float32(0.0)
            o_acc = [mfma.zeros() for _ in range_constexpr(4)]
            for blk in range(blk0, blk1):
                pb = _uniform(_dword(bt_rsrc, (b * max_blocks + blk) * 4))
                base = fx.Int64(pb) * block_bytes
                k_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
                    fx.add_offset(fx.get_iter(key_cache), base // elem), num_records_bytes=fx.Int64(block_bytes)))
                v_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
                    fx.add_offset(fx.get_iter(value_cache), base // elem), num_records_bytes=fx.Int64(block_bytes)))
                key0 = blk * BLOCK
                # K: tile t holds keys 16 t + i of the block (lane's A row), dims 8 g.. and 32 + 8 g..
                kops = []
                for t in range_constexpr(4):
                    key = key0 + t * 16 + i
                    ok = (key < L) & (key >= first_key)
                    if const_expr(fp8):
                        # fp8: dims 16 g .. 16 g + 15 in one 16-byte load, converted to bf16 (exact)
                        off = ok.select((t * 16 + i) * kv_row + h * head_bytes + g * 16, _i32(OOB))
                        kops.append(_fp8x16_to_bf16(buffer.load_x4(k_rsrc, off)))
                    else:
                        off = ok.select((t * 16 + i) * kv_row + h * ROW_BYTES + g * 16, _i32(OOB))
                        kops.append((buffer.load_x4(k_rsrc, off), buffer.load_x4(k_rsrc, off + 64)))
                vin = []
                if const_expr(fp8):
                    # V: 256 16-byte chunks (16 dims each) of the block's 64 key rows; lane takes lane + 64 u
                    for u in range_constexpr(4):
                        vkey = u * 16 + lane // 4
                        key = key0 + vkey
                        ok = (key < L) & (key >= first_key)
                        vin.append(buffer.load_x4(v_rsrc, ok.select(vkey * kv_row + h * head_bytes + (lane % 4) * 16,
                                                                    _i32(OOB))))
                else:
                    # V: 512 16-byte chunks of the block's 64 key rows; lane takes chunks lane + 64 u
                    for u in range_constexpr(8):
                        vkey = u * 8 + lane // 8
                        key = key0 + vkey
                        ok = (key < L) & (key >= first_key)
                        vin.append(buffer.load_x4(v_rsrc, ok.select(vkey * kv_row + h * ROW_BYTES + (lane % 8) * 16,
                                                                    _i32(OOB))))
                s_t = []
                for t in range_constexpr(4):
                    acc = mfma.bf16_16x16x32(kops[t][0], qop0, mfma.zeros())
                    s_t.append(mfma.bf16_16x16x32(kops[t][1], qop1, acc))
                # scale, mask, block max per head
                vals = []
                mx = fx.Float32(NEG_INF)
                for t in range_constexpr(4):
                    for r in range_constexpr(4):
                        key = key0 + t * 16 + g * 4 + r
                        ok = (key < L) & (key >= first_key)
                        s = ok.select(s_t[t][r] * (k_fac if const_expr(fp8) else SCALE_LOG2), fx.Float32(NEG_INF))
                        vals.append(s)
                        mx = fx.max(mx, s)
                mx = fx.max(mx, _bpermute_f32(mx, (lane + 16) % 64))
                mx = fx.max(mx, _bpermute_f32(mx, (lane + 32) % 64))
                m_new = fx.max(m_run, mx)
                alpha = _exp2(m_run - m_new)
                ps = [_exp2(v - m_new) for v in vals]
                lsum = ps[0]
                for j in range_constexpr(1, 16):
                    lsum = lsum + ps[j]
                l_run = l_run * alpha + lsum
                m_run = m_new
                # V tile -> LDS (row-major), then read back transposed
                gpu.barrier()
                if const_expr(fp8):
                    # the same bf16 row-major tile as the bf16 tier: key vkey's dims 16 c .. 16 c + 15
                    for u in range_constexpr(4):
                        lo, hi = _fp8x16_to_bf16(vin[u])
                        at = (u * 16 + lane // 4) * (ROW_BYTES // 4) + (lane % 4) * 8
                        fx.ptr_store(lo, vbuf + fx.Int64(at))
                        fx.ptr_store(hi, vbuf + fx.Int64(at + 4))
                else:
                    for u in range_constexpr(8):
                        fx.ptr_store(vin[u], vbuf + fx.Int64((u * 64 + lane) * 4))
                gpu.barrier()
                for d in range_constexpr(4):
                    o_acc[d] = o_acc[d] * alpha
                for half in range_constexpr(2):
                    pv = fx.Vector.from_elements(ps[8 * half: 8 * half + 8], fx.Float32)
                    p_op = pv.to(fx.BFloat16).bitcast(fx.Int32)
                    for d in range_constexpr(4):
                        key_a = half * 32 + g * 4 + (i // 4)
                        col = d * 16 + 4 * (i % 4)
                        lo = _read_tr(vbuf, key_a * ROW_BYTES + col * 2)
                        hi = _read_tr(vbuf, (key_a + 16) * ROW_BYTES + col * 2)
                        o_acc[d] = mfma.bf16_16x16x32(lo.shuffle(hi, [0, 1, 2, 3]), p_op, o_acc[d])
            # sum over the head's 4 lanes (the same two steps on every lane: identical bits)
            l_tot = l_run + _bpermute_f32(l_run, (lane + 16) % 64)
            l_tot = l_tot + _bpermute_f32(l_tot, (lane + 32) % 64)
            l_tot = (x == 0).select(l_tot + _exp2(sink2 - m_run), l_tot)
            real_head = i < GROUP
            if const_expr(fp8):
                for d in range_constexpr(4):
                    o_acc[d] = o_acc[d] * v_fac
            if ns == 1:
                o_rsrc = buffer.tensor_resource(out, (fx.Int64(row) + 1) * (Hq * ROW_BYTES))
                inv = 1.0 / l_tot
                for d in range_constexpr(4):
                    y = (o_acc[d] * inv).to(fx.BFloat16).bitcast(fx.Int32)
                    off = real_head.select((row * Hq + h * GROUP + i) * ROW_BYTES + (d * 16 + g * 4) * 2, _i32(OOB))
                    buffer.store(y, o_rsrc, off)
            else:
                slot = (b * Hkv + h) * splits + x
                po_rsrc = buffer.tensor_resource(part_o, fx.Int64(batch) * (Hkv * splits * GROUP * HEAD_DIM * 4))
                for d in range_constexpr(4):
                    off = real_head.select(((slot * GROUP + i) * HEAD_DIM + d * 16 + g * 4) * 4, _i32(OOB))
                    buffer.store(o_acc[d].bitcast(fx.Int32), po_rsrc, off)
                pm_rsrc = buffer.tensor_resource(part_ml, fx.Int64(batch) * (Hkv * splits * GROUP * 2 * 4))
                ml = fx.Vector.from_elements([m_run, l_tot], fx.Float32).bitcast(fx.Int32)
                buffer.store(ml, pm_rsrc, (real_head & (g == 0)).select((slot * GROUP + i) * 8, _i32(OOB)))

    body = ASTRewriter.transform(attend_body)

    if fp8:
        @flyc.kernel(name=name, known_block_size=[wave.WAVE, 1, 1])
        def k_attend(q: fx.Tensor, key_cache: fx.Tensor, value_cache: fx.Tensor, cu_seqlens_q: fx.Tensor,
                     seq_lens: fx.Tensor, block_table: fx.Tensor, sinks: fx.Tensor, k_scale: fx.Tensor,
                     v_scale: fx.Tensor, out: fx.Tensor, part_o: fx.Tensor, part_ml: fx.Tensor, batch: fx.Int32,
                     max_blocks: fx.Int32, num_blocks: fx.Int32):
            body(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, k_scale, v_scale, out,
                 part_o, part_ml, batch, max_blocks, num_blocks)
    else:
        @flyc.kernel(name=name, known_block_size=[wave.WAVE, 1, 1])
        def k_attend(q: fx.Tensor, key_cache: fx.Tensor, value_cache: fx.Tensor, cu_seqlens_q: fx.Tensor,
                     seq_lens: fx.Tensor, block_table: fx.Tensor, sinks: fx.Tensor, out: fx.Tensor,
                     part_o: fx.Tensor, part_ml: fx.Tensor, batch: fx.Int32, max_blocks: fx.Int32,
                     num_blocks: fx.Int32):
            body(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, None, None, out, part_o,
                 part_ml, batch, max_blocks, num_blocks)

    @flyc.kernel(name=name + "_merge", known_block_size=[wave.WAVE, 1, 1])
    def k_merge(cu_seqlens_q: fx.Tensor, seq_lens: fx.Tensor, out: fx.Tensor, part_o: fx.Tensor,
                part_ml: fx.Tensor, batch: fx.Int32):
        lane = fx.thread_idx.x % wave.WAVE
        i = lane // 8  # query head within the group
        c = lane % 8  # 8 dims c*8 .. c*8 + 7
        h = fx.block_idx.x
        b = fx.block_idx.y
        meta = buffer.tensor_resource(cu_seqlens_q, (fx.Int64(batch) + 1) * 4)
        q_lo = _uniform(_dword(meta, b * 4))
        q_hi = _uniform(_dword(meta, b * 4 + 4))
        L = _uniform(_dword(buffer.tensor_resource(seq_lens, fx.Int64(batch) * 4), b * 4))
        ns = _key_range(L, h, 0, max_splits, min_split_blocks)[3]
        if (q_hi - q_lo == 1) & (L > 0) & (ns > 1):
            row = q_lo
            pm_rsrc = buffer.tensor_resource(part_ml, fx.Int64(batch) * (Hkv * splits * GROUP * 2 * 4))
            po_rsrc = buffer.tensor_resource(part_o, fx.Int64(batch) * (Hkv * splits * GROUP * HEAD_DIM * 4))
            slot0 = (b * Hkv + h) * splits
            m_all = fx.Float32(NEG_INF)
            for s in range(0, ns):
                m_all = fx.max(m_all, _dword(pm_rsrc, ((slot0 + s) * GROUP + i) * 8).bitcast(fx.Float32))
            l_all = fx.Float32(0.0)
            acc = [fx.Vector.filled(4, 0.0, fx.Float32), fx.Vector.filled(4, 0.0, fx.Float32)]
            for s in range(0, ns):
                base = ((slot0 + s) * GROUP + i)
                ml = buffer.load_x2(pm_rsrc, base * 8).bitcast(fx.Float32)
                w = _exp2(ml[0] - m_all)
                l_all = l_all + ml[1] * w
                for k in range_constexpr(2):
                    o = buffer.load_x4(po_rsrc, (base * HEAD_DIM + c * 8 + 4 * k) * 4).bitcast(fx.Float32)
                    acc[k] = acc[k] + o * w
            inv = 1.0 / l_all
            y = acc[0].shuffle(acc[1], [0, 1, 2, 3, 4, 5, 6, 7]) * inv
            o_rsrc = buffer.tensor_resource(out, (fx.Int64(row) + 1) * (Hq * ROW_BYTES))
            buffer.store(y.to(fx.BFloat16).bitcast(fx.Int32), o_rsrc, ((row * Hq + h * GROUP + i) * HEAD_DIM + c * 8) * 2)

    @flyc.jit
    def attend(q: fx.Tensor, key_cache: fx.Tensor, value_cache: fx.Tensor, cu_seqlens_q: fx.Tensor,
               seq_lens: fx.Tensor, block_table: fx.Tensor, sinks: fx.Tensor, out: fx.Tensor, part_o: fx.Tensor,
               part_ml: fx.Tensor, batch: fx.Int32, max_blocks: fx.Int32, num_blocks: fx.Int32,
               stream: fx.Stream = fx.Stream(None)):
        k_attend(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out, part_o, part_ml,
                 batch, max_blocks, num_blocks).launch(grid=(splits, Hkv, batch), block=(wave.WAVE, 1, 1),
                                                       stream=stream)
        if not window:
            k_merge(cu_seqlens_q, seq_lens, out, part_o, part_ml, batch).launch(
                grid=(Hkv, batch, 1), block=(wave.WAVE, 1, 1), stream=stream)

    @flyc.jit
    def attend_fp8(q: fx.Tensor, key_cache: fx.Tensor, value_cache: fx.Tensor, cu_seqlens_q: fx.Tensor,
                   seq_lens: fx.Tensor, block_table: fx.Tensor, sinks: fx.Tensor, k_scale: fx.Tensor,
                   v_scale: fx.Tensor, out: fx.Tensor, part_o: fx.Tensor, part_ml: fx.Tensor, batch: fx.Int32,
                   max_blocks: fx.Int32, num_blocks: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        k_attend(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, k_scale, v_scale, out,
                 part_o, part_ml, batch, max_blocks, num_blocks).launch(
                     grid=(splits, Hkv, batch), block=(wave.WAVE, 1, 1), stream=stream)
        if not window:
            k_merge(cu_seqlens_q, seq_lens, out, part_o, part_ml, batch).launch(
                grid=(Hkv, batch, 1), block=(wave.WAVE, 1, 1), stream=stream)

    def example(batch: int = 1):
        cache = torch.float8_e4m3fn if fp8 else torch.bfloat16
        scales = (torch.ones(1, dtype=torch.float32), torch.ones(1, dtype=torch.float32)) if fp8 else ()
        return (torch.zeros(batch, Hq, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(2, BLOCK, Hkv, HEAD_DIM, dtype=cache),
                torch.zeros(2, BLOCK, Hkv, HEAD_DIM, dtype=cache),
                torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32),
                torch.zeros(batch, 1, dtype=torch.int32), torch.zeros(Hq, dtype=torch.float32), *scales,
                torch.zeros(batch, Hq, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(part_o_shape(batch, Hkv, splits), dtype=torch.float32),
                torch.zeros(part_ml_shape(batch, Hkv, splits), dtype=torch.float32),
                batch, 1, 2, fx.Stream(None))

    return (attend_fp8 if fp8 else attend), example


def part_o_shape(batch: int, kv_heads: int, splits: int) -> tuple:
    return (batch, kv_heads, splits, GROUP, HEAD_DIM)


def part_ml_shape(batch: int, kv_heads: int, splits: int) -> tuple:
    return (batch, kv_heads, splits, GROUP, 2)


def _fp8x16_to_bf16(words):
    """16 E4M3 codes (Vector 4 x i32, little-endian bytes) -> their bf16 values as two Vector 4 x i32 (codes
    0..7, 8..15). v_cvt_scalef32_pk_bf16_fp8 with scale 1.0: exact, every E4M3 value is a bf16 value."""
    one = fx.as_ir_value(fx.Float32(1.0))
    bf16x2 = ir.VectorType.get([2], ir.BF16Type.get())
    out = []
    for j in range_constexpr(4):
        w = fx.as_ir_value(fx.Int32(words[j]))
        for half in range_constexpr(2):
            pair = rocdl.cvt_scalef32_pk_bf16_fp8(bf16x2, w, one, bool(half))
            out.append(fx.Vector(pair).bitcast(fx.Int32)[0])
    return fx.Vector.from_elements(out[:4], fx.Int32), fx.Vector.from_elements(out[4:], fx.Int32)


def _read_tr(vbuf, byte_off):
    """ds_read_b64_tr_b16 at LDS byte `byte_off` of `vbuf` -> Vector 2 x i32 (4 bf16, transposed across the
    16 lanes of each row: see harness/emulator/mfma.py ds_read_tr_sources)."""
    ptr = fx.to_llvm_ptr(vbuf + fx.Int64(byte_off // 4))
    raw = rocdl.ds_read_tr16_b64(T.i16x4, ptr).result
    return fx.Vector(raw).bitcast(fx.Int32)
