"""Router of gpt-oss-120b (hidden 2880, 128 experts, top-4): see kernels/moe/routing.py for the design.

Launcher: route(x bf16 [M, 2880], router_weight bf16 [128, 2880], router_bias bf16 [128],
topk_weights fp32 [M, 4] (out), topk_ids int32 [M, 4] (out), M, stream).
"""

from amd_kernels.moe import routing

H, E, TOP_K = 2880, 128, 4
route, _example_args = routing.build(H, E, TOP_K, f"moe_route_h{H}_e{E}_top{TOP_K}")
VARIANTS = {"route.all": (route, _example_args)}
