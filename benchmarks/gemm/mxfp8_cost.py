"""Minimum cost of y[M, N] = MXFP8 x[M, K] @ MXFP8 w[N, K]^T + bias (bf16 out), shared by the gemm benches.

min bytes: read x, x_scales, w, w_scales, bias once and write y once. min MFMA: 16x16x128 steps of the
padded problem, ceil(M/16) * N/16 * ceil(K/128). FLOPs: 2 M N K.
"""

from benchmarks.runner import Cost


def gemm_cost(m: int, n: int, k: int) -> Cost:
    min_bytes = m * k + m * (k // 32) + n * k + n * (k // 32) + 2 * n + 2 * m * n
    return Cost(min_bytes, 2 * m * n * k, -(-m // 16) * (n // 16) * -(-k // 128))


def quant_cost(m: int, k: int) -> Cost:
    return Cost(2 * m * k + m * k + m * (k // 32), 0, 0)
