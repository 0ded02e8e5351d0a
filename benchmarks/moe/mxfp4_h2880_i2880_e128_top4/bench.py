"""moe/mxfp4_h2880_i2880_e128_top4: gpt-oss-120b MoE at TP1. Run: python3 -m benchmarks.runner moe/mxfp4_h2880_i2880_e128_top4"""

from benchmarks.moe.moe_cost import moe_cost

PACKAGE = "moe/mxfp4_h2880_i2880_e128_top4"
OP = "moe_mxfp4_gptoss"
DIMS = {"hidden": 2880, "intermediate": 2880, "experts": 128, "top_k": 4, "tp_size": 1, "tp_rank": 0}
TOKENS = (1, 8, 64, 256)


def cost(m: int):
    return moe_cost(m, 2880, 2880, 128, 4, biases=True)

# Published MI355X figures at this shape (issue 15): AITER's tuned FlyDSL a8w4 MoE for gpt-oss TP1
# (aiter/configs gptoss_fp8fp4_tuned_fmoe.csv, us1 + us2), for the runner's --plot.
ANCHORS = [{"tokens": t, "us": us, "label": f"AITER FlyDSL a8w4 gpt-oss TP1 {us} us"}
           for t, us in ((1, 25.5), (1024, 361.0), (8192, 1128.0))]
