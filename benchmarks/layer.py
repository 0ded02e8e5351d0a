"""A decoder layer's counters against the floor, per step and in total (the regime's [[layer]] chain).

Each step of the chain is one op at the layer's token count, so its counters are the op's alone (a kernel's
counters do not depend on where its inputs came from): each step runs as `benchmarks.runner` runs a package
(measure_emulator: its reference builder's inputs, workgroup sampling above SAMPLE_ABOVE_TOKENS for the
"rows" / "tiles" packages, the "tokens" packages whole), with the package's bench cost (min bytes, FLOPs ->
floor) where it has one, and the cost function below for the norms, which have no bench. The MoE step is
the MoE package's routed entry (its router inside), costed by the package's bench for that op
(benchmarks/moe/moe_cost.py routed_moe_cost: the router's bytes and FLOPs added to the MoE's).
The attention runs a full layer (sliding_window 0) with every sequence at CONTEXT keys. Projected us come
from benchmarks/costmodel.py: a model, never a measurement.

  ./env.sh python3 -m harness run regimes/gpt_oss_120b.toml --layer [--tp 1] [--tokens 1,8,64,256]
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

from benchmarks.runner import Cost

CONTEXT = 1000  # keys per sequence in the layer table's attention step


def norm_cost(m: int, hidden: int, op: str) -> Cost:
    """Each input and output once: x (and the residual in, the new residual out) bf16, the weight bf16; out bf16,
    or MXFP8 (1 byte + a scale per 32)."""
    fused = op.startswith("fused_add")
    out = m * hidden * (1 + 1 / 32) if op.endswith("mxfp8") else m * hidden * 2
    rows = m * hidden * 2 * (3 if fused else 1)
    return Cost(min_bytes=int(rows + out + hidden * 2), flops=m * hidden * 4,
                min_write_bytes=int(out + (m * hidden * 2 if fused else 0)))


def step_bench(kernel: str, op: str, dims: dict):
    """A runner bench for one step: the package's benchmarks/<kernel>/bench.py when it benches this op (one of
    its OPS: the runner passes the op to its cost; DIMS overridden by `dims` for the attention's contexts),
    else one built on the cost functions above."""
    try:
        bench = importlib.import_module("benchmarks." + kernel.replace("/", ".") + ".bench")
    except ModuleNotFoundError:
        bench = None
    if bench is not None and op in (bench.OP, *getattr(bench, "OPS", ())):
        if op == "paged_attention":
            d = {**bench.DIMS, "sliding_window": 0, "context_lengths": [CONTEXT]}
            return SimpleNamespace(PACKAGE=kernel, OP=op, DIMS=d, cost=lambda m, d=d: bench.cost(m, d))
        return bench
    if op in ("rmsnorm", "fused_add_rmsnorm", "rmsnorm_mxfp8", "fused_add_rmsnorm_mxfp8"):
        return SimpleNamespace(PACKAGE=kernel, OP=op, DIMS=dims, cost=lambda m: norm_cost(m, dims["hidden"], op))
    raise LookupError(f"{kernel}: no bench for op {op} and no cost function here")


def measure_step(kernel: str, op: str, dims: dict, tokens: int) -> dict:
    """benchmarks.runner.measure_emulator of the step at `tokens` (its counters, projected us, floor); a
    multi-rank step (the TP8 all-reduces) runs on 8 emulated ranks (runner.measure_ranks: per-rank counters,
    the least-waiting rank's projection)."""
    from benchmarks import runner

    bench = step_bench(kernel, op, dims)
    return runner.measure_emulator(bench, tokens, op=op)
