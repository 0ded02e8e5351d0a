"""moe/mxfp4_h2880_i384_e128_top4: gpt-oss-120b MoE at TP8, rank 0 (384 columns and the w2 bias). Run: python3 -m benchmarks.runner moe/mxfp4_h2880_i384_e128_top4"""

from benchmarks.moe.moe_cost import moe_cost, routed_moe_cost

PACKAGE = "moe/mxfp4_h2880_i384_e128_top4"
OP = "moe_mxfp4_gptoss"
OPS = ("moe_mxfp4_gptoss", "moe_routed_mxfp4_gptoss")  # routed: the entry with its router (route + MoE launches)
DIMS = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4, "tp_size": 8, "tp_rank": 0}
TOKENS = (1, 8, 64, 256)


def cost(m: int, op: str = OP):
    if op == "moe_routed_mxfp4_gptoss":
        return routed_moe_cost(m, 2880, 2880, 128, 4, tp_size=8, tp_rank=0)
    return moe_cost(m, 2880, 2880, 128, 4, tp_size=8, tp_rank=0, biases=True)
