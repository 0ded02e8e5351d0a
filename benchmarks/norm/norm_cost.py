"""Minimum cost of the RMSNorm ops of a hidden size h (shared by the norm benches and the all-reduce's).

Bytes: read x (bf16) and the weight once, read the residual when there is one; write the output once (bf16,
or MXFP8: one byte per element plus one E8M0 scale per 32) and the new residual (bf16) when there is one.
No MFMA; the FLOPs (a few per element) never bound it.
"""

from benchmarks.runner import Cost

OPS = ("rmsnorm", "fused_add_rmsnorm", "rmsnorm_mxfp8", "fused_add_rmsnorm_mxfp8")


def norm_cost(m: int, h: int, op: str) -> Cost:
    if op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    fused, mx = op.startswith("fused_add"), op.endswith("mxfp8")
    reads = 2 * m * h * (2 if fused else 1) + 2 * h
    writes = (m * h + m * (h // 32) if mx else 2 * m * h) + (2 * m * h if fused else 0)
    return Cost(reads + writes, 4 * m * h, 0, writes)
