"""gemm/mxfp8_n2880_k4096: MXFP8 GEMM, N = 2880, K = 4096. Run: python3 -m benchmarks.runner gemm/mxfp8_n2880_k4096"""

from benchmarks.gemm.mxfp8_cost import gemm_cost

PACKAGE = "gemm/mxfp8_n2880_k4096"
OP = "mxfp8_gemm"
DIMS = {"n": 2880, "k": 4096}
TOKENS = (1, 8, 64, 256, 2048)


def cost(m: int):
    return gemm_cost(m, 2880, 4096)
