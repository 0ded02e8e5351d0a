"""quant/mxfp8_k512: bf16 -> MXFP8 rows of K = 512. Run: python3 -m benchmarks.runner quant/mxfp8_k512"""

from benchmarks.gemm.mxfp8_cost import quant_cost

PACKAGE = "quant/mxfp8_k512"
OP = "mxfp8_quant"
DIMS = {"k": 512}
TOKENS = (1, 8, 64, 256, 2048)


def cost(m: int):
    return quant_cost(m, 512)
