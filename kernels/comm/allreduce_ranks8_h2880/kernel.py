"""TP8 all-reduce of bf16 rows of 2880, alone or fused with the residual add and RMSNorm (+ MXFP8), on MI355X.

One-stage algorithm: every rank's partial rows sit in its registered (IPC) input buffer; workgroup b of
every rank owns token row b (and rows b + 512, b + 1024, ... above 512 rows, one after another): it waits
until all 8 ranks have published their rows for this call, reads the row from all 8 buffers, sums in fp32
in rank order 0..7 (so every rank computes the same bits), rounds to bf16 and writes its own outputs (all
ranks write the full result). Then a closing barrier: the workgroup tells every peer it has finished reading
their row and waits until every peer has done the same, so no rank can overwrite its input buffer (the next
call's copy) while a peer may still read it.

Flags (int32, in each rank's uncached signal buffer of SIGNAL_SLOTS, allocated by comm/communicator.py):
  start[b][r]  rank r has published workgroup b's row for epoch e (written by rank r into every rank's buffer)
  end[b][r]    rank r has finished reading that row (same)
  epoch[b]     the last epoch workgroup b of this rank completed (only this rank writes it)
For each row, workgroup b reads epoch[b] + 1 and waits for flags *equal* to it, so a flag left by an older
call never satisfies a wait and no flag is ever reset: CUDA-graph replays (same kernel arguments every
time) see fresh epochs. Stores of flags are release/system-scope, loads acquire/system-scope; no atomics.
Every rank must call with the same token count M (the same workgroups run everywhere).

The two-stage kernels (large M; the section "Two-stage" below) sum each row the same way on its owner rank
and gather the bf16 sums, so a row's bits are the same in both tiers.

Launchers (every tensor row-major and contiguous; M the runtime token count; blocks = grid_blocks(M)):
  allreduce(x0..x7, s0..s7, me, out, M, rank, blocks, stream)
  fused_add_rmsnorm(x0..x7, s0..s7, me, residual, weight, out, residual_out, M, rank, eps, blocks, stream)
  fused_add_rmsnorm_mxfp8(x0..x7, s0..s7, me, residual, weight, q, scales, residual_out, M, rank, eps, blocks,
                          stream)
  allreduce_two_stage / fused_add_rmsnorm_two_stage / fused_add_rmsnorm_mxfp8_two_stage: the same with the 8
  sums buffers y0..y7 and ymine = y_rank after `me`, and (blocks, ngroups) = (grid_blocks_two_stage(M),
  groups(M)) in place of blocks
with x_r: rank r's input buffer as mapped here (bf16 [capacity, 2880], rows 0..M-1 live), s_r: rank r's signal
buffer (int32), me = s_rank; residual, out, residual_out bf16 [M, 2880]; weight bf16 [2880]; q float8_e4m3fn
[M, 2880]; scales uint8 [M, 90].

Per-row design: one wave per row, as norm/rmsnorm_h2880's decode tier (and its row helpers): lane l holds
16-byte vectors l, l+64, ... of the row (6 slots, the last 40 lanes live, the descriptor bounded to the row
so idle lanes read zeros and drop stores); the row sum of squares is a DPP reduction.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr import range_constexpr, rocdl

from amd_kernels.common import bf16, buffer, wave
from amd_kernels.norm.rmsnorm_h2880 import kernel as rms  # the row helpers of the same hidden size

H = rms.H
RANKS = 8
ELEM_BYTES = 2
SLOTS, SLOT_BYTES, SCALES = rms.SLOTS, rms.SLOT_BYTES, rms.SCALES
LANES = wave.WAVE

# Signal buffer layout (int32 slots), for up to MAX_BLOCKS workgroups of one call.
MAX_BLOCKS = 512
START = 0
END = START + MAX_BLOCKS * RANKS
EPOCH = END + MAX_BLOCKS * RANKS
READY = EPOCH + MAX_BLOCKS  # two-stage: ready[b][r] = rank r has stored its summed row of workgroup b's group
SIGNAL_SLOTS = READY + MAX_BLOCKS * RANKS
SLEEP = 1  # s_sleep 1 = 64 clocks between polls


def grid_blocks(m: int) -> int:
    """One-stage workgroups: one per row up to MAX_BLOCKS; beyond, workgroup b takes rows b, b + blocks, ..."""
    return max(1, min(m, MAX_BLOCKS))


def groups(m: int) -> int:
    """Two-stage row groups: group g is rows 8g .. 8g + 7, row 8g + r summed by rank r."""
    return (m + RANKS - 1) // RANKS


def grid_blocks_two_stage(m: int) -> int:
    """Two-stage workgroups: one per group up to MAX_BLOCKS; beyond, workgroup b takes groups b, b + blocks, ..."""
    return max(1, min(groups(m), MAX_BLOCKS))

_ACQ, _REL = fx.AtomicOrdering.Acquire, fx.AtomicOrdering.Release
_SYSTEM = "one-as"


def _at(t, index):
    return fx.add_offset(fx.get_iter(t), fx.Int64(index))


def _publish(sigs, slot, value):
    """Store `value` to int32 `slot` of every rank's signal buffer (release, system scope)."""
    for s in sigs:
        fx.generic_store(_at(s, slot), value, memory_order=_REL, syncscope=_SYSTEM)


