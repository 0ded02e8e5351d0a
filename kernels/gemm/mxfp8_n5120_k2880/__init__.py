"""MXFP8 GEMM y = x @ w^T + bias for w [5120, 2880] (gpt-oss-120b QKV projection, TP1).
Entry: mxfp8_gemm (see README.md); prepare_weights(w, w_scales) packs checkpoint weights once at load time.

The kernel and the prepared weight layout: kernels/gemm/mxfp8_gemm.py; the contract: references/gemm.py
(mxfp8_gemm). Tiers by token count M (each compiled at warm-up, M a runtime argument):
- M <= 64: one token tile of 16*mc rows (mc = ceil(M/16): no padded MFMA), 16 features per workgroup of one
  wave (K not split): 320 workgroups, weights read once.
- 64 < M <= 512: 64 x 32 tiles, one wave: 160 x ceil(M/64) workgroups (320 at M = 72, 640 at M = 256).
- M > 512: 128 x 128 tiles, 4 waves (2 x 2, 64 x 64 each) sharing each 128-K step's operands through LDS
  (32 KiB): 40 x ceil(M/128) workgroups (320 / 640 at M = 1024 / 2048).
"""

from amd_kernels.gemm import mxfp8_gemm_entries
from amd_kernels.gemm.mxfp8_gemm import Tier, prepare_weights  # noqa: F401 (public: run once at load time)

N = 5120
K = 2880
TIERS = {
    "m16": Tier(16, mc=1, nb=1, sps=23),
    "m32": Tier(32, mc=2, nb=1, sps=23),
    "m48": Tier(48, mc=3, nb=1, sps=23),
    "m64": Tier(64, mc=4, nb=1, sps=23),
    "mid": Tier(512, mc=4, nb=2, sps=23),
    "prefill": Tier(1 << 31, mc=4, nb=4, sps=23, waves=4, lds=True),
}

_built = mxfp8_gemm_entries.build(__name__, N, K, TIERS)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
mxfp8_gemm = _built.mxfp8_gemm
prepare = _built.prepare  # the harness's hook: reference inputs -> entry inputs
tier_of = _built.tier_of
