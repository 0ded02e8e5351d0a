"""MoE router for hidden 2880, 128 experts, top-4 (gpt-oss-120b): linear + bias, top-4, softmax over the 4.

Entry: route(x, router_weight, router_bias, top_k) -> (topk_weights fp32 [M, 4], topk_ids int32 [M, 4]);
also torch.ops.amd_kernels.route_h2880_e128_top4_route. Kernel: kernels/moe/route.py.
"""

from amd_kernels.moe import route_entries

H, E, TOP_K = 2880, 128, 4
_built = route_entries.build(__name__, H, E, TOP_K)
VARIANTS = _built.VARIANTS  # the warm-up workers import it from here
route = _built.route