def _wait_all(me, first_slot, value):
    """Spin (sleeping between polls) until slots first_slot .. +7 of my signal buffer all equal `value`."""
    for r in range_constexpr(RANKS):
        v = fx.generic_load(_at(me, first_slot + r), memory_order=_ACQ, syncscope=_SYSTEM)
        while v != value:
            rocdl.s_sleep(SLEEP)
            v = fx.generic_load(_at(me, first_slot + r), memory_order=_ACQ, syncscope=_SYSTEM)


# A helper's dynamic `while` needs FlyDSL's AST rewrite, which @flyc.kernel applies only to the kernel body.
_wait_all = ASTRewriter.transform(_wait_all)


def _start(sigs, me, wg, rank):
    """The opening barrier of workgroup `wg`: returns this row's epoch once every rank has published it."""
    epoch = fx.generic_load(_at(me, EPOCH + wg)) + 1
    _publish(sigs, START + wg * RANKS + rank, epoch)
    _wait_all(me, START + wg * RANKS, epoch)
    return epoch


def _finish(sigs, me, wg, rank, epoch):
    """The closing barrier: every rank has read this row of every input buffer; then record the epoch."""
    _publish(sigs, END + wg * RANKS + rank, epoch)
    _wait_all(me, END + wg * RANKS, epoch)
    fx.generic_store(_at(me, EPOCH + wg), epoch)


def _ready(sigs, me, wg, rank, epoch):
    """Two-stage middle barrier: every rank has stored its summed row of this group (so every rank has also
    finished reading this group's rows of every input buffer); then record the epoch."""
    _publish(sigs, READY + wg * RANKS + rank, epoch)
    _wait_all(me, READY + wg * RANKS, epoch)
    fx.generic_store(_at(me, EPOCH + wg), epoch)


def _store_row(s, dst_t, row, lane):
    dst = buffer.row_resource(dst_t, row, H, ELEM_BYTES)
    for j in range_constexpr(SLOTS):
        buffer.store(s[j], dst, lane * buffer.VEC_BYTES + j * SLOT_BYTES)


def _gathered_row(y_t, row, lane):
    """A summed bf16 row from the rank that owns it (its registered sums buffer), packed slots."""
    return rms._load_row(buffer.row_resource(y_t, row, H, ELEM_BYTES), lane)


def _sum_row(xs, row, lane):
    """The row summed over the 8 input buffers in fp32, rank order 0..7, rounded to bf16 (packed slots)."""
    rsrcs = [buffer.row_resource(x, row, H, ELEM_BYTES) for x in xs]
    summed = []
    for j in range_constexpr(SLOTS):
        off = lane * buffer.VEC_BYTES + j * SLOT_BYTES
        parts = [buffer.load_x4(rs, off) for rs in rsrcs]
        acc = bf16.unpack(parts[0])
        for r in range_constexpr(1, RANKS):
            acc = acc + bf16.unpack(parts[r])
        summed.append(bf16.pack(acc))
    return summed


