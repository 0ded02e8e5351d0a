"""comm/allreduce_ranks8_h2880: the TP8 all-reduce (alone, and fused with add + RMSNorm, bf16 or MXFP8 out).
Run: python3 -m benchmarks.runner comm/allreduce_ranks8_h2880 --tokens 1,4,8   (8 emulated rank processes)

Per rank, the minimum of the tier the package picks for M (kernels/comm/allreduce_ranks8_h2880/README.md),
without the flag round trips (no published per-hop latency):
- one-stage: link 7 x M x 5760 B (every peer's partial) over the 7 xGMI links in parallel; HBM the 8
  partials read once plus the norm's bytes (benchmarks/norm/norm_cost.py);
- two-stage: link 2 x 7/8 x M x 5760 B (the reduce-scatter of row groups, then the all-gather of the summed
  rows); HBM the rank's M/8 rows of all 8 partials, its summed rows written, all M summed rows read back,
  plus the norm's bytes.
"""

from amd_kernels.comm.allreduce_ranks8_h2880 import tier
from benchmarks.norm.norm_cost import norm_cost
from benchmarks.runner import Cost

PACKAGE = "comm/allreduce_ranks8_h2880"
OP = "allreduce_fused_add_rmsnorm"
OPS = ("allreduce", "allreduce_fused_add_rmsnorm", "allreduce_fused_add_rmsnorm_mxfp8")
DIMS = {"hidden": 2880, "eps": 1e-5}
TOKENS = (1, 4, 8)
RANKS = 8


def cost(m: int, dims: dict = DIMS, op: str = OP):
    h = dims["hidden"]
    if tier(m) == "one_stage":
        partials = RANKS * 2 * m * h
        link = (RANKS - 1) * 2 * m * h
    else:  # a rank's row group of every partial, its sums written, every summed row read back
        partials = 2 * m * h + 2 * 2 * m * h // RANKS + 2 * m * h
        link = 2 * (RANKS - 1) * 2 * m * h // RANKS
    if op == "allreduce":
        return Cost(partials + 2 * m * h, 0, 0, 2 * m * h, link_bytes=link)
    norm = norm_cost(m, h, op[len("allreduce_"):])
    # the norm's x is the sum, never read again from memory: its bytes minus one read of x
    return Cost(partials + norm.min_bytes - 2 * m * h, norm.flops, 0, norm.min_write_bytes, link_bytes=link)


# Published MI355X TP8 figures (issue 14; at other hidden sizes, named in each label), for the runner's --plot.
ANCHORS = ([{"op": "allreduce", "tokens": 4, "us": 6.4, "label": "vLLM custom AR dim 3072: 6.4 us"}]
           + [{"op": "allreduce_fused_add_rmsnorm", "tokens": t, "us": us,
               "label": f"AITER fused AR+RMSNorm n 7168, 1-stage {us} us"} for t, us in ((4, 6.98), (32, 14.62), (64, 25.27))]
           + [{"op": "allreduce_fused_add_rmsnorm", "tokens": t, "us": us,
               "label": f"AITER fused AR+RMSNorm n 7168, 2-stage {us} us"} for t, us in ((8, 10.23), (32, 11.37), (64, 13.46))])
