"""MXFP8 GEMM for weight shape N = 640, K = 2880 (gpt-oss-120b QKV projection, TP8) on MI355X: tiers and VARIANTS.

The kernel and the prepared weight layout are kernels/gemm/mxfp8_gemm.py; the contract is
references/gemm.py (mxfp8_gemm). Tiers by token count M (each compiled at warm-up, M a runtime argument):
- M <= 64: one token tile, 16 features per wave, split-K 8 (3 steps each): 40 x 8 = 320 workgroups.
- 64 < M <= 512: 64 x 32 tiles, split-K 4: 20 x 4 x ceil(M/64) workgroups (320 at M = 256).
- M > 512: 64 x 32 tiles, no split.
"""

from amd_kernels.gemm import mxfp8_entries
from amd_kernels.gemm.mxfp8_gemm import Tier

N = 640
K = 2880
SHAPE_TOKEN = "mxfp8_n640_k2880"
TIERS = {
    "m16": Tier(16, mc=1, nb=1, sps=3),
    "m32": Tier(32, mc=2, nb=1, sps=3),
    "m48": Tier(48, mc=3, nb=1, sps=3),
    "m64": Tier(64, mc=4, nb=1, sps=3),
    "mid": Tier(512, mc=4, nb=2, sps=6),
    "prefill": Tier(1 << 31, mc=4, nb=2, sps=23),
}
VARIANTS = mxfp8_entries.variants(N, K, SHAPE_TOKEN, TIERS)
