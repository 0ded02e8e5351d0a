"""MoE block of gpt-oss-120b at TP8: hidden 2880, per-rank intermediate 360 of 2880 (a rank's span of
32-column scale blocks, prepared padded to 384), 128 experts, top-4, the gpt-oss activation.
Design: amd_kernels/moe/mxfp4_moe.py; sharding: amd_kernels/moe/prepare.py.

Variants: "moe.full", and "moe.split" for M <= 4 (gate-up would launch < 256 workgroups: K split over 6
workgroups of 4 K-steps, one wave each)."""

from amd_kernels.moe import mxfp4_moe, prepare

H, I, E, TOP_K, ACTIVATION, TP = 2880, 2880, 128, 4, "gptoss", 8
IP = prepare.padded_intermediate(I, TP)
SPLITS = 6
PIPELINE = mxfp4_moe.build(H, IP, E, TOP_K, ACTIVATION, "moe_mxfp4_h2880_i360_e128_top4", splits=SPLITS)
VARIANTS = PIPELINE.variants
