"""MXFP8 GEMM y = x @ w^T + bias for w [640, 2880] (gpt-oss-120b QKV projection, TP8).
Entry: mxfp8_gemm (see README.md); prepare_weights(w, w_scales) packs checkpoint weights once at load time.

The kernel and the prepared weight layout: kernels/gemm/mxfp8_gemm.py; the contract: references/gemm.py
(mxfp8_gemm). Tiers by token count M (each compiled at warm-up, M a runtime argument):
- M <= 16: 16-token x 16-feature tiles, 8 waves per workgroup splitting K (3 of the 23 128-K steps each):
  40 workgroups x 8 = 320 waves.
- 16 < M <= 64: 16 x 16 tiles, 4 waves (6 steps each): 80 / 120 / 160 workgroups (320 / 480 / 640 waves).
- 64 < M <= 128: 16 x 16 tiles, 2 waves (12 / 11 steps): 200 to 320 workgroups (400 to 640 waves).
- 128 < M <= 256: 16 x 16 tiles, one wave: 360 to 640 workgroups.
- 256 < M <= 512: 32 x 16 tiles, one wave: 360 to 640 workgroups.
- M > 512: 128 x 64 tiles, 4 waves (2 x 2, 64 x 32 each) sharing each 128-K step's operands through LDS
  (24 KiB): 10 x ceil(M/128) workgroups (80 / 160 at M = 1024 / 2048, the same 320 / 640 waves as 64 x 32
  tiles of one wave, with half the bytes issued).
Waves of one workgroup sum their fp32 partials through LDS in wave order: one launch, no partials buffer.
"""

from amd_kernels.gemm import mxfp8_gemm_entries
from amd_kernels.gemm.mxfp8_gemm import Tier, prepare_weights  # noqa: F401 (public: run once at load time)

N = 640
K = 2880
TIERS = {
    "m16": Tier(16, mc=1, nb=1, sps=3, waves=8),
    "m64": Tier(64, mc=1, nb=1, sps=6, waves=4),
    "m128": Tier(128, mc=1, nb=1, sps=12, waves=2),
    "m256": Tier(256, mc=1, nb=1, sps=23),
    "mid": Tier(512, mc=2, nb=1, sps=23),
    "prefill": Tier(1 << 31, mc=4, nb=2, sps=23, waves=4, lds=True),
}
# Every tier sums K in chunks of CHUNK_STEPS 128-K steps, each chunk's MFMA chain from zero, the chunks added
# in chunk order (the smallest tier's split across waves), so a row's bits do not depend on the tier.
CHUNK_STEPS = 3

_built = mxfp8_gemm_entries.build(__name__, N, K, TIERS, CHUNK_STEPS)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
mxfp8_gemm = _built.mxfp8_gemm
prepare = _built.prepare  # the harness's hook: reference inputs -> entry inputs
tier_of = _built.tier_of
