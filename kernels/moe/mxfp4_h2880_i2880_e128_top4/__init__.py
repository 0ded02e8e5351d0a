"""MXFP4 MoE of gpt-oss-120b, TP1: hidden 2880, 128 experts, top-4.

Entry: moe(x, topk_weights, topk_ids, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias, shard) -> bf16 [M, 2880],
the weights from `prepare_weights(...)` (amd_kernels.moe.prepare, run once at load time);
also torch.ops.amd_kernels.mxfp4_h2880_i2880_e128_top4_moe.
routed(x, router_weight, router_bias, w13, ..., shard) -> bf16 [M, 2880]: the same from the hidden states and
the router's weight bf16 [128, 2880] and bias bf16 [128] (the router's launch, route_h2880_e128_top4's, then
the MoE's); also torch.ops.amd_kernels.mxfp4_h2880_i2880_e128_top4_routed.
"""

from functools import partial

from amd_kernels.moe import moe_entries, prepare
from amd_kernels.moe.route_h2880_e128_top4 import kernel as router
from amd_kernels.moe.mxfp4_h2880_i2880_e128_top4 import kernel

prepare_weights = partial(prepare.prepare_weights, activation=kernel.ACTIVATION, hidden=kernel.H,
                          intermediate=kernel.I, experts=kernel.E, tp_size=kernel.TP)
_built = moe_entries.build(__name__, "mxfp4_h2880_i2880_e128_top4", hidden=kernel.H, experts=kernel.E,
                           top_k=kernel.TOP_K, pipeline=kernel.PIPELINE, prepare_weights=prepare_weights,
                           tp_size=kernel.TP, route=router.VARIANTS["route.all"])
VARIANTS = _built.VARIANTS
moe = _built.moe
prepare_inputs = _built.prepare_inputs
routed = _built.routed
prepare_routed_inputs = _built.prepare_routed_inputs
emulator_workgroups = _built.emulator_workgroups  # kernel.toml workgroups = "tokens"
