"""MXFP8 GEMM for weight shape N = 640, K = 2880 (gpt-oss-120b QKV projection, TP8) on MI355X: tiers and VARIANTS.

The kernel and the prepared weight layout are kernels/gemm/mxfp8_gemm.py; the contract is
references/gemm.py (mxfp8_gemm). Tiers by token count M (each compiled at warm-up, M a runtime argument):
- M <= 64: 16-token x 16-feature tiles (40 per 16 tokens) and split-K to reach >= 256 workgroups:
  S = 8 (M <= 16), 4 (M <= 32), 2 (M <= 64): 320 workgroups at M = 16, 32, 64.
- 64 < M <= 512: 32 x 16 tiles, no split (320 workgroups at M = 256).
- M > 512: 64 x 32 tiles, no split.
"""

from amd_kernels.gemm import mxfp8_entries
from amd_kernels.gemm.mxfp8_gemm import Tier

N = 640
K = 2880
SHAPE_TOKEN = "mxfp8_n640_k2880"
TIERS = {
    "m16": Tier(16, mc=1, nb=1, sps=3),
    "m32": Tier(32, mc=1, nb=1, sps=6),
    "m48": Tier(48, mc=1, nb=1, sps=12),
    "m64": Tier(64, mc=1, nb=1, sps=12),
    "mid": Tier(512, mc=2, nb=1, sps=23),
    "prefill": Tier(1 << 31, mc=4, nb=2, sps=23),
}
VARIANTS = mxfp8_entries.variants(N, K, SHAPE_TOKEN, TIERS)
