"""Paged prefill attention (FlashAttention style) with sinks and an optional sliding window, bf16 KV cache,
head_dim 64, 8 query heads per KV head (gpt-oss at TP1 and TP8). Contract: references/attention.py
(paged_attention, the prefill tier's rounding points).

Prefill tier: the sequences with q_len > 1 (q_len 1 belongs to the decode tier, paged_decode.py; q_len 0 is
padding). Grid (batch + chunks, KV head); a workgroup of WAVES waves owns TILE_TOKENS consecutive query
tokens of one sequence and the 8 query heads of one KV head, so each K/V byte it needs is read once per Q
tile. Tiles of a sequence start at its first query row: a sequence's tiles, its key order and its bits
depend only on that sequence (batch invariance); which workgroup computes a tile changes nothing in it.
The host knows the row count but not the sequences' lengths (device data; no sync, graph capture), so the
grid is an upper bound that wastes at most one workgroup per sequence: x < batch takes sequence x's last
(longest, causal) tile, the heavy tiles first; the other tiles each start in a distinct TILE_TOKENS-row
chunk of the batch's rows, and workgroup batch + chunks - 1 - c takes the one starting in chunk c (the
sequence owning the chunk's first row, found by counting cu_seqlens_q entries; tile_of_workgroup).

Columns: the 8 heads of a token are 8 adjacent MFMA columns, so 16 columns = 2 tokens; wave w owns
COLS column groups (2 * COLS tokens). Per 64-key cache block (one LDS tile of K and V: the whole workgroup's
16-byte global loads of block n + 1 are issued before block n's math and stored to LDS when block n + 1
starts, a prefetch in 8 VGPRs with one LDS buffer; K's and V's 16-byte chunks XOR-swizzled by key against
LDS bank conflicts):
- S^T[16 keys, 16 columns] = K[16 keys, 64] x Q^T[64, 16 columns] (v_mfma_f32_16x16x32_bf16, two K steps);
  lane l, register r holds the score of key 4 (l / 16) + r of the 16-key tile, column l % 16. Q stays in
  registers for the whole tile (read once).
- Online softmax per column in fp32 with exp2 (scores times 64**-0.5 * log2 e); the running max starts at
  the sink logit (so the sink is folded into the state once) and exp2(sink - m) joins the sum at the end.
- O^T[32 dims, 32 columns] += V^T[32 dims, 16 keys] x P^T[16 keys, 32 columns] per 16-key tile
  (v_mfma_f32_32x32x16_bf16, two for the 64 dims; the wave's 32 columns in one accumulator pair), P rounded
  to bf16. Its B operand wants lane l to hold column l % 32 and keys 8 (l / 32) .. + 7, while the scores
  leave column l % 16 of each group and keys 4 (l / 16) ..: v_permlane16_swap trades group 0's keys 4-7 in
  rows 1 / 3 for group 1's keys 0-3 in rows 0 / 2. V^T from LDS through ds_read_b64_tr_b16.
Masks: the key blocks a tile needs are [first, last] (causal: up to its last query's position; window:
from its first query's position - W + 1). Blocks wholly inside every query's range run unmasked; only the
edge blocks (the causal diagonal, the window's start) compare positions, and there each wave skips the
Q K^T and P V MFMAs of the 16-key tiles none of its rows keeps (a wave-uniform branch; the skipped scores
would all be masked, so the bits are the same). Keys past the sequence's length
load as zeros (buffer range check), so cache garbage never enters.
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl._mlir import ir
from flydsl._mlir.dialects import llvm, scf
from flydsl.compiler.ast_rewriter import ReplaceIfWithDispatch
from flydsl.expr import gpu, range_constexpr, rocdl
from flydsl.expr.typing import T

from amd_kernels.attention import paged_decode as kd
from amd_kernels.common import buffer, mfma, wave

def _if(cond, types, then_fn, else_fn):
    """scf.if yielding one value per entry of `types`: then_fn() when `cond` (wave-uniform), else else_fn(),
    each a flat list of values -> the results as fx.Vector. Built directly, never through FlyDSL's
    ReplaceIfWithDispatch.scf_ifexp_dispatch: that one traces the branches into a region it erases, then
    reads the erased values' types (freed memory): a rare native crash while tracing (0.5.0)."""
    op = scf.IfOp(ReplaceIfWithDispatch._to_i1(cond), types, has_else=True)
    with ir.InsertionPoint(op.regions[0].blocks[0]):
        scf.YieldOp([fx.as_ir_value(v) for v in then_fn()])
    if len(op.regions[1].blocks) == 0:
        op.regions[1].blocks.append()
    with ir.InsertionPoint(op.regions[1].blocks[0]):
        scf.YieldOp([fx.as_ir_value(v) for v in else_fn()])
    return [fx.Vector(r) for r in op.results]