def _add_residual(s, res_t, res_out_t, row, lane):
    """new residual = bf16(sum + residual) (fp32 add), stored to residual_out; returns it (packed slots)."""
    res = buffer.row_resource(res_t, row, H, ELEM_BYTES)
    res_out = buffer.row_resource(res_out_t, row, H, ELEM_BYTES)
    out = []
    for j in range_constexpr(SLOTS):
        off = lane * buffer.VEC_BYTES + j * SLOT_BYTES
        r = bf16.pack(bf16.unpack(s[j]) + bf16.unpack(buffer.load_x4(res, off)))
        buffer.store(r, res_out, off)
        out.append(r)
    return out


def _weight(w_t, lane):
    return rms._load_row(buffer.tensor_resource(w_t, H * ELEM_BYTES), lane)


KW = {"known_block_size": [LANES, 1, 1]}


@flyc.kernel(name=f"allreduce_ranks{RANKS}_h{H}", **KW)
def k_allreduce(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, out: fx.Tensor, m: fx.Int32, rank: fx.Int32, blocks: fx.Int32,
):
    lane, wg = fx.thread_idx.x % LANES, fx.block_idx.x
    xs, sigs = (x0, x1, x2, x3, x4, x5, x6, x7), (s0, s1, s2, s3, s4, s5, s6, s7)
    for row in range(wg, m, blocks):
        epoch = _start(sigs, me, wg, rank)
        s = _sum_row(xs, row, lane)
        dst = buffer.row_resource(out, row, H, ELEM_BYTES)
        for j in range_constexpr(SLOTS):
            buffer.store(s[j], dst, lane * buffer.VEC_BYTES + j * SLOT_BYTES)
        _finish(sigs, me, wg, rank, epoch)


@flyc.kernel(name=f"allreduce_fused_add_rmsnorm_ranks{RANKS}_h{H}", **KW)
def k_fused(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, residual: fx.Tensor, weight: fx.Tensor, out: fx.Tensor,
    residual_out: fx.Tensor, m: fx.Int32, rank: fx.Int32, eps: fx.Float32, blocks: fx.Int32,
):
    lane, wg = fx.thread_idx.x % LANES, fx.block_idx.x
    xs, sigs = (x0, x1, x2, x3, x4, x5, x6, x7), (s0, s1, s2, s3, s4, s5, s6, s7)
    ws = _weight(weight, lane)
    for row in range(wg, m, blocks):
        epoch = _start(sigs, me, wg, rank)
        s = _sum_row(xs, row, lane)
        _finish(sigs, me, wg, rank, epoch)  # the peers' rows are in registers: release the buffers early
        r = _add_residual(s, residual, residual_out, row, lane)
        rms._store_bf16(lane, row, r, ws, rms._rstd(r, eps), out)


@flyc.kernel(name=f"allreduce_fused_add_rmsnorm_mxfp8_ranks{RANKS}_h{H}", **KW)
def k_fused_mx(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, residual: fx.Tensor, weight: fx.Tensor, q: fx.Tensor,
    scales: fx.Tensor, residual_out: fx.Tensor, m: fx.Int32, rank: fx.Int32, eps: fx.Float32, blocks: fx.Int32,
):
    lane, wg = fx.thread_idx.x % LANES, fx.block_idx.x
    xs, sigs = (x0, x1, x2, x3, x4, x5, x6, x7), (s0, s1, s2, s3, s4, s5, s6, s7)
    ws = _weight(weight, lane)
    for row in range(wg, m, blocks):
        epoch = _start(sigs, me, wg, rank)
        s = _sum_row(xs, row, lane)
        _finish(sigs, me, wg, rank, epoch)
        r = _add_residual(s, residual, residual_out, row, lane)
        rms._store_mxfp8(lane, row, r, ws, rms._rstd(r, eps), q, scales)


@flyc.jit
def allreduce(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, out: fx.Tensor, m: fx.Int32, rank: fx.Int32, blocks: fx.Int32,
    stream: fx.Stream = fx.Stream(None),
):
    k_allreduce(x0, x1, x2, x3, x4, x5, x6, x7, s0, s1, s2, s3, s4, s5, s6, s7, me, out, m, rank, blocks).launch(
        grid=(blocks, 1, 1), block=(LANES, 1, 1), stream=stream
    )


