"""gemm/mxfp8_n640_k2880: MXFP8 GEMM, N = 640, K = 2880. Run: python3 -m benchmarks.runner gemm/mxfp8_n640_k2880"""

from benchmarks.gemm.mxfp8_cost import gemm_cost

PACKAGE = "gemm/mxfp8_n640_k2880"
OP = "mxfp8_gemm"
DIMS = {"n": 640, "k": 2880}
TOKENS = (1, 8, 64, 256, 2048)


def cost(m: int):
    return gemm_cost(m, 640, 2880)
