"""MoE block of gpt-oss-120b at TP1: hidden 2880, intermediate 2880 (prepared padded to 2944), 128 experts,
top-4, the gpt-oss activation (interleaved gate/up, clamp, biases). Design: amd_kernels/moe/mxfp4_moe/.

Variants: "moe.full" (gate-up already launches 92 workgroups of 3 waves per tile, 368 at M = 1, so no small-M
variant) and "moe.prefill" from PREFILL_FROM tokens (super-tiles of 64 rows, weights staged through LDS, the
same per-row K grouping: mxfp4_moe/prefill.py; the threshold is where the cost model projects it faster,
README)."""

from amd_kernels.moe import mxfp4_moe, prepare

H, I, E, TOP_K, ACTIVATION, TP = 2880, 2880, 128, 4, "gptoss", 1
IP = prepare.padded_intermediate(I, TP)
PREFILL_FROM = 256
PIPELINE = mxfp4_moe.build(H, IP, E, TOP_K, ACTIVATION, "moe_mxfp4_h2880_i2880_e128_top4",
                           prefill_from=PREFILL_FROM)
VARIANTS = PIPELINE.variants
