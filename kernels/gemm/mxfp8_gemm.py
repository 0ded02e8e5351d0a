"""MXFP8 x MXFP8 GEMM with preshuffled weights, y[M, N] = x @ w^T + bias (bf16 out, fp32 accumulation).

Shared by the packages gemm/mxfp8_n<N>_k<K> (host code: mxfp8_gemm_entries.py): `build(N, K, name, tier)`
returns the FlyDSL launcher of one tier of one shape (one launch per call), `variants(N, K, tiers, chunk)`
all of a shape's. The contract is references/gemm.py (mxfp8_gemm); the prepared weight layout is
`prepare_weights` below (run once at load time).

Prepared weight layout (what `prepare_weights` makes from the checkpoint's w [N, K], w_scales [N, K/32]):
- w_packed  float8_e4m3fn [N/16, K/64, 1024]: for N block b (16 output features) and 64-K slab u, byte
  1024-chunk [g 4][r 16][j 16] = w[16b + r, 64u + 16g + j]. The 16-byte vector of lane l = 16g + r is one
  half of that lane's FP8 MFMA operand (slab 2s = "lo", 2s + 1 = "hi" of 128-K step s), so a wave loads
  each half as one contiguous, fully coalesced 1 KiB `buffer_load_dwordx4`. No padding: K = 2880 has 45
  slabs; step 22's "hi" slab would be slab 45, which lies past the block's bytes and reads as zeros.
- w_scales_packed uint8 [N/16, ceil(K/128), 64]: byte l of step s of block b = w_scales[16b + r, 4s + g]
  (0 where 4s + g >= K/32: multiplies only zero data), i.e. the scale VGPR byte of lane l for that MFMA.

Kernel (grid x = feature tile, y = token tile; no scratch). Two kinds of tier (`Tier.lds`):

K chunks (batch invariance): every tier of one shape sums K in the same fixed chunks of `chunk` 128-K steps
(the package's CHUNK_STEPS, the per-wave share of its most split tier; default all of K): each chunk's MFMA
chain starts from zero and the chunk sums are added in chunk order, c0 + c1 + ... (fp32 adds), through LDS
where waves split K and in registers where one wave runs several chunks. So a token's bits do not depend on
which tier its batch size picks. The cost where one wave runs several chunks: 4 more VGPRs per 16 x 16
accumulator block and 2 `v_pk_add_f32` per block per chunk boundary.

Direct (lds=False; decode and mid tiers): `waves` waves per workgroup, tile 16*mc tokens x 16*nb features.
- Its waves split K: wave w runs the contiguous MFMA steps [w*sps, (w+1)*sps) over the whole tile. The MFMA
  computes D = W_tile (A operand, 16 features) x X_tile^T (B operand, 16 tokens), so a lane's 4 results are
  4 consecutive features of one token: the epilogue adds the bias, rounds to bf16 once and stores 8 bytes.
- Activations (row-major [M, K], the RMSNorm-quant / quant output as is): lane (g, r) loads the two 16-byte
  halves of token row r with `buffer_load_dwordx4`; its scale byte x_scales[row, 4s + g] with one
  `buffer_load_ubyte` (rows are K/32 bytes, not 4-byte aligned). Offsets at k >= K (the K tail's missing
  half, and the last wave's empty steps) are pushed out of range, so they read zeros: never a byte of the
  next row (which may be a garbage padding row holding NaN codes). Rows >= M read zeros and store nothing.
- waves > 1 (split-K inside the workgroup; sps a multiple of the chunk): every wave writes its chunks' fp32
  accumulators to LDS (waves x sps/chunk x nb*mc KiB), one barrier, then wave w sums accumulator blocks w,
  w + waves, ... over the chunks in chunk order (fixed, so bitwise deterministic) and runs the epilogue for
  them. No atomics, no partials in global memory, no second launch. waves = 1 runs the epilogue from
  registers.

LDS-sharing (lds=True; prefill tiers): 4 waves in a 2 x 2 grid, tile 32*mc tokens x 32*nb features; wave
(wy, wx) = (w // 2, w % 2) computes token blocks [wy*mc, (wy+1)*mc) x feature blocks [wx*nb, (wx+1)*nb)
over all of K with the same MFMA, operand layout and epilogue as above (same per-element step order: the
result is bitwise that of a one-wave direct tier).
- Per 128-K step the workgroup loads each operand byte of its tile once: every 16-row block of A and
  16-feature block of B is two 1 KiB slabs (lo, hi), laid out in LDS exactly as in the preshuffled weight
  (lane l's 16 bytes at l*16), so A and B slabs are alike. Wave (wy, wx) loads slab wx (its half) of blocks
  wy, wy + 2, ... of both (one `buffer_load_dwordx4` per slab, same K-tail / row guards as above) and writes
  it to LDS (`ds_write_b128`); barrier; each wave reads its operands (`ds_read_b128`, conflict-free: 64
  lanes x 16 contiguous bytes); a second barrier at the top of the next step keeps the single buffer from
  being overwritten before every wave has read it. Scale bytes are loaded straight from global by each wave.
- LDS: (32*mc + 32*nb) x 128 bytes, e.g. 32 KiB for a 128 x 128 tile (single buffer). No split K, so the
  epilogue runs from registers.
"""

