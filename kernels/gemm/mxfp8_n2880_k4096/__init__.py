"""MXFP8 GEMM y = x @ w^T + bias for w [2880, 4096] (gpt-oss-120b attention output projection, TP1).
Entry: mxfp8_gemm (see README.md); prepare_weights(w, w_scales) packs checkpoint weights once at load time.

The kernel and the prepared weight layout: kernels/gemm/mxfp8_gemm.py; the contract: references/gemm.py
(mxfp8_gemm). Tiers by token count M (each compiled at warm-up, M a runtime argument):
- M <= 16: 16 x 16 tiles, 2 waves per workgroup splitting K (16 128-K steps each, partials summed through
  LDS in wave order): 180 workgroups x 2 = 360 waves.
- M <= 48: 16 x 16 tiles, one wave (360 / 540 workgroups); M <= 128: 32 x 16 tiles (360 to 720).
- 128 < M <= 512: 64 x 32 tiles, one wave (270 at M = 136, 360 at M = 256).
- M > 512: 128 x 96 tiles (2880 = 30 x 96), 4 waves (2 x 2, 64 x 48 each) sharing each 128-K step's
  operands through LDS (28 KiB): 30 x ceil(M/128) workgroups (240 / 480 at M = 1024 / 2048).
"""

from amd_kernels.gemm import mxfp8_gemm_entries
from amd_kernels.gemm.mxfp8_gemm import Tier, prepare_weights  # noqa: F401 (public: run once at load time)

N = 2880
K = 4096
TIERS = {
    "m16": Tier(16, mc=1, nb=1, sps=16, waves=2),
    "m48": Tier(48, mc=1, nb=1, sps=32),
    "m128": Tier(128, mc=2, nb=1, sps=32),
    "mid": Tier(512, mc=4, nb=2, sps=32),
    "prefill": Tier(1 << 31, mc=4, nb=3, sps=32, waves=4, lds=True),
}
# Every tier sums K in chunks of CHUNK_STEPS 128-K steps, each chunk's MFMA chain from zero, the chunks added
# in chunk order (the smallest tier's split across waves), so a row's bits do not depend on the tier.
CHUNK_STEPS = 16

_built = mxfp8_gemm_entries.build(__name__, N, K, TIERS, CHUNK_STEPS)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
mxfp8_gemm = _built.mxfp8_gemm
prepare = _built.prepare  # the harness's hook: reference inputs -> entry inputs
tier_of = _built.tier_of
