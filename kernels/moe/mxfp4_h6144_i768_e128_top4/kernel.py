"""MoE block for hidden 6144, intermediate 768, 128 experts, top-4, plain SwiGLU, no biases in the model
(zero bias tensors in the prepared weights). Design: amd_kernels/moe/mxfp4_moe.py.

Variants: "moe.full", and "moe.split" for M <= 2 (gate-up would launch < 256 workgroups: K split over 4
workgroups of 12 K-steps, 3 waves each)."""

from amd_kernels.moe import mxfp4_moe

H, I, E, TOP_K, ACTIVATION = 6144, 768, 128, 4, "swiglu"
SPLITS = 4
PIPELINE = mxfp4_moe.build(H, I, E, TOP_K, ACTIVATION, "moe_mxfp4_h6144_i768_e128_top4", splits=SPLITS)
VARIANTS = PIPELINE.variants