@flyc.jit
def fused_add_rmsnorm(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, residual: fx.Tensor, weight: fx.Tensor, out: fx.Tensor,
    residual_out: fx.Tensor, m: fx.Int32, rank: fx.Int32, eps: fx.Float32, blocks: fx.Int32,
    stream: fx.Stream = fx.Stream(None),
):
    k_fused(
        x0, x1, x2, x3, x4, x5, x6, x7, s0, s1, s2, s3, s4, s5, s6, s7, me, residual, weight, out, residual_out,
        m, rank, eps, blocks,
    ).launch(grid=(blocks, 1, 1), block=(LANES, 1, 1), stream=stream)


@flyc.jit
def fused_add_rmsnorm_mxfp8(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, residual: fx.Tensor, weight: fx.Tensor, q: fx.Tensor,
    scales: fx.Tensor, residual_out: fx.Tensor, m: fx.Int32, rank: fx.Int32, eps: fx.Float32, blocks: fx.Int32,
    stream: fx.Stream = fx.Stream(None),
):
    k_fused_mx(
        x0, x1, x2, x3, x4, x5, x6, x7, s0, s1, s2, s3, s4, s5, s6, s7, me, residual, weight, q, scales,
        residual_out, m, rank, eps, blocks,
    ).launch(grid=(blocks, 1, 1), block=(LANES, 1, 1), stream=stream)


# ---- Two-stage (large M): reduce-scatter of rows, then all-gather of the summed bf16 rows ------------------
# Workgroup b of every rank takes row groups g = b, b + blocks, ... (group g = rows 8g .. 8g + 7). For each:
# opening barrier (start[b], as one-stage: every rank's input buffer holds this call's rows); rank r sums row
# 8g + r exactly as the one-stage kernel sums a row (fp32, rank order 0..7, bf16 once) and stores it in its
# registered sums buffer y_r; middle barrier (ready[b]); then every rank reads the group's 8 summed rows from
# their owners' sums buffers and runs the same residual add / norm code as one-stage on each. The bits of a
# row are therefore those of the one-stage tier, whatever the tier.
# Buffer reuse: the ready barrier means every owner has finished reading this group's input rows, so when
# this rank's launch completes no peer still reads its input buffer (the next call may overwrite it). A sums
# row is rewritten only by a later launch after its opening barrier, which every peer passes only once its
# previous launch (all its reads of the sums buffers) has completed (launches of one rank run in stream order).


@flyc.kernel(name=f"allreduce_two_stage_ranks{RANKS}_h{H}", **KW)
def k_allreduce2(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, y0: fx.Tensor, y1: fx.Tensor, y2: fx.Tensor, y3: fx.Tensor,
    y4: fx.Tensor, y5: fx.Tensor, y6: fx.Tensor, y7: fx.Tensor, ymine: fx.Tensor,
    out: fx.Tensor, m: fx.Int32, rank: fx.Int32, blocks: fx.Int32, ngroups: fx.Int32,
):
    lane, wg = fx.thread_idx.x % LANES, fx.block_idx.x
    xs, sigs = (x0, x1, x2, x3, x4, x5, x6, x7), (s0, s1, s2, s3, s4, s5, s6, s7)
    ys = (y0, y1, y2, y3, y4, y5, y6, y7)
    for g in range(wg, ngroups, blocks):
        epoch = _start(sigs, me, wg, rank)
        own = g * RANKS + rank
        if own < m:
            _store_row(_sum_row(xs, own, lane), ymine, own, lane)
        _ready(sigs, me, wg, rank, epoch)
        for o in range_constexpr(RANKS):
            row = g * RANKS + o
            if row < m:
                _store_row(_gathered_row(ys[o], row, lane), out, row, lane)


@flyc.kernel(name=f"allreduce_fused_add_rmsnorm_two_stage_ranks{RANKS}_h{H}", **KW)
def k_fused2(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, y0: fx.Tensor, y1: fx.Tensor, y2: fx.Tensor, y3: fx.Tensor,
    y4: fx.Tensor, y5: fx.Tensor, y6: fx.Tensor, y7: fx.Tensor, ymine: fx.Tensor,
    residual: fx.Tensor, weight: fx.Tensor, out: fx.Tensor, residual_out: fx.Tensor, m: fx.Int32, rank: fx.Int32,
    eps: fx.Float32, blocks: fx.Int32, ngroups: fx.Int32,
):
    lane, wg = fx.thread_idx.x % LANES, fx.block_idx.x
    xs, sigs = (x0, x1, x2, x3, x4, x5, x6, x7), (s0, s1, s2, s3, s4, s5, s6, s7)
    ys = (y0, y1, y2, y3, y4, y5, y6, y7)
    ws = _weight(weight, lane)
    for g in range(wg, ngroups, blocks):
        epoch = _start(sigs, me, wg, rank)
        own = g * RANKS + rank
        if own < m:
            _store_row(_sum_row(xs, own, lane), ymine, own, lane)
        _ready(sigs, me, wg, rank, epoch)
        for o in range_constexpr(RANKS):
            row = g * RANKS + o
            if row < m:
                r = _add_residual(_gathered_row(ys[o], row, lane), residual, residual_out, row, lane)
                rms._store_bf16(lane, row, r, ws, rms._rstd(r, eps), out)


