"""MXFP4 MoE of gpt-oss-120b, TP8 (one rank's partial sum): hidden 2880, 384 intermediate columns per rank,
128 experts, top-4.

Entry: moe(x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard) -> bf16 [M, 2880],
the weights from `prepare_weights(..., tp_rank=r)` (amd_kernels.moe.prepare, run once at load time);
also torch.ops.amd_kernels.mxfp4_h2880_i384_e128_top4_moe.

MoE block of gpt-oss-120b at TP8: hidden 2880, per-rank intermediate 384 of 2880 (vLLM's cut: 12 whole
32-column scale blocks per rank, rank 7's 192 columns padded to 384), 128 experts, top-4, the gpt-oss
activation. Design: kernels/moe/mxfp4_moe/; sharding: kernels/moe/prepare.py.

Variants: "moe.full" (gate-up: 3 waves of 8 K-steps per workgroup), and "moe.small_m" for M <= 5, where gate-up
would launch < 256 workgroups: 6 waves of 4 K-steps each (288 waves at M = 1). Both tiers sum K in the same
grouping (chunks of 4 K-steps, pairs of chunks: batch invariance, mxfp4_moe/geometry.py); "moe.prefill" from
PREFILL_FROM tokens (super-tiles of 64 rows, weights staged through LDS, the same per-row K grouping:
mxfp4_moe/prefill.py; the threshold is where the cost model projects it faster, README), and "moe.prefill128"
from PREFILL128_FROM (super-tiles of 128 rows).

routed(x, router_weight, router_bias, w13, ..., shard) -> bf16 [M, 2880]: the same from the hidden states and
the router's weight bf16 [128, 2880] and bias bf16 [128]: below ROUTED_PREFILL_FROM tokens 3 launches (the
router with the quantization and the sort, gate-up, down with the combine: mxfp4_moe/fused.py), from it 4
(the same first launch also writing the super-tile table, then the prefill tier's: the thresholds: README);
also torch.ops.amd_kernels.mxfp4_h2880_i384_e128_top4_routed.
"""

from amd_kernels.moe import mxfp4_moe_entries, route

H, I, E, TOP_K, ACTIVATION, TP = 2880, 2880, 128, 4, "gptoss", 8
PREFILL_FROM = 32
PREFILL128_FROM = 4096  # the tier of 128-row super-tiles (README: where it projects faster)
ROUTED_PREFILL_FROM = 512  # the routed entry's own threshold (its fused launches below it)
SMALL_M_WAVES = 8
_built = mxfp4_moe_entries.build(__name__, hidden=H, intermediate=I, experts=E, top_k=TOP_K,
                                 activation=ACTIVATION, tp_size=TP, prefill_from=PREFILL_FROM,
                                 prefill128_from=PREFILL128_FROM,
                                 routed_prefill_from=ROUTED_PREFILL_FROM,
                                 route=route.variants(H, E, TOP_K)["route.all"], small_m_waves=SMALL_M_WAVES)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
PIPELINE = _built.PIPELINE  # the launch geometry: variants, limits, weight shapes
moe = _built.moe
prepare_weights = _built.prepare_weights  # checkpoint -> prepared weights, once at load time
prepare_inputs = _built.prepare_inputs  # the harness's hook: reference inputs -> entry inputs
routed = _built.routed  # from the hidden states and the router's weights (3 launches at decode)
prepare_routed_inputs = _built.prepare_routed_inputs
emulator_workgroups = _built.emulator_workgroups  # kernel.toml workgroups = "tokens"
