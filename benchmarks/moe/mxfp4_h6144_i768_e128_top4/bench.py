"""moe/mxfp4_h6144_i768_e128_top4: SwiGLU MoE, hidden 6144, intermediate 768. Run: python3 -m benchmarks.runner moe/mxfp4_h6144_i768_e128_top4"""

from benchmarks.moe.moe_cost import moe_cost

PACKAGE = "moe/mxfp4_h6144_i768_e128_top4"
OP = "moe_mxfp4_swiglu"
DIMS = {"hidden": 6144, "intermediate": 768, "experts": 128, "top_k": 4}
TOKENS = (1, 8, 64, 256)


def cost(m: int):
    return moe_cost(m, 6144, 768, 128, 4, biases=False)

# The nearest published MI355X point (issue 15): AITER a4w4, 129 experts, top-5 (not this shape), for --plot.
ANCHORS = [{"tokens": t, "us": us, "label": f"AITER a4w4 e129 top-5 (nearest shape) {us} us"}
           for t, us in ((1, 24.0), (1024, 201.0), (8192, 728.0))]