@flyc.kernel(name=f"allreduce_fused_add_rmsnorm_mxfp8_two_stage_ranks{RANKS}_h{H}", **KW)
def k_fused_mx2(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, y0: fx.Tensor, y1: fx.Tensor, y2: fx.Tensor, y3: fx.Tensor,
    y4: fx.Tensor, y5: fx.Tensor, y6: fx.Tensor, y7: fx.Tensor, ymine: fx.Tensor,
    residual: fx.Tensor, weight: fx.Tensor, q: fx.Tensor, scales: fx.Tensor, residual_out: fx.Tensor, m: fx.Int32,
    rank: fx.Int32, eps: fx.Float32, blocks: fx.Int32, ngroups: fx.Int32,
):
    lane, wg = fx.thread_idx.x % LANES, fx.block_idx.x
    xs, sigs = (x0, x1, x2, x3, x4, x5, x6, x7), (s0, s1, s2, s3, s4, s5, s6, s7)
    ys = (y0, y1, y2, y3, y4, y5, y6, y7)
    ws = _weight(weight, lane)
    for g in range(wg, ngroups, blocks):
        epoch = _start(sigs, me, wg, rank)
        own = g * RANKS + rank
        if own < m:
            _store_row(_sum_row(xs, own, lane), ymine, own, lane)
        _ready(sigs, me, wg, rank, epoch)
        for o in range_constexpr(RANKS):
            row = g * RANKS + o
            if row < m:
                r = _add_residual(_gathered_row(ys[o], row, lane), residual, residual_out, row, lane)
                rms._store_mxfp8(lane, row, r, ws, rms._rstd(r, eps), q, scales)


@flyc.jit
def allreduce_two_stage(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, y0: fx.Tensor, y1: fx.Tensor, y2: fx.Tensor, y3: fx.Tensor,
    y4: fx.Tensor, y5: fx.Tensor, y6: fx.Tensor, y7: fx.Tensor, ymine: fx.Tensor,
    out: fx.Tensor, m: fx.Int32, rank: fx.Int32, blocks: fx.Int32, ngroups: fx.Int32,
    stream: fx.Stream = fx.Stream(None),
):
    k_allreduce2(x0, x1, x2, x3, x4, x5, x6, x7, s0, s1, s2, s3, s4, s5, s6, s7, me, y0, y1, y2, y3, y4, y5, y6, y7, ymine, out, m, rank, blocks, ngroups).launch(
        grid=(blocks, 1, 1), block=(LANES, 1, 1), stream=stream
    )


@flyc.jit
def fused_add_rmsnorm_two_stage(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, y0: fx.Tensor, y1: fx.Tensor, y2: fx.Tensor, y3: fx.Tensor,
    y4: fx.Tensor, y5: fx.Tensor, y6: fx.Tensor, y7: fx.Tensor, ymine: fx.Tensor,
    residual: fx.Tensor, weight: fx.Tensor, out: fx.Tensor, residual_out: fx.Tensor, m: fx.Int32, rank: fx.Int32,
    eps: fx.Float32, blocks: fx.Int32, ngroups: fx.Int32, stream: fx.Stream = fx.Stream(None),
):
    k_fused2(x0, x1, x2, x3, x4, x5, x6, x7, s0, s1, s2, s3, s4, s5, s6, s7, me, y0, y1, y2, y3, y4, y5, y6, y7, ymine, residual, weight, out, residual_out, m, rank, eps, blocks, ngroups).launch(
        grid=(blocks, 1, 1), block=(LANES, 1, 1), stream=stream
    )