def _if_keep(cond, then_fn, keep):
    """_if over COLS x n accumulators: then_fn() when `cond`, else `keep` unchanged."""
    flat = [fx.as_ir_value(v) for row in keep for v in row]
    res = _if(cond, [v.type for v in flat], lambda: [v for row in then_fn() for v in row], lambda: flat)
    n = len(keep[0])
    return [res[c * n:(c + 1) * n] for c in range(len(keep))]


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
COUNT_ROUND = 4 * wave.WAVE  # cu_seqlens_q entries a wave compares per round (4 loads in flight a lane)


def tiles_of(q_len: int) -> int:
    """Q tiles of a sequence with `q_len` query rows (host twin of the kernel's rule)."""
    return -(-q_len // TILE_TOKENS) if q_len > 1 else 0


def chunks_of(tokens: int) -> int:
    """TILE_TOKENS-row chunks of a launch over `tokens` query rows (the host knows the row count, not the
    sequences' lengths: those live on the device). Grid x = batch + chunks."""
    return -(-tokens // TILE_TOKENS)


def tile_of_workgroup(x: int, cu: list, chunks: int):
    """(sequence, Q tile) that workgroup x computes, or None (host twin of the kernel's rule). x < batch: the
    last tile of sequence x (the longest under the causal mask, so the heavy tiles start first); x >= batch:
    chunk c = batch + chunks - 1 - x holds row r = TILE_TOKENS c, owned by sequence b; its tile k with
    TILE_TOKENS (k + 1) - (r - cu[b]) in [0, TILE_TOKENS), if not the last one. Every tile of every sequence
    gets exactly one workgroup: two non-last tiles starting in one chunk would be <= TILE_TOKENS apart."""
    batch = len(cu) - 1
    if x < batch:
        n = tiles_of(cu[x + 1] - cu[x])
        return (x, n - 1) if n else None
    r = (batch + chunks - 1 - x) * TILE_TOKENS
    b = min(sum(1 for v in cu if v <= r) - 1, batch - 1)
    k1 = -(-(r - cu[b]) // TILE_TOKENS)
    return (b, k1 - 1) if r > cu[b] and k1 * TILE_TOKENS < cu[b + 1] - cu[b] else None


def workgroup_of(b: int, tile: int, cu: list, grid_x: int) -> int:
    """Grid x of Q tile `tile` of sequence b (the inverse of tile_of_workgroup); needs only cu[b], cu[b + 1]
    and the launch's grid x (batch + chunks)."""
    if tile == tiles_of(cu[b + 1] - cu[b]) - 1:
        return b
    return grid_x - 1 - (cu[b] + TILE_TOKENS * (tile + 1)) // TILE_TOKENS


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


def _v_byte(key, col):
    """LDS byte of V[key][col]: 16-byte chunk col / 8 XOR-swizzled by 2 (key % 4), so the 4 keys one 16-lane
    ds_read_b64_tr_b16 pass reads land their 8 chunks on distinct banks."""
    return key * ROW_BYTES + ((col // 8) ^ ((key % 4) * 2)) * 16 + (col % 8) * 2


def _issue(pb, blk, ok, *, rsrcs, h, kv_row, tid, L):
    """Start the global loads of K/V block `blk` (cache block `pb`) into registers: zeros for keys past L or
    when not `ok` (past the tile's last block). -> (K vectors, V vectors), one per chunk of this thread."""
    _, _, _, key_cache, value_cache = rsrcs
    block_bytes = BLOCK * kv_row
    base = fx.Int64(pb) * block_bytes
    k_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
        fx.add_offset(fx.get_iter(key_cache), base // 2), num_records_bytes=fx.Int64(block_bytes)))
    v_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
        fx.add_offset(fx.get_iter(value_cache), base // 2), num_records_bytes=fx.Int64(block_bytes)))
    kin, vin = [], []
    for u in range(CHUNKS // THREADS):
        c = tid + u * THREADS
        key = c // 8
        off = (ok & (blk * BLOCK + key < L)).select(key * kv_row + h * ROW_BYTES + (c % 8) * 16, _i32(OOB))
        kin.append(buffer.load_x4(k_rsrc, off))
        vin.append(buffer.load_x4(v_rsrc, off))
    return kin, vin


def _table(rsrcs, blk):
    """Block table entry `blk` of the sequence, as loaded (a VGPR; made wave-uniform where it is used)."""
    bt_rsrc, b, max_blocks, _, _ = rsrcs
    return kd._dword(bt_rsrc, (b * max_blocks + blk) * 4)


def _block(state, blk, masked, *, lds, rsrcs, h, kv_row, lane, tid, L, pos, wpos, window, qops, sink2, blk_hi):
    """One 64-key block: store its K/V (loaded during the previous block) to LDS (whole workgroup), start the
    next block's loads, then this wave's columns. `masked` (Python bool) compiles the position compares (edge
    blocks only) and skips, per wave, the MFMAs of the 16-key tiles no row of the wave keeps (wpos: the wave's
    first and last query position). -> (m_run, l_run, o_acc, next block's K, V, the block after's table
    entry)."""
    m_run, l_run, o_acc, kin, vin, pb_next = state
    kbuf, vbuf = lds
    g = lane // 16
    i = lane % 16
    key0 = blk * BLOCK
    gpu.barrier()  # every wave is done with the previous block's LDS
    for u in range(CHUNKS // THREADS):
        c = tid + u * THREADS
        key = c // 8
        part = c % 8
        fx.ptr_store(kin[u], kbuf + fx.Int64((key * ROW_BYTES + ((part ^ (key % 8)) * 16)) // 4))
        fx.ptr_store(vin[u], vbuf + fx.Int64(_v_byte(key, part * 8) // 4))
    gpu.barrier()
    # prefetch: the next block's K/V and the table entry of the one after, in flight during this block's math
    kin, vin = _issue(wave.uniform_i32(pb_next), blk + 1, blk + 1 < blk_hi, rsrcs=rsrcs, h=h, kv_row=kv_row,
                      tid=tid, L=L)
    pb_next = _table(rsrcs, blk + 2)
    # K operands: tile t = keys 16 t + i, dims 8 g .. and 32 + 8 g .. (swizzled chunk g ^ key % 8)
    kops = []
    for t in range(4):
        key = t * 16 + i
        sw = key % 8
        lo = fx.ptr_load(kbuf + fx.Int64((key * ROW_BYTES + (g ^ sw) * 16) // 4), result_type=T.i32x4)
        hi = fx.ptr_load(kbuf + fx.Int64((key * ROW_BYTES + ((g + 4) ^ sw) * 16) // 4), result_type=T.i32x4)
        kops.append((fx.Vector(lo), fx.Vector(hi)))
    # V^T operands of the 32x32x16 P V for 16-key tile t and dims 32 dh ..: lane l holds dim 32 dh + l % 32,
    # keys 16 t + 8 (l / 32) .. + 7 (two transposing reads of 4 keys), the same for every column
    vops = []
    for t in range(4):
        row = []
        for dh in range(2):
            key_a = t * 16 + (g // 2) * 8 + (i // 4)
            col = dh * 32 + (g % 2) * 16 + 4 * (i % 4)
            lo = kd._read_tr(vbuf, _v_byte(key_a, col))
            hi = kd._read_tr(vbuf, _v_byte(key_a + 4, col))
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
            s_all.append(_if(need[t], [T.f32x4] * COLS, lambda t=t: scores(t),
                             lambda: [mfma.zeros() for _ in range(COLS)]))
        else:
            s_all.append(scores(t))
    m_new_all, l_new_all, alpha_all, p_all = [], [], [], []
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
        alpha_all.append(alpha)
        # P^T of tile t, this lane's 4 keys 4 g .. 4 g + 3 for column i of group c, as 4 bf16 (2 dwords)
        p_all.append([fx.Vector.from_elements(ps[4 * t: 4 * t + 4], fx.Float32).to(fx.BFloat16).bitcast(fx.Int32)
                      for t in range(4)])
    # O^T[dims, 32 columns] in two 32x32 accumulators: lane l holds column l % 32, i.e. group (l / 16) % 2
    odd = g % 2 == 1
    alpha_o = odd.select(alpha_all[1], alpha_all[0])
    o_new = [[o_acc[0][dh] * alpha_o for dh in range(2)]]

    def pv(t, o):
        # the B operand (keys 8 (l / 32) .. + 7 of tile t, column l % 32): lanes 16-31 / 48-63 trade group 0's
        # keys 4-7 / 12-15 for group 1's keys 0-3 / 8-11 with lanes 0-15 / 32-47 (v_permlane16_swap)
        words = []
        for k in range(2):
            words.append(_swap16(p_all[0][t][k], p_all[1][t][k]))
        p_op = fx.Vector.from_elements([words[0][0], words[1][0], words[0][1], words[1][1]], fx.Int32)
        return [[mfma.bf16_32x32x16(vops[t][dh], p_op, o[0][dh]) for dh in range(2)]]

    for t in range(4):
        if masked:  # a 16-key tile no row of the wave keeps adds nothing (p = 0): skipped
            o_new = _if_keep(need[t], lambda t=t, o=o_new: pv(t, o), o_new)
        else:
            o_new = pv(t, o_new)
    return m_new_all, l_new_all, o_new, kin, vin, pb_next


def _swap16(a, b):
    """v_permlane16_swap: 16-lane rows 1 and 3 of `a` trade places with rows 0 and 2 of `b` -> (a', b')."""
    pair = ir.Type.parse("!llvm.struct<(i32, i32)>")
    res = rocdl.permlane16_swap(pair, fx.as_ir_value(fx.Int32(a)), fx.as_ir_value(fx.Int32(b)), False, False)
    return fx.Int32(llvm.extractvalue(T.i32, res, [0])), fx.Int32(llvm.extractvalue(T.i32, res, [1]))


def build(kv_heads: int, window: int):
    """Launcher `attend(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out, batch,
    max_blocks, chunks)`: one launch, grid (batch + chunks, KV heads); chunks = chunks_of(query rows)."""
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
                  batch: fx.Int32, max_blocks: fx.Int32, chunks: fx.Int32):
        tid = fx.thread_idx.x
        lane, w = wave.lane_and_wave(tid, WAVES)
        g = lane // 16
        i = lane % 16  # column: token i // 8 of the group, head i % 8
        x = fx.block_idx.x
        h = fx.block_idx.y
        lds = fx.SharedAllocator().allocate(Lds).peek()
        kbuf = lds.k.ptr
        vbuf = lds.v.ptr

        # Which Q tile (see tile_of_workgroup, the host twin): x < batch is sequence x's last tile; x >= batch
        # is 32-row chunk c of the batch's rows (the last chunk first), which holds the start of at most one
        # other tile: tile k of the sequence owning row 32 c when 32 (k + 1) lands in [32 c - row0, + 32).
        meta = buffer.tensor_resource(cu_seqlens_q, (fx.Int64(batch) + 1) * 4)
        last = x < batch
        r = (batch + chunks - 1 - x) * TILE_TOKENS  # first row of the chunk
        # the sequence owning row r: (cu_seqlens_q entries <= r) - 1, counted by every wave on its own
        rounds = last.select(_i32(0), (batch + COUNT_ROUND) // COUNT_ROUND)
        cnt = _i32(0)
        for it in range(rounds):
            for u in range_constexpr(COUNT_ROUND // wave.WAVE):
                j = it * COUNT_ROUND + u * wave.WAVE + lane
                cu_j = kd._dword(meta, j * 4)
                cnt = cnt + ((j <= batch) & (cu_j <= r)).select(_i32(1), _i32(0))
        cnt = wave.wave_sum(cnt)
        b = kd._uniform(last.select(x, fx.min(cnt - 1, batch - 1)))
        q_lo = kd._uniform(kd._dword(meta, b * 4))
        q_hi = kd._uniform(kd._dword(meta, b * 4 + 4))
        L = kd._uniform(kd._dword(buffer.tensor_resource(seq_lens, fx.Int64(batch) * 4), b * 4))
        ql = q_hi - q_lo
        nt = (ql + (TILE_TOKENS - 1)) // TILE_TOKENS
        k1 = (r - q_lo + (TILE_TOKENS - 1)) // TILE_TOKENS  # chunk workgroups: tile k1 - 1 (r >= q_lo)
        tile = last.select(nt - 1, k1 - 1)
        real = (last & (ql > 1)) | ((x >= batch) & (r > q_lo) & (k1 * TILE_TOKENS < ql))
        if real & (ql <= L):
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
            qops, pos = [], []
            for c in range_constexpr(COLS):
                tok = tok0 + w * WAVE_TOKENS + c * 2 + i // 8
                pos.append(pos_base + tok)
                off = (tok < ql).select(((q_lo + tok) * Hq + head) * ROW_BYTES + g * 16, _i32(OOB))
                qops.append((buffer.load_x4(q_rsrc, off), buffer.load_x4(q_rsrc, off + 64)))
            bt_rsrc = buffer.tensor_resource(block_table, (fx.Int64(b) + 1) * fx.Int64(max_blocks) * 4)
            wpos0 = pos_base + tok0 + w * WAVE_TOKENS  # this wave's query positions (wave-uniform)
            ctx = dict(lds=(kbuf, vbuf), rsrcs=(bt_rsrc, b, max_blocks, key_cache, value_cache), h=h,
                       kv_row=kv_row, lane=lane, tid=tid, L=L, pos=pos, wpos=(wpos0, wpos0 + WAVE_TOKENS - 1),
                       window=window, qops=qops, sink2=sink2, blk_hi=blk_hi)

            m_run = [sink2 for _ in range_constexpr(COLS)]
            l_run = [fx.Float32(0.0) for _ in range_constexpr(COLS)]
            o_acc = [[mfma.zeros32() for _ in range_constexpr(2)]]  # O^T dims 0-31, 32-63 x 32 columns
            # the first block's K/V loads and the second's table entry (each block prefetches the next)
            kin, vin = _issue(wave.uniform_i32(_table(ctx["rsrcs"], blk_lo)), blk_lo, blk_lo < blk_hi,
                              rsrcs=ctx["rsrcs"], h=h, kv_row=kv_row, tid=tid, L=L)
            pb_next = _table(ctx["rsrcs"], blk_lo + 1)
            for blk in range(blk_lo, mid_lo):  # window start: edge blocks
                m_run, l_run, o_acc, kin, vin, pb_next = _block((m_run, l_run, o_acc, kin, vin, pb_next), blk,
                                                                True, **ctx)
            for blk in range(mid_lo, mid_hi):  # every key inside every query's range
                m_run, l_run, o_acc, kin, vin, pb_next = _block((m_run, l_run, o_acc, kin, vin, pb_next), blk,
                                                                False, **ctx)
            for blk in range(mid_hi, blk_hi):  # causal diagonal: edge blocks
                m_run, l_run, o_acc, kin, vin, pb_next = _block((m_run, l_run, o_acc, kin, vin, pb_next), blk,
                                                                True, **ctx)

            o_rsrc = buffer.tensor_resource(out, fx.Int64(q_hi) * (Hq * ROW_BYTES))
            inv = []
            for c in range_constexpr(COLS):
                l_tot = l_run[c] + kd._bpermute_f32(l_run[c], (lane + 16) % 64)
                l_tot = l_tot + kd._bpermute_f32(l_tot, (lane + 32) % 64)
                l_tot = l_tot + kd._exp2(sink2 - m_run[c])
                inv.append(1.0 / l_tot)
            # lane l holds column l % 32 of O^T: group (l / 16) % 2, token 2 group + i / 8, head i % 8
            odd = g % 2 == 1
            tok = tok0 + w * WAVE_TOKENS + (g % 2) * 2 + i // 8
            row_ok = tok < ql
            for dh in range_constexpr(2):
                y = (o_acc[0][dh] * odd.select(inv[1], inv[0])).to(fx.BFloat16).bitcast(fx.Int32)
                for q4 in range_constexpr(4):  # registers 4 q4 .. + 3: dims 32 dh + 8 q4 + 4 (l / 32) .. + 3
                    off = row_ok.select(((q_lo + tok) * Hq + head) * ROW_BYTES
                                        + (dh * 32 + q4 * 8 + (g // 2) * 4) * 2, _i32(OOB))
                    buffer.store(y.shuffle(y, [2 * q4, 2 * q4 + 1]), o_rsrc, off)

    @flyc.jit
    def attend(q: fx.Tensor, key_cache: fx.Tensor, value_cache: fx.Tensor, cu_seqlens_q: fx.Tensor,
               seq_lens: fx.Tensor, block_table: fx.Tensor, sinks: fx.Tensor, out: fx.Tensor, batch: fx.Int32,
               max_blocks: fx.Int32, chunks: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        k_prefill(q, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table, sinks, out, batch,
                  max_blocks, chunks).launch(grid=(batch + chunks, Hkv, 1), block=(THREADS, 1, 1), stream=stream)

    def example(batch: int = 1):
        return (torch.zeros(2, Hq, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(2, BLOCK, Hkv, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(2, BLOCK, Hkv, HEAD_DIM, dtype=torch.bfloat16),
                torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32),
                torch.zeros(batch, 1, dtype=torch.int32), torch.zeros(Hq, dtype=torch.float32),
                torch.zeros(2, Hq, HEAD_DIM, dtype=torch.bfloat16), batch, 1, 1, fx.Stream(None))

    return attend, example
