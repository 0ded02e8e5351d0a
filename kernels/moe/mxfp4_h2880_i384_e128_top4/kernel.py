"""MoE block of gpt-oss-120b at TP8: hidden 2880, per-rank intermediate 384 of 2880 (vLLM's cut: 12 whole
32-column scale blocks per rank, rank 7's 192 columns padded to 384), 128 experts, top-4, the gpt-oss
activation. Design: amd_kernels/moe/mxfp4_moe/; sharding: kernels/moe/prepare.py.

Variants: "moe.full" (gate-up: 3 waves of 8 K-steps per workgroup), and "moe.small_m" for M <= 5, where
gate-up would launch < 256 workgroups: 6 waves of 4 K-steps each (288 waves at M = 1). Both tiers sum K in
the same grouping (chunks of 4 K-steps, pairs of chunks: batch invariance, mxfp4_moe/geometry.py);
"moe.prefill" from PREFILL_FROM tokens (super-tiles of 64 rows, weights staged through LDS, the same per-row
K grouping: mxfp4_moe/prefill.py; the threshold is where the cost model projects it faster, README)."""

from amd_kernels.moe import mxfp4_moe, prepare

H, I, E, TOP_K, ACTIVATION, TP = 2880, 2880, 128, 4, "gptoss", 8
IP = prepare.padded_intermediate(I, TP)
SMALL_M_WAVES = 8
PREFILL_FROM = 256
PIPELINE = mxfp4_moe.build(H, IP, E, TOP_K, ACTIVATION, "moe_mxfp4_h2880_i384_e128_top4",
                           small_m_waves=SMALL_M_WAVES, prefill_from=PREFILL_FROM)
VARIANTS = PIPELINE.variants