@flyc.jit
def fused_add_rmsnorm_mxfp8_two_stage(
    x0: fx.Tensor, x1: fx.Tensor, x2: fx.Tensor, x3: fx.Tensor, x4: fx.Tensor, x5: fx.Tensor, x6: fx.Tensor,
    x7: fx.Tensor, s0: fx.Tensor, s1: fx.Tensor, s2: fx.Tensor, s3: fx.Tensor, s4: fx.Tensor, s5: fx.Tensor,
    s6: fx.Tensor, s7: fx.Tensor, me: fx.Tensor, y0: fx.Tensor, y1: fx.Tensor, y2: fx.Tensor, y3: fx.Tensor,
    y4: fx.Tensor, y5: fx.Tensor, y6: fx.Tensor, y7: fx.Tensor, ymine: fx.Tensor,
    residual: fx.Tensor, weight: fx.Tensor, q: fx.Tensor, scales: fx.Tensor, residual_out: fx.Tensor, m: fx.Int32,
    rank: fx.Int32, eps: fx.Float32, blocks: fx.Int32, ngroups: fx.Int32, stream: fx.Stream = fx.Stream(None),
):
    k_fused_mx2(x0, x1, x2, x3, x4, x5, x6, x7, s0, s1, s2, s3, s4, s5, s6, s7, me, y0, y1, y2, y3, y4, y5, y6, y7, ymine, residual, weight, q, scales, residual_out, m, rank, eps, blocks, ngroups).launch(
        grid=(blocks, 1, 1), block=(LANES, 1, 1), stream=stream
    )


# Example arguments (M = 1 CPU tensors): shapes are dynamic in the compiled code, so one specialization
# serves every M and every rank (the buffers' addresses are arguments).
_EPS = 1e-5


def _bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def _common(m):
    xs = [_bf16(m, H) for _ in range(RANKS)]
    sigs = [torch.zeros(SIGNAL_SLOTS, dtype=torch.int32) for _ in range(RANKS)]
    return (*xs, *sigs, sigs[0])


def _common2(m):
    ys = [_bf16(m, H) for _ in range(RANKS)]
    return (*_common(m), *ys, ys[0])


def _two(m):
    return (grid_blocks_two_stage(m), groups(m))


def _args_allreduce2(m: int = 1):
    return (*_common2(m), _bf16(m, H), m, 0, *_two(m))


def _args_fused2(m: int = 1):
    return (*_common2(m), _bf16(m, H), _bf16(H), _bf16(m, H), _bf16(m, H), m, 0, _EPS, *_two(m))


def _args_fused_mx2(m: int = 1):
    q = torch.zeros(m, H, dtype=torch.float8_e4m3fn)
    s = torch.zeros(m, SCALES, dtype=torch.uint8)
    return (*_common2(m), _bf16(m, H), _bf16(H), q, s, _bf16(m, H), m, 0, _EPS, *_two(m))


def _args_allreduce(m: int = 1):
    return (*_common(m), _bf16(m, H), m, 0, grid_blocks(m))


def _args_fused(m: int = 1):
    return (*_common(m), _bf16(m, H), _bf16(H), _bf16(m, H), _bf16(m, H), m, 0, _EPS, grid_blocks(m))


def _args_fused_mx(m: int = 1):
    q = torch.zeros(m, H, dtype=torch.float8_e4m3fn)
    s = torch.zeros(m, SCALES, dtype=torch.uint8)
    return (*_common(m), _bf16(m, H), _bf16(H), q, s, _bf16(m, H), m, 0, _EPS, grid_blocks(m))


VARIANTS = {
    "allreduce.one_stage": (allreduce, _args_allreduce),
    "allreduce_fused_add_rmsnorm.one_stage": (fused_add_rmsnorm, _args_fused),
    "allreduce_fused_add_rmsnorm_mxfp8.one_stage": (fused_add_rmsnorm_mxfp8, _args_fused_mx),
    "allreduce.two_stage": (allreduce_two_stage, _args_allreduce2),
    "allreduce_fused_add_rmsnorm.two_stage": (fused_add_rmsnorm_two_stage, _args_fused2),
    "allreduce_fused_add_rmsnorm_mxfp8.two_stage": (fused_add_rmsnorm_mxfp8_two_stage, _args_fused_mx2),
}
