"""Minimum cost of one MXFP4 MoE block at m tokens, shared by the moe benches.

min bytes: read x (bf16), topk_weights and topk_ids once, write out (bf16) once, and read once the weights
of every expert the routing selects - MXFP4 codes and E8M0 scales of the rank's real (unpadded) rows and
columns (a TP8 rank's whole 32-column blocks, vLLM's cut), bf16 biases where the model has them.
Intermediate tensors (quantized x, sorted pairs, gate-up output, per-slot rows) are not in the minimum: a
fully fused kernel would not write them. min_write_bytes: out; the rest is the reads' minimum.
boundary_bytes: the two intermediates the staged MoE (issue: stage 1, stage 2, a fixed-order reduce; no
atomics) must pass between launches, at their smallest: per (token, slot) pair the MXFP8 gate-up output
(I codes + ceil(I / 32) scales) and the bf16 row of the weighted down output the reduce sums (2 h).
min MFMA: 16x16x128 steps with every expert's pairs in 16-row tiles: sum over used experts of
ceil(n_e / 16) * (2 I / 16 * ceil(h / 128) + h / 16 * ceil(I / 128)), I the rank's columns.
FLOPs: 2 m k (2 I h + h I).
The routing is the reference builder's (references/moe.py, seed 0, as the runner builds the inputs).
"""

import torch

from benchmarks.runner import Cost
from references.moe import build_route_inputs, build_routing, moe_route_softmax_topk, shard_columns


def routing(m: int, hidden: int, experts: int, top_k: int, seed: int = 0) -> torch.Tensor:
    """topk_ids exactly as references.moe.build_moe_inputs draws them for (m, seed)."""
    gen = torch.Generator().manual_seed(seed)
    torch.randn(m, hidden, generator=gen)  # x comes first from the same generator
    return build_routing(m, experts, top_k, gen)[1]


def routed_ids(m: int, hidden: int, experts: int, top_k: int, seed: int = 0) -> torch.Tensor:
    """topk_ids as the router's reference picks them on references.moe.build_routed_moe_inputs(m, seed)."""
    inputs = build_route_inputs(m, {"hidden": hidden, "experts": experts, "top_k": top_k}, seed)
    return moe_route_softmax_topk(inputs["x"], inputs["router_weight"], inputs["router_bias"], top_k)[1]


def routed_moe_cost(m: int, hidden: int, inter: int, experts: int, top_k: int, *, tp_size: int = 1,
                    tp_rank: int = 0) -> Cost:
    """The MoE block with its router (the routed entry): moe_cost on the router's picks, plus the router's
    weight and bias (bf16) read once and its FLOPs; topk_weights / topk_ids become a stage boundary."""
    c = moe_cost(m, hidden, inter, experts, top_k, tp_size=tp_size, tp_rank=tp_rank, biases=True,
                 ids=routed_ids(m, hidden, experts, top_k))
    topk = m * top_k * 8
    return Cost(c.min_bytes - topk + 2 * experts * hidden + 2 * experts, c.flops + 2 * m * experts * hidden,
                c.min_mfma, min_write_bytes=c.min_write_bytes, boundary_bytes=c.boundary_bytes + topk)


def expert_bytes(hidden: int, per: int, *, biases: bool, tp_rank: int = 0) -> tuple[int, int]:
    """(w13, w2) bytes of one expert's weights at `per` intermediate columns: MXFP4 codes, E8M0 scales and, where
    the model has them, bf16 biases (the w2 bias on rank 0 only)."""
    w13 = 2 * per * (hidden // 2 + hidden // 32) + (2 * per * 2 if biases else 0)
    w2 = hidden * (per // 2 + per // 32) + (hidden * 2 if biases and tp_rank == 0 else 0)
    return w13, w2


def moe_cost(m: int, hidden: int, inter: int, experts: int, top_k: int, *, tp_size: int = 1, tp_rank: int = 0,
             biases: bool, ids: torch.Tensor | None = None) -> Cost:
    """`ids`: the routing (default: the reference builder's, as `routing` draws it)."""
    start, end = shard_columns(inter, tp_size, tp_rank)
    per = end - start
    ids = routing(m, hidden, experts, top_k) if ids is None else ids
    counts = torch.bincount(ids.reshape(-1).long(), minlength=experts)
    used = int((counts > 0).sum())
    w13, w2 = expert_bytes(hidden, per, biases=biases, tp_rank=tp_rank)
    min_bytes = m * hidden * 2 * 2 + m * top_k * 8 + used * (w13 + w2)
    tiles = int(((counts + 15) // 16).sum())
    min_mfma = tiles * (2 * per // 16 * -(-hidden // 128) + hidden // 16 * -(-per // 128))
    flops = 2 * m * top_k * (2 * per * hidden + hidden * per)
    boundary = m * top_k * (per + -(-per // 32) + 2 * hidden)
    return Cost(min_bytes, flops, min_mfma, min_write_bytes=m * hidden * 2, boundary_bytes=boundary)
