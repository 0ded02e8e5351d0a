"""norm/rmsnorm_h2880: the four RMSNorm entries at hidden 2880. Run: python3 -m benchmarks.runner norm/rmsnorm_h2880 [--op rmsnorm]"""

from benchmarks.norm.norm_cost import OPS, norm_cost

PACKAGE = "norm/rmsnorm_h2880"
OP = "rmsnorm"
DIMS = {"hidden": 2880, "eps": 1e-5}
TOKENS = (1, 8, 64, 256, 2048)


def cost(m: int, dims: dict = DIMS, op: str = OP):
    return norm_cost(m, 2880, op)