# (no `from __future__ import annotations`: @fx.struct reads its field annotations as types)

import os
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import gpu, range_constexpr
from flydsl.expr.typing import T

from amd_kernels.common import buffer, mfma, wave

LANES = 64
OOB = 0x7FFFFFF0  # a byte offset past every descriptor built here (all are < 2 GiB)


@dataclass(frozen=True)
class Tier:
    """One compiled variant. lds=False: tile 16*mc tokens x 16*nb features per workgroup, K split over `waves`
    waves of `sps` 128-K steps each. lds=True: 4 waves in a 2 x 2 grid, each computing 16*mc x 16*nb over
    all of K (sps = every step), the workgroup tile 32*mc x 32*nb staged through LDS."""

    max_tokens: int  # the tier serves M <= max_tokens (the last tier any M)
    mc: int
    nb: int
    sps: int
    waves: int = 1
    lds: bool = False


def steps(k: int) -> int:
    return -(-k // mfma.STEP_K)


def _bf16x4_to_f32(v_i32x2):
    """Vector 2 x i32 holding 4 bf16 -> Vector 4 x f32 (exact)."""
    lo = v_i32x2 << 16
    hi = v_i32x2 & fx.Int32(-65536)
    return lo.shuffle(hi, [0, 2, 1, 3]).bitcast(fx.Float32)


@dataclass(frozen=True)
class _Shape:
    """What the kernel bodies share: the GEMM shape and the workgroup tile (16*mb tokens x 16*tb features)."""

    N: int
    K: int
    mb: int  # 16-token blocks per workgroup tile
    tb: int  # 16-feature blocks per workgroup tile
    chunk: int  # 128-K steps per K chunk (every tier of a shape sums K in the same chunks, in chunk order)

    @property
    def KB(self):
        return self.K // 32

    @property
    def STEPS(self):
        return steps(self.K)

    @property
    def tile_m(self):
        return 16 * self.mb


def _block_rsrcs(shape: _Shape, w, ws, blk):
    """Descriptors over weight block `blk` (16 features): its K/64 slabs and its scale bytes. Bounded to the
    block, so a slab or step past its end reads zeros."""
    w_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
        fx.add_offset(fx.get_iter(w), fx.Int64(blk) * (16 * shape.K)), num_records_bytes=fx.Int64(16 * shape.K)))
    ws_rsrc = buffer.rocdl.get_buffer_rsrc(buffer.rocdl.make_buffer_ptr(
        fx.add_offset(fx.get_iter(ws), fx.Int64(blk) * (shape.STEPS * LANES)),
        num_records_bytes=fx.Int64(shape.STEPS * LANES)))
    return w_rsrc, ws_rsrc


def _x_offset(shape: _Shape, row, k, guard: bool):
    """Byte offset of activation row `row`, K byte `k`; k >= K is pushed out of range (reads zeros, never a
    byte of the next row) when `guard`."""
    off = row * shape.K + k
    return (k < shape.K).select(off, fx.Int32(OOB)) if guard else off


def _x_scale(shape: _Shape, xs_rsrc, row, kb, guard: bool):
    """Scale byte of row `row`, K block `kb` (zero for kb >= K/32 when `guard`)."""
    off = row * shape.KB + kb
    return mfma.load_u8(xs_rsrc, (kb < shape.KB).select(off, fx.Int32(OOB)) if guard else off)


