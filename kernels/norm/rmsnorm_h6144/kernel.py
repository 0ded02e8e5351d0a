"""RMSNorm family for hidden size 6144 on MI355X (gfx950, wave64), bf16 in/out, fp32 math.

Ops (y = r * rstd * w in fp32, rstd = 1 / sqrt(mean(r^2) + eps)):
  rmsnorm                  r = x;                         out = bf16(y)
  fused_add_rmsnorm        r = bf16(x + residual) (fp32 add, one rounding), residual_out = r; out = bf16(y)
  rmsnorm_mxfp8            r = x;                         (q, scales) = MXFP8(y), y not rounded to bf16
  fused_add_rmsnorm_mxfp8  r = bf16(x + residual), residual_out = r; (q, scales) = MXFP8(y)

Launchers (one per op and tier; every tensor row-major and contiguous, allocated by the host; M is the
runtime token count and only sizes the grid; eps is a runtime fp32; stream is optional):
  rmsnorm_{decode,prefill}(x, weight, out, M, eps, stream)
  fused_add_rmsnorm_{decode,prefill}(x, residual, weight, out, residual_out, M, eps, stream)
  rmsnorm_mxfp8_{decode,prefill}(x, weight, q, scales, M, eps, stream)
  fused_add_rmsnorm_mxfp8_{decode,prefill}(x, residual, weight, q, scales, residual_out, M, eps, stream)
with x, residual, out, residual_out: bf16 [M, 6144]; weight: bf16 [6144]; q: float8_e4m3fn [M, 6144];
scales: uint8 [M, 192] (E8M0, one per 32 consecutive elements of a row).
`VARIANTS["<op>.<tier>"] = (launcher, example_args_fn)` lists them for the host; tier "decode" is meant for
M <= 512 (`warm_up.DECODE_MAX_TOKENS`), "prefill" for larger M.

Design:
- One wave owns one row. A row is 6144 bf16 = 12 KiB = 768 16-byte vectors = exactly 12 slots of 64 lanes:
  lane l loads vectors l, l+64, ..., l+704 with `buffer_load_dwordx4`, the wave reading 1 KiB contiguous per
  slot (fully coalesced). There is no tail; the descriptors are still bounded to their row (base = row start,
  num_records = row bytes) as in the other shapes, which costs nothing.
- x (and residual) are read exactly once: the row stays in VGPRs as packed bf16 (48 VGPRs for x) between the
  sum-of-squares pass and the normalize pass (the second pass re-unpacks it, `bf16.opaque`, rather than
  keeping 96 VGPRs of fp32 alive). The weight row (L2-resident) is issued right after x so its latency
  overlaps the reduction. rmsnorm / rmsnorm_mxfp8 land near 112-122 VGPRs (4 waves per SIMD); the fused
  ops hold x, residual and weight in flight at once, about 160 VGPRs (3 waves per SIMD). Each wave then
  has 24-36 KiB of loads in flight, several times what a CU needs to cover HBM latency, so that occupancy
  costs no bandwidth, whereas splitting a row over several waves would add an LDS exchange and a barrier.
- The row sum is a DPP reduction inside the wave (quad perms, row mirrors, row broadcasts, one readlane):
  no LDS, no barrier, no atomics, no scratch.
- MXFP8: a 32-element block is 4 consecutive lanes x 8 elements = one DPP quad, so the block amax is a
  per-lane max of 8 plus two quad-permute steps; every lane then converts its 8 values (8 bytes of q, one
  `buffer_store_dwordx2`) and the quad's first lane stores the E8M0 byte.
- Tiers: "decode" launches 1-wave workgroups (grid = M) so up to 512 rows spread over all 256 CUs;
  "prefill" launches 4-wave workgroups, one row per wave (grid = ceil(M / 4)), which quarters the number of
  workgroups the dispatcher has to launch for thousands of rows. Both tiers are compiled once and serve every
  M (tensor shapes are dynamic in the compiled code; M is a runtime i32).
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import range_constexpr

from amd_kernels.common import bf16, buffer, mxfp8, norm, wave

H = 6144
ELEM_BYTES = 2  # bf16
VEC = buffer.VEC_BYTES // ELEM_BYTES  # 8 bf16 per lane per slot
LANES = wave.WAVE
SLOTS = (H // VEC + LANES - 1) // LANES  # 12, all lanes live
SLOT_BYTES = LANES * buffer.VEC_BYTES  # 1024 B of a bf16 row per slot
Q_SLOT_BYTES = LANES * VEC  # 512 B of an fp8 row per slot
SCALES = H // mxfp8.BLOCK  # 192 E8M0 bytes per row
SCALES_PER_SLOT = LANES // mxfp8.LANES_PER_BLOCK  # 16

DECODE_WAVES = 1
PREFILL_WAVES = 4

assert H % VEC == 0 and H % mxfp8.BLOCK == 0


def _load_row(rsrc, lane):
    return [buffer.load_x4(rsrc, lane * buffer.VEC_BYTES + j * SLOT_BYTES) for j in range_constexpr(SLOTS)]


def _load_inputs(lane, row, x_t, res_t, w_t, res_out_t):
    """Read the row once; for the fused ops add the residual, round to bf16 and write residual_out.

    Returns (r: SLOTS x Vector 4 x i32 of packed bf16, w: same for the weight).
    """
    xs = _load_row(buffer.row_resource(x_t, row, H, ELEM_BYTES), lane)
    if res_t is not None:
        rs = _load_row(buffer.row_resource(res_t, row, H, ELEM_BYTES), lane)
    ws = _load_row(buffer.tensor_resource(w_t, H * ELEM_BYTES), lane)
    buffer.keep_issued_above()
    if res_t is None:
        return xs, ws
    res_out = buffer.row_resource(res_out_t, row, H, ELEM_BYTES)
    summed = []
    for j in range_constexpr(SLOTS):
        s = bf16.pack(bf16.unpack(xs[j]) + bf16.unpack(rs[j]))
        buffer.store(s, res_out, lane * buffer.VEC_BYTES + j * SLOT_BYTES)
        summed.append(s)
    return summed, ws


def _rstd(r, eps):
    """1 / sqrt(mean(r^2) + eps) over the row held by the wave (wave-uniform)."""
    return norm.rstd(wave.wave_sum(norm.sum_squares_bf16(r)), H, eps)


def _store_bf16(lane, row, r, ws, rstd, out_t):
    out = buffer.row_resource(out_t, row, H, ELEM_BYTES)
    for j in range_constexpr(SLOTS):
        y = (bf16.unpack(bf16.opaque(r[j])) * rstd) * bf16.unpack(ws[j])
        buffer.store(bf16.pack(y), out, lane * buffer.VEC_BYTES + j * SLOT_BYTES)


def _store_mxfp8(lane, row, r, ws, rstd, q_t, s_t):
    q_rsrc = buffer.row_resource(q_t, row, H, 1)
    s_rsrc = buffer.row_resource(s_t, row, SCALES, 1)
    quad_leader = (lane % mxfp8.LANES_PER_BLOCK) == 0
    for j in range_constexpr(SLOTS):
        y = (bf16.unpack(bf16.opaque(r[j])) * rstd) * bf16.unpack(ws[j])
        byte, inv_scale = mxfp8.block_scale(y)
        buffer.store(mxfp8.e4m3x8(y, inv_scale, nan=True), q_rsrc, lane * VEC + j * Q_SLOT_BYTES)
        s_off = quad_leader.select(j * SCALES_PER_SLOT + lane // mxfp8.LANES_PER_BLOCK, buffer.never_in_range())
        buffer.store_byte(byte, s_rsrc, s_off)


def _build(waves: int, tier: str):
    """Kernels and launchers of all four ops for one tier (`waves` rows per workgroup, one per wave)."""
    threads = waves * LANES
    kw = {"known_block_size": [threads, 1, 1]}

    def _row_of(tid):
        lane, w = wave.lane_and_wave(tid, waves)
        return lane, fx.block_idx.x * waves + w

    @flyc.kernel(name=f"rmsnorm_h{H}_{tier}", **kw)
    def k_rmsnorm(x: fx.Tensor, weight: fx.Tensor, out: fx.Tensor, m: fx.Int32, eps: fx.Float32):
        lane, row = _row_of(fx.thread_idx.x)
        if row < m:
            r, ws = _load_inputs(lane, row, x, None, weight, None)
            _store_bf16(lane, row, r, ws, _rstd(r, eps), out)

    @flyc.kernel(name=f"fused_add_rmsnorm_h{H}_{tier}", **kw)
    def k_fused(
        x: fx.Tensor,
        residual: fx.Tensor,
        weight: fx.Tensor,
        out: fx.Tensor,
        residual_out: fx.Tensor,
        m: fx.Int32,
        eps: fx.Float32,
    ):
        lane, row = _row_of(fx.thread_idx.x)
        if row < m:
            r, ws = _load_inputs(lane, row, x, residual, weight, residual_out)
            _store_bf16(lane, row, r, ws, _rstd(r, eps), out)

    @flyc.kernel(name=f"rmsnorm_mxfp8_h{H}_{tier}", **kw)
    def k_mx(x: fx.Tensor, weight: fx.Tensor, q: fx.Tensor, scales: fx.Tensor, m: fx.Int32, eps: fx.Float32):
        lane, row = _row_of(fx.thread_idx.x)
        if row < m:
            r, ws = _load_inputs(lane, row, x, None, weight, None)
            _store_mxfp8(lane, row, r, ws, _rstd(r, eps), q, scales)

    @flyc.kernel(name=f"fused_add_rmsnorm_mxfp8_h{H}_{tier}", **kw)
    def k_fused_mx(
        x: fx.Tensor,
        residual: fx.Tensor,
        weight: fx.Tensor,
        q: fx.Tensor,
        scales: fx.Tensor,
        residual_out: fx.Tensor,
        m: fx.Int32,
        eps: fx.Float32,
    ):
        lane, row = _row_of(fx.thread_idx.x)
        if row < m:
            r, ws = _load_inputs(lane, row, x, residual, weight, residual_out)
            _store_mxfp8(lane, row, r, ws, _rstd(r, eps), q, scales)

    def _grid(m):
        return ((m + (waves - 1)) // waves, 1, 1)

    @flyc.jit
    def rmsnorm(
        x: fx.Tensor, weight: fx.Tensor, out: fx.Tensor, m: fx.Int32, eps: fx.Float32,
        stream: fx.Stream = fx.Stream(None),
    ):
        k_rmsnorm(x, weight, out, m, eps).launch(grid=_grid(m), block=(threads, 1, 1), stream=stream)

    @flyc.jit
    def fused_add_rmsnorm(
        x: fx.Tensor, residual: fx.Tensor, weight: fx.Tensor, out: fx.Tensor, residual_out: fx.Tensor,
        m: fx.Int32, eps: fx.Float32, stream: fx.Stream = fx.Stream(None),
    ):
        k_fused(x, residual, weight, out, residual_out, m, eps).launch(
            grid=_grid(m), block=(threads, 1, 1), stream=stream
        )

    @flyc.jit
    def rmsnorm_mxfp8(
        x: fx.Tensor, weight: fx.Tensor, q: fx.Tensor, scales: fx.Tensor, m: fx.Int32, eps: fx.Float32,
        stream: fx.Stream = fx.Stream(None),
    ):
        k_mx(x, weight, q, scales, m, eps).launch(grid=_grid(m), block=(threads, 1, 1), stream=stream)

    @flyc.jit
    def fused_add_rmsnorm_mxfp8(
        x: fx.Tensor, residual: fx.Tensor, weight: fx.Tensor, q: fx.Tensor, scales: fx.Tensor,
        residual_out: fx.Tensor, m: fx.Int32, eps: fx.Float32, stream: fx.Stream = fx.Stream(None),
    ):
        k_fused_mx(x, residual, weight, q, scales, residual_out, m, eps).launch(
            grid=_grid(m), block=(threads, 1, 1), stream=stream
        )

    return rmsnorm, fused_add_rmsnorm, rmsnorm_mxfp8, fused_add_rmsnorm_mxfp8


(rmsnorm_decode, fused_add_rmsnorm_decode, rmsnorm_mxfp8_decode, fused_add_rmsnorm_mxfp8_decode) = _build(
    DECODE_WAVES, "decode"
)
(rmsnorm_prefill, fused_add_rmsnorm_prefill, rmsnorm_mxfp8_prefill, fused_add_rmsnorm_mxfp8_prefill) = _build(
    PREFILL_WAVES, "prefill"
)


# Example arguments: M = 1 CPU tensors. Shapes are dynamic in the compiled code, so this one
# specialization serves every M of the tier.
_EPS = 1e-5


def _bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def _args_rmsnorm(m: int = 1):
    return (_bf16(m, H), _bf16(H), _bf16(m, H), m, _EPS)


def _args_fused(m: int = 1):
    return (_bf16(m, H), _bf16(m, H), _bf16(H), _bf16(m, H), _bf16(m, H), m, _EPS)


def _q(m):
    return torch.zeros(m, H, dtype=torch.float8_e4m3fn), torch.zeros(m, SCALES, dtype=torch.uint8)


def _args_mx(m: int = 1):
    q, s = _q(m)
    return (_bf16(m, H), _bf16(H), q, s, m, _EPS)


def _args_fused_mx(m: int = 1):
    q, s = _q(m)
    return (_bf16(m, H), _bf16(m, H), _bf16(H), q, s, _bf16(m, H), m, _EPS)


VARIANTS = {
    "rmsnorm.decode": (rmsnorm_decode, _args_rmsnorm),
    "rmsnorm.prefill": (rmsnorm_prefill, _args_rmsnorm),
    "fused_add_rmsnorm.decode": (fused_add_rmsnorm_decode, _args_fused),
    "fused_add_rmsnorm.prefill": (fused_add_rmsnorm_prefill, _args_fused),
    "rmsnorm_mxfp8.decode": (rmsnorm_mxfp8_decode, _args_mx),
    "rmsnorm_mxfp8.prefill": (rmsnorm_mxfp8_prefill, _args_mx),
    "fused_add_rmsnorm_mxfp8.decode": (fused_add_rmsnorm_mxfp8_decode, _args_fused_mx),
    "fused_add_rmsnorm_mxfp8.prefill": (fused_add_rmsnorm_mxfp8_prefill, _args_fused_mx),
}
