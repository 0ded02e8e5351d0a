"""MoE router for hidden 2880, 128 experts, top-4 (gpt-oss-120b): linear + bias, top-4, softmax over the 4.

Entry: route(x, router_weight, router_bias, top_k) -> (topk_weights fp32 [M, 4], topk_ids int32 [M, 4]);
also torch.ops.amd_kernels.route_h2880_e128_top4_route.
"""

from amd_kernels.moe import route_entries
from amd_kernels.moe.route_h2880_e128_top4 import kernel

_built = route_entries.build(__name__, "route_h2880_e128_top4", kernel.H, kernel.E, kernel.TOP_K, kernel.VARIANTS)
VARIANTS = _built.VARIANTS
route = _built.route
