"""MXFP4 MoE, hidden 6144, intermediate 768, 128 experts, top-4, SwiGLU.

Entry: moe(x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard) -> bf16 [M, 6144],
the weights from `prepare_weights` (amd_kernels.moe.prepare, run once at load time);
also torch.ops.amd_kernels.mxfp4_h6144_i768_e128_top4_moe.

MoE block for hidden 6144, intermediate 768, 128 experts, top-4, plain SwiGLU, no biases in the model
(zero bias tensors in the prepared weights). Design: kernels/moe/mxfp4_moe/.

Variants: "moe.full" (gate-up: 4 waves of 12 K-steps per workgroup), and "moe.small_m" for M <= 2, where gate-up
would launch < 256 workgroups: 6 waves of 8 K-steps each (576 waves at M = 1). Both tiers sum K in the same
grouping (chunks of 4 K-steps, groups of 3 chunks: batch invariance, mxfp4_moe/geometry.py); "moe.prefill" from
PREFILL_FROM tokens (super-tiles of 64 rows, weights staged through LDS, the same per-row K grouping:
mxfp4_moe/prefill.py; the threshold is where the cost model projects it faster, README), and "moe.prefill128"
from PREFILL128_FROM (super-tiles of 128 rows).
"""

from amd_kernels.moe import mxfp4_moe_entries

H, I, E, TOP_K, ACTIVATION, TP = 6144, 768, 128, 4, "swiglu", 1
PREFILL_FROM = 128
PREFILL128_FROM = 2048  # the tier of 128-row super-tiles (README: where it projects faster)
SMALL_M_WAVES = 8
_built = mxfp4_moe_entries.build(__name__, hidden=H, intermediate=I, experts=E, top_k=TOP_K,
                                 activation=ACTIVATION, tp_size=TP, prefill_from=PREFILL_FROM,
                                 prefill128_from=PREFILL128_FROM, small_m_waves=SMALL_M_WAVES)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
PIPELINE = _built.PIPELINE  # the launch geometry: variants, limits, weight shapes
moe = _built.moe
prepare_weights = _built.prepare_weights  # checkpoint -> prepared weights, once at load time
prepare_inputs = _built.prepare_inputs  # the harness's hook: reference inputs -> entry inputs
emulator_workgroups = _built.emulator_workgroups  # kernel.toml workgroups = "tokens"
