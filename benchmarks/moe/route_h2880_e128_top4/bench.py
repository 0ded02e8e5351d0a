"""moe/route_h2880_e128_top4: router logits (bf16 x @ W^T + b), softmax over the top 4 of 128 experts.
Run: python3 -m benchmarks.runner moe/route_h2880_e128_top4

Minimum: read x [M, 2880] and the router weight [128, 2880] and bias (bf16) once, write the top-4 weights
(fp32) and ids (int32); FLOPs 2 M 128 2880 at the bf16 dense peak (2.5 PFLOP/s)."""

from benchmarks.runner import Cost

PACKAGE = "moe/route_h2880_e128_top4"
OP = "moe_route_softmax_topk"
DIMS = {"experts": 128, "hidden": 2880, "top_k": 4}
TOKENS = (1, 8, 64, 256, 2048)


def cost(m: int, dims: dict = DIMS):
    h, e, k = dims["hidden"], dims["experts"], dims["top_k"]
    writes = m * k * 8
    return Cost(2 * m * h + 2 * e * h + 2 * e + writes, 2 * m * e * h, 0, writes, flops_per_s=2.5e15)