def _feature0(blk, lane):
    return blk * 16 + (lane // 16) * 4  # the first of the lane's 4 features in 16-feature block `blk`


def _load_bias(b_rsrc, blk, lane):
    return _bf16x4_to_f32(buffer.load_x2(b_rsrc, _feature0(blk, lane) * 2))


def _store_block(shape: _Shape, y, bias4, blk, row, lane, m, o_rsrc):
    """One 16 x 16 block: + bias, round to bf16 once, 8 bytes per lane (token `row`, block `blk`); rows >= m
    store nothing."""
    v = (y + bias4).to(fx.BFloat16).bitcast(fx.Int32)
    buffer.store(v, o_rsrc, (row < m).select((row * shape.N + _feature0(blk, lane)) * 2, fx.Int32(OOB)))


def _fold(chunks: list, accs: list, running: bool) -> list:
    """A K chunk's accumulators `accs` ends. running: keep one running sum, chunk 0 as is, then + each chunk
    in chunk order (fp32 adds); otherwise keep the chunk as its own partial (summed later through LDS)."""
    if not running:
        return chunks + [accs]
    if not chunks:
        return [accs]
    return [[chunks[0][b] + accs[b] for b in range(len(accs))]]


def _kernel_direct(shape: _Shape, name: str, tier: Tier):
    """waves split K; each wave loads its operands straight from global memory (see the module docstring)."""
    mc, nb, sps, waves = tier.mc, tier.nb, tier.sps, tier.waves
    STEPS, K, KB = shape.STEPS, shape.K, shape.KB
    assert (waves - 1) * sps < STEPS <= waves * sps, f"{waves} waves x {sps} steps do not cover {STEPS} steps"
    chunk = shape.chunk
    assert waves == 1 or sps % chunk == 0, f"{sps} steps per wave do not start on {chunk}-step chunks"
    cpw = -(-sps // chunk)  # K chunks per wave
    blocks = nb * mc  # 16 x 16 accumulator blocks per tile, block b = j * mc + c
    guard_k = (K % mfma.STEP_K != 0) or (waves * sps != STEPS)  # some (lane, step) has k >= K

    @fx.struct
    class Lds:
        part: fx.Array[fx.Float32, waves * cpw * blocks * 4 * LANES, 16]

    @flyc.kernel(name=f"mxfp8_gemm_{name}", known_block_size=[waves * LANES, 1, 1])
    def k_gemm(x: fx.Tensor, xs: fx.Tensor, w: fx.Tensor, ws: fx.Tensor, bias: fx.Tensor, out: fx.Tensor,
               m: fx.Int32):
        lane, wv = wave.lane_and_wave(fx.thread_idx.x, waves)
        g = lane // 16
        r = lane % 16
        nt = fx.block_idx.x
        mt = fx.block_idx.y

        x_rsrc = buffer.tensor_resource(x, fx.Int64(m) * K)
        xs_rsrc = buffer.tensor_resource(xs, fx.Int64(m) * KB)
        w_rsrc, ws_rsrc = zip(*[_block_rsrcs(shape, w, ws, nt * nb + j) for j in range_constexpr(nb)])

        rows = [mt * shape.tile_m + 16 * c + r for c in range_constexpr(mc)]
        accs = [mfma.zeros() for _ in range_constexpr(blocks)]
        chunks = []  # this wave's finished K chunks (waves > 1) or [their running sum in chunk order] (waves = 1)
        for i in range_constexpr(sps):
            if i > 0 and i % chunk == 0:  # a K chunk ends: every chunk's MFMA chain starts from zero
                chunks = _fold(chunks, accs, waves == 1)
                accs = [mfma.zeros() for _ in range_constexpr(blocks)]
            s = wv * sps + i if waves > 1 else i  # 128-K step: wave wv owns steps [wv*sps, (wv+1)*sps)
            xops, xsc = [], []
            k_lo = s * mfma.STEP_K + g * 16
            for c in range_constexpr(mc):
                lo = buffer.load_x4(x_rsrc, _x_offset(shape, rows[c], k_lo, guard_k))
                hi = buffer.load_x4(x_rsrc, _x_offset(shape, rows[c], k_lo + mfma.HALF_K, guard_k))
                xops.append(mfma.operand(lo, hi))
                xsc.append(_x_scale(shape, xs_rsrc, rows[c], s * 4 + g, guard_k))
            wops, wsc = [], []
            for j in range_constexpr(nb):
                # Steps >= STEPS (the last wave's empty ones) lie past the block's bytes and read zeros.
                w_lo = buffer.load_x4(w_rsrc[j], (2 * s) * 1024 + lane * 16)
                w_hi = buffer.load_x4(w_rsrc[j], (2 * s + 1) * 1024 + lane * 16)
                wops.append(mfma.operand(w_lo, w_hi))
                wsc.append(mfma.load_u8(ws_rsrc[j], s * LANES + lane))
            for j in range_constexpr(nb):
                for c in range_constexpr(mc):
                    accs[j * mc + c] = mfma.scaled(wops[j], xops[c], accs[j * mc + c], mfma.FMT_FP8, mfma.FMT_FP8,
                                                   wsc[j], xsc[c])

        chunks = _fold(chunks, accs, waves == 1)
        b_rsrc = buffer.tensor_resource(bias, shape.N * 2)
        o_rsrc = buffer.tensor_resource(out, fx.Int64(m) * (shape.N * 2))
        if waves == 1:
            for j in range_constexpr(nb):
                bias4 = _load_bias(b_rsrc, nt * nb + j, lane)
                for c in range_constexpr(mc):
                    _store_block(shape, chunks[0][j * mc + c], bias4, nt * nb + j, rows[c], lane, m, o_rsrc)
        else:
            lds = fx.SharedAllocator().allocate(Lds).peek()
            part = lds.part.view(fx.make_layout(waves * cpw * blocks * 4 * LANES, 1))
            for lc in range_constexpr(cpw):  # slot of K chunk q = wv * cpw + lc
                for b in range_constexpr(blocks):
                    for reg in range_constexpr(4):
                        slot = ((wv * cpw + lc) * blocks + b) * 4 + reg
                        fx.memref_store(chunks[lc][b][reg], part, slot * LANES + lane)
            gpu.barrier()
            # Wave wv sums blocks wv, wv + waves, ... over the K chunks in chunk order 0, 1, ... (fixed, and
            # the order a one-wave tier adds them in).
            for t in range_constexpr(-(-blocks // waves)):
                b = wv + t * waves
                if b < blocks:  # (always true when waves divides blocks)
                    tot = [None] * 4
                    for src in range_constexpr(waves * cpw):
                        for reg in range_constexpr(4):
                            v = fx.memref_load(part, ((src * blocks + b) * 4 + reg) * LANES + lane)
                            tot[reg] = v if src == 0 else tot[reg] + v
                    blk = nt * nb + b // mc
                    row = mt * shape.tile_m + 16 * (b % mc) + r
                    _store_block(shape, fx.Vector.from_elements(tot, fx.Float32), _load_bias(b_rsrc, blk, lane), blk,
                                 row, lane, m, o_rsrc)

    return k_gemm


LDS_WAVES = 4  # 2 x 2


def _kernel_lds(shape: _Shape, name: str, tier: Tier):
    """4 waves (2 x 2) share the workgroup tile's operands through LDS (see the module docstring)."""
    mc, nb = tier.mc, tier.nb
    STEPS, K, KB = shape.STEPS, shape.K, shape.KB
    assert tier.waves == LDS_WAVES and tier.sps == STEPS, "the LDS tier runs 4 waves over every step"
    guard_k = K % mfma.STEP_K != 0  # the last step's "hi" half lies at k >= K
    a_slabs = 2 * shape.mb  # 1 KiB slabs per step: (16-token block, half) of A, then (weight block, half) of B
    b_slabs = 2 * shape.tb
    SLAB = 1024 // 4  # dwords

    @fx.struct
    class Lds:
        ops: fx.Array[fx.Int32, (a_slabs + b_slabs) * SLAB, 16]

    @flyc.kernel(name=f"mxfp8_gemm_{name}", known_block_size=[LDS_WAVES * LANES, 1, 1])
    def k_gemm(x: fx.Tensor, xs: fx.Tensor, w: fx.Tensor, ws: fx.Tensor, bias: fx.Tensor, out: fx.Tensor,
               m: fx.Int32):
        lane, wv = wave.lane_and_wave(fx.thread_idx.x, LDS_WAVES)
        wy = wv // 2  # this wave's token half of the tile (and the blocks it loads)
        wx = wv % 2  # its feature half (and the operand half, lo / hi, it loads)
        g = lane // 16
        r = lane % 16
        nt = fx.block_idx.x
        mt = fx.block_idx.y
        ops = fx.SharedAllocator().allocate(Lds).peek().ops.ptr

        x_rsrc = buffer.tensor_resource(x, fx.Int64(m) * K)
        xs_rsrc = buffer.tensor_resource(xs, fx.Int64(m) * KB)
        # Loads: wave (wy, wx) fetches half wx of token blocks wy, wy + 2, ... and of weight blocks wy, wy + 2, ...
        ld_rows = [mt * shape.tile_m + 16 * (2 * i + wy) + r for i in range_constexpr(mc)]
        ld_w = [_block_rsrcs(shape, w, ws, nt * shape.tb + 2 * i + wy)[0] for i in range_constexpr(nb)]
        # Math: wave (wy, wx) owns token blocks wy*mc + c and weight blocks wx*nb + j of the tile.
        rows = [mt * shape.tile_m + 16 * (wy * mc + c) + r for c in range_constexpr(mc)]
        blks = [nt * shape.tb + wx * nb + j for j in range_constexpr(nb)]
        ws_rsrc = [_block_rsrcs(shape, w, ws, blks[j])[1] for j in range_constexpr(nb)]

        def slab(q):  # this lane's 16 bytes of LDS slab q
            return ops + fx.Int64(q * SLAB + lane * 4)

        def read_operand(q):  # slabs q (lo) and q + 1 (hi): one 8-VGPR MFMA operand
            return mfma.operand(fx.ptr_load(slab(q), result_type=T.i32x4),
                                   fx.ptr_load(slab(q + 1), result_type=T.i32x4))

        accs = [mfma.zeros() for _ in range_constexpr(nb * mc)]
        total = []  # the running sum of the finished K chunks, in chunk order
        for s in range_constexpr(STEPS):
            if s > 0 and s % shape.chunk == 0:  # a K chunk ends: every chunk's MFMA chain starts from zero
                total = _fold(total, accs, True)
                accs = [mfma.zeros() for _ in range_constexpr(nb * mc)]
            tail = guard_k and s == STEPS - 1
            k = s * mfma.STEP_K + wx * mfma.HALF_K + g * 16
            a_in = [buffer.load_x4(x_rsrc, _x_offset(shape, row, k, tail)) for row in ld_rows]
            # (past the last slab, the K tail's "hi" half, a block reads zeros)
            b_in = [buffer.load_x4(rs, (2 * s + wx) * 1024 + lane * 16) for rs in ld_w]
            xsc = [_x_scale(shape, xs_rsrc, row, s * 4 + g, tail) for row in rows]
            wsc = [mfma.load_u8(rs, s * LANES + lane) for rs in ws_rsrc]
            if s > 0:
                gpu.barrier()  # every wave has read the previous step's operands
            for i in range_constexpr(len(a_in)):
                fx.ptr_store(a_in[i], slab(2 * (2 * i + wy) + wx))
            for i in range_constexpr(len(b_in)):
                fx.ptr_store(b_in[i], slab(a_slabs + 2 * (2 * i + wy) + wx))
            gpu.barrier()
            xops = [read_operand(2 * (wy * mc + c)) for c in range_constexpr(mc)]
            wops = [read_operand(a_slabs + 2 * (wx * nb + j)) for j in range_constexpr(nb)]
            for j in range_constexpr(nb):
                for c in range_constexpr(mc):
                    accs[j * mc + c] = mfma.scaled(wops[j], xops[c], accs[j * mc + c], mfma.FMT_FP8, mfma.FMT_FP8,
                                                   wsc[j], xsc[c])

        total = _fold(total, accs, True)[0]
        b_rsrc = buffer.tensor_resource(bias, shape.N * 2)
        o_rsrc = buffer.tensor_resource(out, fx.Int64(m) * (shape.N * 2))
        for j in range_constexpr(nb):
            bias4 = _load_bias(b_rsrc, blks[j], lane)
            for c in range_constexpr(mc):
                _store_block(shape, total[j * mc + c], bias4, blks[j], rows[c], lane, m, o_rsrc)

    return k_gemm


def build(N: int, K: int, name: str, tier: Tier, chunk: int | None = None):
    """Launcher of one tier: `gemm(x, x_scales, w_packed, w_scales_packed, bias, out, m)`. `chunk`: 128-K steps
    per K chunk, the same for every tier of a shape; None: the tier's own split (one chunk per wave: not batch
    invariant when the tiers of a shape split K differently)."""
    assert N % 16 == 0 and K % mfma.HALF_K == 0
    side = 2 if tier.lds else 1  # waves per tile side
    if chunk is None:
        chunk = tier.sps if tier.waves > 1 and not tier.lds else steps(K)
    shape = _Shape(N, K, mb=side * tier.mc, tb=side * tier.nb, chunk=chunk)
    assert N % (16 * shape.tb) == 0, f"N {N} is not a multiple of the tile width {16 * shape.tb}"
    n_tiles = N // (16 * shape.tb)
    tile_m = shape.tile_m
    threads = (LDS_WAVES if tier.lds else tier.waves) * LANES
    k_gemm = (_kernel_lds if tier.lds else _kernel_direct)(shape, name, tier)

    @flyc.jit
    def gemm(x: fx.Tensor, x_scales: fx.Tensor, w_packed: fx.Tensor, w_scales_packed: fx.Tensor,
             bias: fx.Tensor, out: fx.Tensor, m: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        k_gemm(x, x_scales, w_packed, w_scales_packed, bias, out, m).launch(
            grid=(n_tiles, (m + (tile_m - 1)) // tile_m, 1), block=(threads, 1, 1), stream=stream)

    return gemm


def prepare_weights(w: torch.Tensor, w_scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint (w fp8 [N, K], w_scales u8 [N, K/32]) -> (w_packed [N/16, K/64, 1024], w_scales_packed
    [N/16, ceil(K/128), 64]) in the layout above. Pure torch; run once when the weights are loaded."""
    n, k = w.shape
    if w.dtype != torch.float8_e4m3fn or n % 16 or k % mfma.HALF_K:
        raise ValueError(f"w: expected float8_e4m3fn [N % 16 == 0, K % 64 == 0], got {w.dtype} {list(w.shape)}")
    if w_scales.dtype != torch.uint8 or tuple(w_scales.shape) != (n, k // 32):
        raise ValueError(f"w_scales: expected uint8 [{n}, {k // 32}], got {w_scales.dtype} {list(w_scales.shape)}")
    wb = w.view(torch.uint8).reshape(n // 16, 16, k // 64, 4, 16).permute(0, 2, 3, 1, 4)
    w_packed = wb.contiguous().reshape(n // 16, k // 64, 1024).view(torch.float8_e4m3fn)
    st = steps(k)
    sc = torch.zeros(n, st * 4, dtype=torch.uint8, device=w_scales.device)
    sc[:, : k // 32] = w_scales
    sp = sc.reshape(n // 16, 16, st, 4).permute(0, 2, 3, 1)  # [block, step, g, r]
    return w_packed, sp.contiguous().reshape(n // 16, st, 64)


# Set to 1 (before import) to let each tier sum K in its own split, as before issue 19: a few percent fewer
# instructions in the tiers that run several K chunks in one wave, and fewer VGPRs, but a row's bits then
# depend on the token count (not batch invariant). Unset: every tier sums in the package's CHUNK_STEPS.
BATCH_VARIANT_ENV = "AMD_KERNELS_GEMM_BATCH_VARIANT"


def variants(N: int, K: int, tiers: dict, chunk: int | None = None) -> dict:
    """VARIANTS: tier name -> (launcher, example-args function) for warm-up. `chunk`: 128-K steps per K
    chunk, shared by every tier (build); ignored under BATCH_VARIANT_ENV=1."""
    if os.environ.get(BATCH_VARIANT_ENV, "") == "1":
        chunk = None
    out = {}
    for name, tier in tiers.items():
        launcher = build(N, K, f"n{N}_k{K}_{name}", tier, chunk)

        def example(m: int = 1):
            return (torch.zeros(m, K, dtype=torch.float8_e4m3fn), torch.zeros(m, K // 32, dtype=torch.uint8),
                    torch.zeros(N // 16, K // 64, 1024, dtype=torch.float8_e4m3fn),
                    torch.zeros(N // 16, steps(K), 64, dtype=torch.uint8),
                    torch.zeros(N, dtype=torch.bfloat16), torch.zeros(m, N, dtype=torch.bfloat16), m,
                    fx.Stream(None))

        out[name] = (launcher, example)
    return out
