"""Paged prefill attention (FlashAttention style) with sinks and an optional sliding window, bf16 KV cache,
head_dim 64, 8 query heads per KV head (gpt-oss at TP1 and TP8). Contract: references/attention.py
(paged_attention, the prefill tier's rounding points).

Prefill tier: the sequences with q_len > 1 (q_len 1 belongs to the decode tier, paged_decode.py; q_len 0 is
padding). Grid (Q tile, KV head, sequence); a workgroup of WAVES waves owns TILE_TOKENS consecutive query
tokens of one sequence and the 8 query heads of one KV head, so each K/V byte it needs is read once per Q
tile. Tiles of a sequence start at its first query row: a sequence's tiles, its key order and its bits
depend only on that sequence (batch invariance). Grid x beyond a sequence's tile count does nothing; x = 0
takes the sequence's last (longest, causal) tile so the heavy tiles start first.

Columns: the 8 heads of a token are 8 adjacent MFMA columns, so 16 columns = 2 tokens; wave w owns
COLS column groups (2 * COLS tokens). Per 64-key cache block (one LDS tile of K and V, loaded by the whole
workgroup with 16-byte global loads; K rows XOR-swizzled against LDS bank conflicts):
- S^T[16 keys, 16 columns] = K[16 keys, 64] x Q^T[64, 16 columns] (v_mfma_f32_16x16x32_bf16, two K steps);
  lane l, register r holds the score of key 4 (l / 16) + r of the 16-key tile, column l % 16. Q stays in
  registers for the whole tile (read once).
- Online softmax per column in fp32 with exp2 (scores times 64**-0.5 * log2 e); the running max starts at
  the sink logit (so the sink is folded into the state once) and exp2(sink - m) joins the sum at the end.
- O^T[16 dims, 16 columns] += V^T[16 dims, 32 keys] x P^T[32 keys, 16 columns], P rounded to bf16; V^T comes
  from LDS through ds_read_b64_tr_b16 in the key order the P^T registers hold (as in the decode kernel).
Masks: the key blocks a tile needs are [first, last] (causal: up to its last query's position; window:
from its first query's position - W + 1). Blocks wholly inside every query's range run unmasked; only the
edge blocks (the causal diagonal, the window's start) compare positions, and there each wave skips the
Q K^T MFMAs of the 16-key tiles and the P V MFMAs of the 32-key halves none of its rows keeps (a wave-uniform
branch; the skipped scores would all be masked, so the bits are the same). Keys past the sequence's length
load as zeros (buffer range check), so cache garbage never enters.
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl._mlir import ir
from flydsl._mlir.dialects import scf
from flydsl.compiler.ast_rewriter import ReplaceIfWithDispatch
from flydsl.expr import gpu, range_constexpr
from flydsl.expr.typing import T

from amd_kernels.attention import paged_decode as kd
from amd_kernels.common import buffer, mfma, wave

_if = ReplaceIfWithDispatch.scf_ifexp_dispatch  # a wave-uniform branch returning values (scf.if)


def _if_raw(cond, then_fn, keep):
    """scf.if over COLS x 4 accumulators: then_fn() when `cond`, else `keep` unchanged (built directly: the
    generic dispatcher's trial trace mistypes these MFMA results)."""
    flat = [fx.as_ir_value(v) for row in keep for v in row]
    op = scf.IfOp(ReplaceIfWithDispatch._to_i1(cond), [v.type for v in flat], has_else=True)
    with ir.InsertionPoint(op.regions[0].blocks[0]):
        scf.YieldOp([fx.as_ir_value(v) for row in then_fn() for v in row])
    if len(op.regions[1].blocks) == 0:
        op.regions[1].blocks.append()
    with ir.InsertionPoint(op.regions[1].blocks[0]):
        scf.YieldOp(flat)
    res = list(op.results)
    n = len(keep[0])
    return [[fx.Vector(res[c * n + d]) for d in range(n)] for c in range(len(keep))]

HEAD_DIM = kd.HEAD_DIM
BLOCK = kd.BLOCK
GROUP = kd.GROUP
ROW_BYTES = kd.ROW_BYTES
LOG2E = kd.LOG2E
SCALE_LOG2 = kd.SCALE_LOG2
NEG_INF = kd.NEG_INF
OOB = kd.OOB

WAVES = 8  # waves per workgroup (8 x 2 column groups: 199 VGPRs, 2 waves per SIMD; 4 x 4 needs 350 + 94 AGPRs, 1)
COLS = 2  # 16-column groups per wave (2 tokens x 8 heads each)
WAVE_TOKENS = 2 * COLS
TILE_TOKENS = WAVES * WAVE_TOKENS  # query tokens per workgroup (Q tile)
THREADS = WAVES * wave.WAVE
CHUNKS = BLOCK * ROW_BYTES // 16  # 16-byte pieces of one KV head's 64-key block


def tiles_of(q_len: int) -> int:
    """Q tiles of a sequence with `q_len` query rows (host twin of the kernel's rule)."""
    return -(-q_len // TILE_TOKENS) if q_len > 1 else 0


def grid_tiles(tokens: int) -> int:
    """Grid x of a launch over `tokens` query rows: enough for one sequence holding every row."""
    return max(1, -(-tokens // TILE_TOKENS))


def _i32(v):
    return fx.Int32(v)


def _ceil_div_nonneg(a, d: int):
    return (fx.max(a, _i32(0)) + (d - 1)) // d


def _block_ranges(pos_first, pos_last, window: int):
    """(blk_lo, mid_lo, mid_hi, blk_hi): a tile of query positions pos_first..pos_last reads key blocks
    [blk_lo, blk_hi); those in [mid_lo, mid_hi) hold only keys every query of the tile keeps."""
    blk_hi = pos_last // BLOCK + 1
    if window:
        blk_lo = fx.max(pos_first - (window - 1), _i32(0)) // BLOCK
        mid_lo = fx.min(fx.max(_ceil_div_nonneg(pos_last - (window - 1), BLOCK), blk_lo), blk_hi)
    else:
        blk_lo = _i32(0)
        mid_lo = _i32(0)
    mid_hi = fx.min(fx.max((pos_first + 1) // BLOCK, mid_lo), blk_hi)
    return blk_lo, mid_lo, mid_hi, blk_hi


def _block(state, blk, masked, *, lds, rsrcs, h, kv_row, lane, tid, L, pos, wpos, window, qops, sink2):
    """One 64-key block: load it to LDS (whole workgroup), then this wave's columns. `masked` (Python bool)
    compiles the position compares (edge blocks only) and skips, per wave, the MFMAs of the 16-key tiles no
    row of the wave keeps (wpos: the wave's first and last query position). -> (m_run, l_run, o_acc)."""
    m_run, l_run, o_acc = state
    kbuf, vbuf = lds
    bt_rsrc, b, max_blocks, key_cache, value_cache = rsrcs
    g = lane // 16
    i = lane % 16
    block_bytes = BLOCK * kv_row
    pb = wave.uniform_i32(kd._dword(bt_rsrc, (b * max_blocks + blk) * 4))
    base = fx.Int64(pb) * block_bytes
    k_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
        fx.add_offset(fx.get_iter(key_cache), base // 2), num_records_bytes=fx.Int64(block_bytes)))
    v_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
        fx.add_offset(fx.get_iter(value_cache), base // 2), num_records_bytes=fx.Int64(block_bytes)))
    key0 = blk * BLOCK
    kin, vin, dst = [], [], []
    for u in range(CHUNKS // THREADS):
        c = tid + u * THREADS
        key = c // 8
        part = c % 8
        off = (key0 + key < L).select(key * kv_row + h * ROW_BYTES + part * 16, _i32(OOB))
        kin.append(buffer.load_x4(k_rsrc, off))
        vin.append(buffer.load_x4(v_rsrc, off))
        dst.append((key * ROW_BYTES + ((part ^ (key % 8)) * 16), c * 16))
    gpu.barrier()  # every wave is done with the previous block's LDS
    for u in range(CHUNKS // THREADS):
        fx.ptr_store(kin[u], kbuf + fx.Int64(dst[u][0] // 4))
        fx.ptr_store(vin[u], vbuf + fx.Int64(dst[u][1] // 4))
    gpu.barrier()
    # K operands: tile t = keys 16 t + i, dims 8 g .. and 32 + 8 g .. (swizzled chunk g ^ key % 8)
    kops = []
    for t in range(4):
        key = t * 16 + i
        sw = key % 8
        lo = fx.ptr_load(kbuf + fx.Int64((key * ROW_BYTES + (g ^ sw) * 16) // 4), result_type=T.i32x4)
        hi = fx.ptr_load(kbuf + fx.Int64((key * ROW_BYTES + ((g + 4) ^ sw) * 16) // 4), result_type=T.i32x4)
        kops.append((fx.Vector(lo), fx.Vector(hi)))
    # V^T operands (the same for every column group)
    vops = []
    for half in range(2):
        row = []
        for d in range(4):
            key_a = half * 32 + g * 4 + (i // 4)
            col = d * 16 + 4 * (i % 4)
            lo = kd._read_tr(vbuf, key_a * ROW_BYTES + col * 2)
            hi = kd._read_tr(vbuf, (key_a + 16) * ROW_BYTES + col * 2)
            row.append(lo.shuffle(hi, [0, 1, 2, 3]))
        vops.append(row)
    def scores(t):
        out = []
        for c in range(COLS):
            acc = mfma.bf16_16x16x32(kops[t][0], qops[c][0], mfma.zeros())
            out.append(mfma.bf16_16x16x32(kops[t][1], qops[c][1], acc))
        return out

    need = [None] * 4
    s_all = []
    for t in range(4):
        if masked:  # 16-key tile t holds a key some row of the wave keeps (else its scores are all masked)
            k_first = key0 + t * 16
            need[t] = k_first <= wpos[1]
            if window:
                need[t] = need[t] & (k_first + 15 > wpos[0] - window)
            s_all.append(_if(need[t], lambda t=t: scores(t), lambda: [mfma.zeros() for _ in range(COLS)]))
        else:
            s_all.append(scores(t))
    m_new_all, l_new_all, o_new_all, p_all = [], [], [], []
    for c in range(COLS):
        s_t = [s_all[t][c] for t in range(4)]
        vals = []
        mx = fx.Float32(NEG_INF)
        for t in range(4):
            for r in range(4):
                s = s_t[t][r] * SCALE_LOG2
                if masked:
                    key = key0 + (t * 16 + r) + g * 4
                    ok = key <= pos[c]
                    if window:
                        ok = ok & (pos[c] - key < window)
                    s = ok.select(s, fx.Float32(NEG_INF))
                vals.append(s)
                mx = fx.max(mx, s)
        mx = fx.max(mx, kd._bpermute_f32(mx, (lane + 16) % 64))
        mx = fx.max(mx, kd._bpermute_f32(mx, (lane + 32) % 64))
        m_new = fx.max(m_run[c], mx)
        alpha = kd._exp2(m_run[c] - m_new)
        ps = [kd._exp2(v - m_new) for v in vals]
        lsum = ps[0]
        for j in range(1, 16):
            lsum = lsum + ps[j]
        l_new_all.append(l_run[c] * alpha + lsum)
        m_new_all.append(m_new)
        o_new_all.append([o_acc[c][d] * alpha for d in range(4)])
        p_all.append([fx.Vector.from_elements(ps[8 * half: 8 * half + 8], fx.Float32).to(fx.BFloat16)
                      .bitcast(fx.Int32) for half in range(2)])

    def pv(half, o_all):
        return [[mfma.bf16_16x16x32(vops[half][d], p_all[c][half], o_all[c][d]) for d in range(4)]
                for c in range(COLS)]

    for half in range(2):
        if masked:  # a half whose two 16-key tiles no row of the wave keeps adds nothing (p = 0): skipped
            o_new_all = _if_raw(need[2 * half] | need[2 * half + 1], lambda half=half, o=o_new_all: pv(half, o),
                                o_new_all)
        else:
            o_new_all = pv(half, o_new_all)
    return m_new_all, l_new_all, o_new_all


def build(kv_heads: int, window: int):
    """Launcher `attend(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out, batch,
    max_blocks, tiles)`: one launch, grid (tiles, KV heads, batch)."""
    Hkv = kv_heads
    Hq = Hkv * GROUP
    kv_row = Hkv * ROW_BYTES
    name = f"paged_prefill_q{Hq}_kv{Hkv}_{'w%d' % window if window else 'full'}"

    @fx.struct
    class Lds:
        k: fx.Array[fx.Int32, BLOCK * ROW_BYTES // 4, 16]
        v: fx.Array[fx.Int32, BLOCK * ROW_BYTES // 4, 16]

    @flyc.kernel(name=name, known_block_size=[THREADS, 1, 1])
    def k_prefill(q: fx.Tensor, key_cache: fx.Tensor, value_cache: fx.Tensor, cu_seqlens_q: fx.Tensor,
                  seq_lens: fx.Tensor, block_table: fx.Tensor, sinks: fx.Tensor, out: fx.Tensor,
                  batch: fx.Int32, max_blocks: fx.Int32):
        tid = fx.thread_idx.x
        lane, w = wave.lane_and_wave(tid, WAVES)
        g = lane // 16
        i = lane % 16  # column: token i // 8 of the group, head i % 8
        x = fx.block_idx.x
        h = fx.block_idx.y
        b = fx.block_idx.z
        lds = fx.SharedAllocator().allocate(Lds).peek()
        kbuf = lds.k.ptr
        vbuf = lds.v.ptr

        meta = buffer.tensor_resource(cu_seqlens_q, (fx.Int64(batch) + 1) * 4)
        q_lo = kd._uniform(kd._dword(meta, b * 4))
        q_hi = kd._uniform(kd._dword(meta, b * 4 + 4))
        L = kd._uniform(kd._dword(buffer.tensor_resource(seq_lens, fx.Int64(batch) * 4), b * 4))
        ql = q_hi - q_lo
        nt = (ql + (TILE_TOKENS - 1)) // TILE_TOKENS
        if (ql > 1) & (x < nt) & (ql <= L):
            tile = nt - 1 - x
            tok0 = tile * TILE_TOKENS
            pos_base = L - ql  # position of query token 0
            pos_first = pos_base + tok0
            pos_last = pos_base + fx.min(ql, tok0 + TILE_TOKENS) - 1
            # key blocks of the tile: [blk_lo, blk_hi); unmasked middle [mid_lo, mid_hi)
            blk_lo, mid_lo, mid_hi, blk_hi = _block_ranges(pos_first, pos_last, window)

            # this wave's columns: Q operands (lane (i, g): Q[column i][dims 8 g .. 8 g + 7], and + 32)
            q_rsrc = buffer.tensor_resource(q, fx.Int64(q_hi) * (Hq * ROW_BYTES))
            sink_rsrc = buffer.tensor_resource(sinks, Hq * 4)
            head = h * GROUP + i % 8
            sink2 = kd._dword(sink_rsrc, head * 4).bitcast(fx.Float32) * LOG2E
            qops, pos, toks = [], [], []
            for c in range_constexpr(COLS):
                tok = tok0 + w * WAVE_TOKENS + c * 2 + i // 8
                toks.append(tok)
                pos.append(pos_base + tok)
                off = (tok < ql).select(((q_lo + tok) * Hq + head) * ROW_BYTES + g * 16, _i32(OOB))
                qops.append((buffer.load_x4(q_rsrc, off), buffer.load_x4(q_rsrc, off + 64)))
            bt_rsrc = buffer.tensor_resource(block_table, (fx.Int64(b) + 1) * fx.Int64(max_blocks) * 4)
            wpos0 = pos_base + tok0 + w * WAVE_TOKENS  # this wave's query positions (wave-uniform)
            ctx = dict(lds=(kbuf, vbuf), rsrcs=(bt_rsrc, b, max_blocks, key_cache, value_cache), h=h,
                       kv_row=kv_row, lane=lane, tid=tid, L=L, pos=pos, wpos=(wpos0, wpos0 + WAVE_TOKENS - 1),
                       window=window, qops=qops, sink2=sink2)

            m_run = [sink2 for _ in range_constexpr(COLS)]
            l_run = [fx.Float32(0.0) for _ in range_constexpr(COLS)]
            o_acc = [[mfma.zeros() for _ in range_constexpr(4)] for _ in range_constexpr(COLS)]
            for blk in range(blk_lo, mid_lo):  # window start: edge blocks
                m_run, l_run, o_acc = _block((m_run, l_run, o_acc), blk, True, **ctx)
            for blk in range(mid_lo, mid_hi):  # every key inside every query's range
                m_run, l_run, o_acc = _block((m_run, l_run, o_acc), blk, False, **ctx)
            for blk in range(mid_hi, blk_hi):  # causal diagonal: edge blocks
                m_run, l_run, o_acc = _block((m_run, l_run, o_acc), blk, True, **ctx)

            o_rsrc = buffer.tensor_resource(out, fx.Int64(q_hi) * (Hq * ROW_BYTES))
            for c in range_constexpr(COLS):
                l_tot = l_run[c] + kd._bpermute_f32(l_run[c], (lane + 16) % 64)
                l_tot = l_tot + kd._bpermute_f32(l_tot, (lane + 32) % 64)
                l_tot = l_tot + kd._exp2(sink2 - m_run[c])
                inv = 1.0 / l_tot
                row_ok = toks[c] < ql
                for d in range_constexpr(4):
                    y = (o_acc[c][d] * inv).to(fx.BFloat16).bitcast(fx.Int32)
                    off = row_ok.select(((q_lo + toks[c]) * Hq + head) * ROW_BYTES + (d * 16 + g * 4) * 2,
                                        _i32(OOB))
                    buffer.store(y, o_rsrc, off)

    @flyc.jit
    def attend(q: fx.Tensor, key_cache: fx.Tensor, value_cache: fx.Tensor, cu_seqlens_q: fx.Tensor,
               seq_lens: fx.Tensor, block_table: fx.Tensor, sinks: fx.Tensor, out: fx.Tensor, batch: fx.Int32,
               max_blocks: fx.Int32, tiles: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        k_prefill(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out, batch,
                  max_blocks).launch(grid=(tiles, Hkv, batch), block=(THREADS, 1, 1), stream=stream)

    def example(batch: int = 1):
        return (torch.zeros(2, Hq, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(2, BLOCK, Hkv, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(2, BLOCK, Hkv, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32),
                torch.zeros(batch, 1, dtype=torch.int32), torch.zeros(Hq, dtype=torch.float32),
                torch.zeros(2, Hq, HEAD_DIM, dtype=torch.bfloat16), batch, 1, 1, fx.Stream(None))

    return attend, example
