"""MoE block of gpt-oss-120b at TP8: hidden 2880, per-rank intermediate 360 of 2880 (a rank's span of
32-column scale blocks, prepared padded to 384), 128 experts, top-4, the gpt-oss activation.
Design: amd_kernels/moe/mxfp4_moe.py; sharding: amd_kernels/moe/prepare.py.

Variants: "moe.full" (gate-up: 3 waves of 8 K-steps per workgroup), and "moe.small_m" for M <= 5, where
gate-up would launch < 256 workgroups: 6 waves of 4 K-steps each (288 waves at M = 1).
w2 in dword planes (prepare.w2_planes): every rank's columns straddle scale blocks, and the down kernel
loads only the 8-code runs that hold live columns (360 of the 384 prepared), with no scale padding."""

from amd_kernels.moe import mxfp4_moe, prepare

H, I, E, TOP_K, ACTIVATION, TP = 2880, 2880, 128, 4, "gptoss", 8
IP = prepare.padded_intermediate(I, TP)
SMALL_M_WAVES = 8
PIPELINE = mxfp4_moe.build(H, IP, E, TOP_K, ACTIVATION, "moe_mxfp4_h2880_i360_e128_top4",
                           small_m_waves=SMALL_M_WAVES, w2_planes=prepare.w2_planes(I, TP))
VARIANTS = PIPELINE.variants
