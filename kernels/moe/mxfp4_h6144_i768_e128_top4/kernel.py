"""MoE block for hidden 6144, intermediate 768, 128 experts, top-4, plain SwiGLU, no biases in the model
(zero bias tensors in the prepared weights). Design: amd_kernels/moe/mxfp4_moe/.

Variants: "moe.full" (gate-up: 4 waves of 12 K-steps per workgroup), and "moe.small_m" for M <= 2, where
gate-up would launch < 256 workgroups: 6 waves of 8 K-steps each (576 waves at M = 1). Both tiers sum K in
the same grouping (chunks of 4 K-steps, groups of 3 chunks: batch invariance, mxfp4_moe/geometry.py);
"moe.prefill" from PREFILL_FROM tokens (super-tiles of 64 rows, weights staged through LDS, the same per-row
K grouping: mxfp4_moe/prefill.py; the threshold is where the cost model projects it faster, README)."""

from amd_kernels.moe import mxfp4_moe

H, I, E, TOP_K, ACTIVATION = 6144, 768, 128, 4, "swiglu"
SMALL_M_WAVES = 8
PREFILL_FROM = 256
PIPELINE = mxfp4_moe.build(H, I, E, TOP_K, ACTIVATION, "moe_mxfp4_h6144_i768_e128_top4",
                           small_m_waves=SMALL_M_WAVES, prefill_from=PREFILL_FROM)
VARIANTS = PIPELINE.variants
